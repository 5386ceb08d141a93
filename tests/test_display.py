"""The local engine's live view (localengine/display.py): the steps in flight with their
elapsed time (redrawn on a terminal, a line every 10 s elsewhere) and the end of a run as
the Pulumi CLI ends it (outputs laid out with secrets masked, counts, duration)."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import time
from pathlib import Path

from localengine.display import Display, elapsed, summary_lines
from tests.conftest import project_yaml


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_steps_in_flight_longest_first_with_their_time() -> None:
    clock = Clock()
    shown = Display(io.StringIO(), tty=False, clock=clock)
    assert shown.quiet_line() is None  # nothing in flight: nothing said
    shown.begin("a", "create image-sync-spark-2")
    clock.now += 83
    shown.begin("b", "update weights-spark-2")
    clock.now += 2
    assert shown.quiet_line() == (
        "  ... in flight: create image-sync-spark-2 (1m25s), update weights-spark-2 (2s)"
    )
    shown.end("a")
    assert shown.quiet_line() == "  ... in flight: update weights-spark-2 (2s)"
    shown.end("b")
    shown.end("b")  # a step ends once; a second end is harmless
    assert shown.quiet_line() is None


def test_a_log_that_is_no_terminal_gets_a_line_every_interval() -> None:
    out = io.StringIO()
    with Display(out, tty=False, every_s=0.05) as shown:
        shown.begin("a", "create image-sync-spark-2")
        time.sleep(0.3)
        shown.log("create image-sync-spark-2 (0.3s)")
        shown.end("a")
        time.sleep(0.15)
    lines = out.getvalue().splitlines()
    waiting = [line for line in lines if line.startswith("  ... in flight: ")]
    assert len(waiting) >= 3 and "\x1b" not in out.getvalue()  # no escapes in a log
    assert lines[-1] == "create image-sync-spark-2 (0.3s)"  # nothing after the last step


def test_a_terminal_gets_the_steps_in_flight_redrawn() -> None:
    """rich's Live redraws the block twice a second from the display's clock (here one
    the test moves), whenever its thread gets the CPU."""
    out = io.StringIO()
    now = [0.0]
    with Display(out, tty=True, clock=lambda: now[0]) as shown:
        shown.begin("a", "create image-sync-spark-2")
        now[0] = 1.2
        deadline = time.monotonic() + 30
        while "(1s)" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.1)
        shown.log("create weights-spark-2 (1.2s)")
        shown.end("a")
    text = out.getvalue()
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    assert "\x1b[" in text and "... create image-sync-spark-2" in plain
    assert "create weights-spark-2 (1.2s)" in plain
    assert re.search(r"image-sync-spark-2 \(1s\)", plain)  # the time moved while in flight


def test_the_end_is_the_clis() -> None:
    outputs = {
        "endpoint": "http://10.1.230.180:8000/v1",
        "api_key": "[secret]",
        "health": {"ok": True, "ranks": [1.0, 2.0], "nodes": {"spark-1": {"mem_gib": 119.0}}},
    }
    lines = list(summary_lines("up", {"same": 29, "create": 2, "replace": 1}, 272.4, outputs))
    assert lines == [
        "Outputs:",
        "    api_key : [secret]",
        '    endpoint: "http://10.1.230.180:8000/v1"',
        "    health  : {",
        "        nodes: {",
        "            spark-1: {",
        "                mem_gib: 119",
        "            }",
        "        }",
        "        ok   : true",
        "        ranks: [1, 2]",
        "    }",
        "",
        "Resources:",
        "    + 2 created",
        "    +- 1 replaced",
        "    29 unchanged",
        "",
        "Duration: 4m32s",
    ]
    assert list(summary_lines("preview", {"update": 1}, 3, None)) == [
        "Resources:", "    ~ 1 to update", "", "Duration: 3s",
    ]  # fmt: skip
    assert list(summary_lines("up", {"same": 0}, 1, {}))[1] == "    0 unchanged"
    assert [elapsed(s) for s in (0.4, 59.9, 61, 3725)] == ["0s", "59s", "1m01s", "1h02m05s"]


def test_up_shows_each_step_once_then_the_summary(tmp_path: Path) -> None:
    """`python -m localengine up` on a project of its own, not on a terminal: each step
    as it ends, a line while the slow one runs, then Outputs (the secret masked),
    Resources and Duration; --json is the result as JSON, nothing else."""
    (tmp_path / "Pulumi.yaml").write_text(project_yaml("shown"))
    (tmp_path / "Pulumi.dev.yaml").write_text("config: {}\n")
    (tmp_path / "__main__.py").write_text(
        "import time\nimport pulumi\n"
        "from pulumi.dynamic import CreateResult, Resource, ResourceProvider\n"
        "class Slow(ResourceProvider):\n"
        "    def create(self, props):\n"
        "        time.sleep(props['s'])\n"
        "        return CreateResult(id_='x', outs=props)\n"
        "class Step(Resource):\n"
        "    def __init__(self, name, s):\n"
        "        super().__init__(Slow(), name, {'s': s})\n"
        "Step('image-sync-spark-2', 1.5)\n"
        "pulumi.export('endpoint', 'http://127.0.0.1:8000/v1')\n"
        "pulumi.export('key', pulumi.Output.secret('sk-must-not-show'))\n"
    )
    env = {"LOCALENGINE_QUIET_EVERY_S": "0.5"}
    done = subprocess.run(
        [sys.executable, "-m", "localengine", "up", "--stack", "dev"], cwd=tmp_path,
        capture_output=True, text=True, timeout=120, env={**_env(), **env},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert re.search(r"^create image-sync-spark-2 \(\d+\.\ds\)$", out, re.M), out
    assert out.count("image-sync-spark-2 (") == 1 + out.count("... in flight:"), out
    assert "  ... in flight: create image-sync-spark-2 (" in out
    assert "sk-must-not-show" not in out + done.stderr
    tail = out[out.index("\nOutputs:") :]
    assert '    endpoint: "http://127.0.0.1:8000/v1"\n    key     : [secret]\n' in tail
    assert "\nResources:\n    + 2 created\n" in tail and "\nDuration: " in tail
    assert tail.rstrip().endswith("(1 provider calls that change a node)")
    again = subprocess.run(
        [sys.executable, "-m", "localengine", "up", "--stack", "dev", "--json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=_env(),
    )  # fmt: skip
    assert again.returncode == 0 and again.stdout.lstrip().startswith("{"), again.stdout
    assert "Resources:" not in again.stdout and "in flight" not in again.stdout


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
