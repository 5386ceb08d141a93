"""Golden copies of what a deployed stack holds of each node command, and what a change to
them costs (tests/test_golden.py).

For the `sim` and `spark` stacks, the program is run through the local engine against
in-memory nodes (tests/test_plan_engine.py's); from the state it leaves, every NodeStep's
create and read texts, what they do (`defines`, `reads`: sparkvllm/scripts), every
pulumi-command Command's texts, and every container's spec digest are written to
tests/golden/<stack>.txt. A stack "deployed by the golden code" is that state with the
golden values put back; a preview of it with today's program says what an upgrade re-runs
and replaces, by the providers' own diffs.

    .venv/bin/python -m tests.golden --accept     # write tests/golden/ from this checkout
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden"
# The sim and spark stacks as their files have them, and the spark stack widened to what
# those leave out: four nodes (the image relay), vLLM's own launcher (the rank guards),
# the page cache dropped before the server starts.
STACKS = ("sim", "spark", "spark4-native")
STEP = "pulumi-python:dynamic:Resource"
COMMAND = "command:remote:Command"
CONTAINER = "docker:index/container:Container"
# What each kind holds of its commands: a text, or (for a probe on stdin) its digest.
TEXTS = {STEP: ("create", "read", "delete"), COMMAND: ("create", "update", "delete")}
DIGESTS = {STEP: ("stdin", "read_stdin"), COMMAND: ("stdin",)}
IDENTITIES = ("defines", "reads")
# SIMULATION of the sim nodes' host keys (generated for tests; no machine has them), so
# that the sim stack renders without a simulation up.
SIM_HOST_KEYS = {
    "spark-1": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGkOjN3s22+QhA4wz72cIgOQjtSDf/gxKmuP7FkpQ1zc",
    "spark-2": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILRN1qemAe0sgfsZ0ahtxAdCCDJ/GfIYJkzKf+7Skuvo",
}

Golden = dict[str, dict[str, str]]  # resource name -> field -> value


def stack_config(stack: str, key_file: Path) -> dict[str, Any]:
    """The stack's config as its file has it, the key a test key, no file outside."""
    from tests.conftest import four_node_raw, stack_file

    if stack == "spark4-native":
        raw = four_node_raw(stack_file("spark"))
        raw["parallelism"] = {**raw["parallelism"], "launcher": "native", "tensor": 4}
        raw["drop_page_cache"] = True
    else:
        raw = copy.deepcopy(stack_file(stack))
    raw.pop("ssh_private_key", None)
    raw["ssh_private_key_file"] = str(key_file)
    # An explicit launcher (the one `auto` picks for an image with Ray): a preview of a
    # new image is then exact (auto's choice waits for the image's facts).
    raw["parallelism"] = {"launcher": "ray", **raw.get("parallelism", {})}
    if stack == "sim":
        for node in raw["nodes"]:
            node["ssh"].pop("host_key_file", None)
            node["ssh"]["host_key"] = SIM_HOST_KEYS[node["name"]]
    return raw


def _digest(value: Any) -> str:
    return hashlib.sha256(str(value).encode()).hexdigest()[:16] if value else ""


def _plain(value: Any) -> Any:
    from localengine import wire

    return wire.plain(value)


def of_state(state: dict[str, Any]) -> Golden:
    """What the golden copies hold of a state."""
    from sparkvllm.specs.containers import SPEC_LABEL

    out: Golden = {}
    for res in state["checkpoint"]["latest"].get("resources") or []:
        kind, name, inputs = res["type"], res["urn"].rsplit("::", 1)[-1], res.get("inputs", {})
        fields: dict[str, str] = {}
        if kind in TEXTS:
            fields["kind"] = "NodeStep" if kind == STEP else "Command"
            for f in TEXTS[kind]:
                if value := _plain(inputs.get(f)):
                    fields[f] = str(value)
            for f in DIGESTS[kind]:
                if value := _plain(inputs.get(f)):
                    fields[f"{f} sha256"] = _digest(value)
            for f in IDENTITIES:
                if value := inputs.get(f):
                    fields[f] = str(value)
        elif kind == CONTAINER:
            labels = {x["label"]: x["value"] for x in _plain(inputs.get("labels")) or []}
            fields = {"kind": "container", "spec": str(labels.get(SPEC_LABEL, ""))}
        if fields:
            out[name] = fields
    return out


def write(golden: Golden, stack: str) -> str:
    """The golden file's text: one block a field, `=== <resource> <field>` then its value."""
    lines = [
        f"# Golden copies of the {stack} stack's node commands, as a deployed stack holds them.",
        "# tests/test_golden.py compares them with this checkout's; accept a change with",
        "#   .venv/bin/python -m tests.golden --accept",
    ]
    for name in sorted(golden):
        for field, value in golden[name].items():
            lines += [f"=== {name} {field}", value]
    return "\n".join(lines) + "\n"


def read(text: str) -> Golden:
    golden: Golden = {}
    name = field = ""
    body: list[str] = []

    def close() -> None:
        if name:
            golden.setdefault(name, {})[field] = "\n".join(body)

    for line in text.splitlines():
        if line.startswith("=== "):
            close()
            name, field = line[4:].split(" ", 1)
            body = []
        elif name:
            body.append(line)
    close()
    return golden


class Deployed:
    """One stack deployed through the local engine on in-memory nodes, in `work`."""

    def __init__(self, stack: str, work: Path, setenv: Callable[[str, str], None]):
        from tests.conftest import TEST_PRIVATE_KEY
        from tests.test_plan_engine import Stack

        class _Env:
            def setenv(self, name: str, value: str) -> None:
                setenv(name, value)

        key = work / "id_test"
        key.write_text(TEST_PRIVATE_KEY)
        self.stack, self.raw = stack, stack_config(stack, key)
        self.engine = Stack(work / "backend", _Env())  # type: ignore[arg-type]
        self.engine.run("up", self.raw, stack=stack)
        self.path = next((work / "backend").rglob(f"{stack}.json"))

    def state(self) -> dict[str, Any]:
        return dict(json.loads(self.path.read_text()))

    def golden(self) -> Golden:
        return of_state(self.state())

    def put_back(self, golden: Golden) -> None:
        """The state as the code that wrote `golden` left it: each resource's fields that
        differ put back (a probe's text, of which only the digest is kept, as a stand-in
        text of the same digest's difference)."""
        from sparkvllm.specs.containers import SPEC_LABEL

        state = self.state()
        now = of_state(state)
        for res in state["checkpoint"]["latest"]["resources"]:
            name = res["urn"].rsplit("::", 1)[-1]
            old, new = golden.get(name), now.get(name)
            if old is None or new is None or old == new:
                continue
            for part in ("inputs", "outputs"):
                values = res.get(part)
                if not values:
                    continue
                if res["type"] == CONTAINER:
                    for label in values.get("labels") or []:
                        if label["label"] == SPEC_LABEL:
                            label["value"] = old["spec"]
                    continue
                for f in (*TEXTS[res["type"]], *IDENTITIES):
                    if old.get(f) != new.get(f):
                        values[f] = old.get(f)
                for f in DIGESTS[res["type"]]:
                    if old.get(f"{f} sha256") != new.get(f"{f} sha256"):
                        values[f] = f"(the text of sha256 {old.get(f'{f} sha256')})"
        self.path.write_text(json.dumps(state))

    def plan(self) -> dict[str, str]:
        """What a preview with this checkout's program would do: resource -> operation."""
        result = self.engine.run("preview", self.raw, stack=self.stack)
        return {s.name: s.op for s in result.steps if s.op != "same"}


def differences(old: Golden, new: Golden) -> dict[str, list[str]]:
    """resource -> the fields that differ (a resource only in one: `added`/`removed`)."""
    out: dict[str, list[str]] = {}
    for name in sorted(set(old) | set(new)):
        if name not in old or name not in new:
            out[name] = ["added" if name in new else "removed"]
        elif old[name] != new[name]:
            keys = sorted(set(old[name]) | set(new[name]))
            out[name] = [k for k in keys if old[name].get(k) != new[name].get(k)]
    return out


def explain(stack: str, diffs: dict[str, list[str]], plan: dict[str, str], kinds: Golden) -> str:
    """What a deployed stack would do with this checkout, one line a resource."""
    lines = [f"the {stack} stack's node commands differ from tests/golden/{stack}.txt:"]
    for name in sorted(set(diffs) | set(plan)):
        # A resource the golden copy lacks is new to a deployed stack: created there.
        op = "create" if diffs.get(name) == ["added"] else plan.get(name, "same")
        kind = kinds.get(name, {}).get("kind", "")
        does = {
            "replace": "REPLACED" if kind == "container" else "RE-RUNS",
            "update": "RE-RUNS (pulumi-command runs its create again on an update)"
            if kind == "Command"
            else "updated (records the change, runs nothing on the node)",
            "create": "created",
            "delete": "deleted",
            "same": "nothing runs (wording, comments or layout)",
        }.get(op, op)
        changed = ", ".join(diffs.get(name, ["follows what it is built on"]))
        lines.append(f"  {name}{f' ({kind})' if kind else ''}: {changed} -> {does}")
    lines.append(
        "if that is what the change should cost: .venv/bin/python -m tests.golden --accept"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.golden", description=__doc__)
    parser.add_argument("--accept", action="store_true", help="write tests/golden/")
    args = parser.parse_args(argv)
    if not args.accept:
        parser.error("--accept writes the golden copies; the check is tests/test_golden.py")
    GOLDEN.mkdir(exist_ok=True)
    for stack in STACKS:
        with tempfile.TemporaryDirectory() as work:
            os.environ["SPARKVLLM_STATE_DIR"] = str(Path(work) / "workstation")
            deployed = Deployed(stack, Path(work), os.environ.__setitem__)
            (GOLDEN / f"{stack}.txt").write_text(write(deployed.golden(), stack))
        print(f"wrote tests/golden/{stack}.txt")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
