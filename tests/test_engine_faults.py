"""The fault-injection suite: `python -m localengine` killed with -9 at random moments of `up`
and `destroy`, each kill followed by the recovery docs/local-engine.md documents, then the
state must equal the node: nothing duplicated, nothing orphaned, nothing pending.

SIMULATION: the node is a folder on this machine. The program's remote Commands reach it
through a stub `ssh` first on the engine's PATH, which runs the remote command under bash
in that folder (as sshd runs it in the login shell) and never opens a connection; its
dynamic resources write files in the same folder. Every create leaves one uniquely named
object (`objs/<resource>-<random>`), so a create run twice shows as two objects.

The figures (kills, kills that landed mid-run, orphans, duplicates, processes left behind)
are printed at the end; FAULT_SEED=N replays a schedule, FAULT_CYCLES=N runs more.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import project_yaml

# An end-to-end suite of the engine (real processes killed at random for about two
# minutes): in every full run and CI, not in the fast suite (`-m "not sim and not engine"`).
pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parent.parent
STACK = "test"
CHAINS, PER_CHAIN = 2, 3  # two chains of (command -> dynamic) pairs run side by side

PROGRAM = textwrap.dedent(
    """
    import pathlib
    import time
    import uuid

    import pulumi
    import pulumi_command as command
    from pulumi.dynamic import (
        CreateResult, DiffResult, ReadResult, Resource, ResourceProvider, UpdateResult,
    )

    cfg = pulumi.Config()
    node, rev = cfg.require("node"), cfg.require("rev")
    pause = float(cfg.require("pause"))
    chains, per_chain = int(cfg.require("chains")), int(cfg.require("per_chain"))


    def step(props):  # a line per node action: how far a run has come
        with open(pathlib.Path(props["node"]) / "progress", "a") as f:
            f.write("dyn\\n")


    class Obj(ResourceProvider):
        def create(self, props):
            step(props)
            time.sleep(float(props["pause"]))
            name = f"{props['name']}-{uuid.uuid4().hex[:8]}"
            (pathlib.Path(props["node"]) / "objs" / name).write_text(props["rev"])
            return CreateResult(name, dict(props))

        def read(self, id_, props):
            found = (pathlib.Path(props["node"]) / "objs" / id_).exists()
            return ReadResult(id_ if found else "", props)

        def diff(self, id_, olds, news):
            return DiffResult(changes=olds.get("rev") != news.get("rev"))

        def update(self, id_, olds, news):
            step(news)
            time.sleep(float(news["pause"]))
            (pathlib.Path(news["node"]) / "objs" / id_).write_text(news["rev"])
            return UpdateResult(dict(news))

        def delete(self, id_, props):
            step(props)
            time.sleep(float(props["pause"]) / 2)
            (pathlib.Path(props["node"]) / "objs" / id_).unlink()


    class DynObj(Resource):
        def __init__(self, name, opts=None):
            props = {"name": name, "node": node, "rev": rev, "pause": pause}
            super().__init__(Obj(), name, props, opts)


    conn = command.remote.ConnectionArgs(
        host="127.0.0.1", user="fault", private_key=pulumi.Output.secret("not-a-key\\n")
    )
    for chain in range(chains):
        prev = None
        for i in range(per_chain):
            name = f"c{chain}x{i}"
            cmd = command.remote.Command(
                f"cmd-{name}",
                connection=conn,
                create=(
                    f"sleep {pause}; f=objs/cmd-{name}-$(od -An -N4 -tx4 /dev/urandom | "
                    f"tr -d ' '); echo {rev} > $f; echo $f"
                ),
                update=f"sleep {pause}; for f in objs/cmd-{name}-*; do echo {rev} > $f; done",
                delete=f"sleep {pause / 2}; rm objs/cmd-{name}-*",
                opts=pulumi.ResourceOptions(depends_on=[prev] if prev else None),
            )
            prev = DynObj(f"dyn-{name}", pulumi.ResourceOptions(depends_on=[cmd]))
    """
)

# A node reached over "ssh" (SIMULATION): OpenSSH's words up to `--`, the host, then the
# remote command, run under bash in the node's folder. Each call notes its pid while it
# runs, so the recovery can wait for the calls a killed engine left running, and adds a
# line to the node's progress (as the dynamic resources do), where the kills are timed.
SSH_STUB = textwrap.dedent(
    """\
    #!/bin/bash
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do shift; done
    shift 2
    echo cmd >> "$NODE/progress"
    mkdir -p "$NODE/.inflight" && echo $$ > "$NODE/.inflight/$$"
    cd "$NODE" || exit 255
    bash -c "$*"
    rc=$?
    rm -f "$NODE/.inflight/$$"
    exit $rc
    """
)


@dataclass
class Figures:
    kills: int = 0
    mid_run: int = 0
    pending_seen: dict[str, int] = field(default_factory=dict)
    imported: int = 0
    cleared: int = 0
    state_deletes: int = 0
    orphans: int = 0
    duplicates: int = 0
    left_behind: set[int] = field(default_factory=set)


class Rig:
    """The project, its node and the engine's command line."""

    def __init__(self, tmp: Path, pause: float):
        self.dir, self.node, bin_dir = tmp / "project", tmp / "node", tmp / "bin"
        for d in (self.dir, self.node / "objs", bin_dir):
            d.mkdir(parents=True)
        ssh = bin_dir / "ssh"
        ssh.write_text(SSH_STUB.replace("$NODE", str(self.node)))
        ssh.chmod(0o755)
        (self.dir / "Pulumi.yaml").write_text(project_yaml("faults"))
        (self.dir / "__main__.py").write_text(PROGRAM)
        self.pause = pause
        self.start_s = 1.0  # how long a run takes to its first node action (measured)
        self.env = {
            k: v for k, v in os.environ.items() if "BACKEND_URL" not in k and "PASSPHRASE" not in k
        }
        self.env["PATH"] = f"{bin_dir}:{self.env['PATH']}"
        self.rev = 0

    def configure(self, rev: int) -> None:
        self.rev = rev
        (self.dir / f"Pulumi.{STACK}.yaml").write_text(
            "config:\n"
            f"  faults:node: {self.node}\n  faults:rev: '{rev}'\n  faults:pause: '{self.pause}'\n"
            f"  faults:chains: '{CHAINS}'\n  faults:per_chain: '{PER_CHAIN}'\n"
        )

    def argv(self, *words: str) -> list[str]:
        return [sys.executable, "-m", "localengine", *words, "--stack", STACK,
                "--cwd", str(self.dir)]  # fmt: skip

    def engine(self, *words: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*words), cwd=ROOT, env=self.env, capture_output=True, text=True,
            timeout=300, check=False,
        )  # fmt: skip

    def start(self, *words: str) -> subprocess.Popen[str]:
        """As a terminal starts it: the leader of a group of its own."""
        return subprocess.Popen(
            self.argv(*words), cwd=ROOT, env=self.env, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip

    def state(self) -> dict[str, Any]:
        path = self.dir / ".localengine" / "stacks" / "faults" / f"{STACK}.json"
        if not path.exists():
            return {"resources": [], "pending_operations": []}
        latest = json.loads(path.read_text())["checkpoint"]["latest"]
        return {
            "resources": [r for r in latest.get("resources") or [] if r["custom"]
                          and not r["type"].startswith("pulumi:providers:")],
            "pending_operations": latest.get("pending_operations") or [],
        }  # fmt: skip

    def progress(self) -> int:
        path = self.node / "progress"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def objects(self) -> list[str]:
        return sorted(p.name for p in (self.node / "objs").iterdir())

    def settle(self) -> list[int]:
        """Wait until the node calls a killed engine left running have ended; then count
        the processes of the run still alive (the program and provider hosts run in the
        project's folder): the kernel ends them with the engine."""
        deadline = time.monotonic() + 60
        inflight = self.node / ".inflight"
        while time.monotonic() < deadline:
            alive = [p for p in inflight.glob("*") if Path(f"/proc/{p.name}").exists()]
            if not alive:
                break
            time.sleep(0.1)
        time.sleep(0.3)
        return _processes_in(self.dir)


def _processes_in(folder: Path) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if Path(os.readlink(proc / "cwd")) == folder:
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def _resource_names() -> list[str]:
    pairs = [f"c{c}x{i}" for c in range(CHAINS) for i in range(PER_CHAIN)]
    return [f"{kind}-{n}" for n in pairs for kind in ("cmd", "dyn")]


def recover(rig: Rig, figures: Figures) -> None:
    """docs/local-engine.md "After a run was killed", step by step as a user runs it."""
    figures.left_behind |= set(rig.settle())
    for op in rig.state()["pending_operations"]:
        figures.pending_seen[op["type"]] = figures.pending_seen.get(op["type"], 0) + 1
    refreshed = rig.engine("refresh")
    assert refreshed.returncode == 0, refreshed.stdout + refreshed.stderr
    creates = [op for op in rig.state()["pending_operations"] if op["type"] == "creating"]
    assert all(op["type"] == "creating" for op in rig.state()["pending_operations"])
    if creates:
        assert "--import-pending-creates" in refreshed.stdout, refreshed.stdout
        words = []
        for op in creates:
            name = op["resource"]["urn"].rsplit("::", 1)[-1]
            found = [o for o in rig.objects() if o.rsplit("-", 1)[0] == name]
            assert len(found) <= 1, f"{name}: {found}"
            if found:  # it was created: record it with the ID it has on the node
                words += ["--import-pending-creates", op["resource"]["urn"], found[0]]
                figures.imported += 1
            else:
                figures.cleared += 1
        settled = rig.engine("refresh", *words, "--clear-pending-creates")
        assert settled.returncode == 0, settled.stdout + settled.stderr
    assert rig.state()["pending_operations"] == []


def converge(rig: Rig, operation: str, figures: Figures) -> None:
    """`up` or `destroy` again; a delete whose object is already gone is forgotten with
    `state delete URN` (the user looked on the node), then the operation runs again."""
    for _ in range(len(_resource_names()) + 1):
        done = rig.engine(operation)
        if done.returncode == 0:
            return
        gone = re.search(r"state delete --stack \S+ '([^']+)'", done.stderr)
        assert gone, done.stdout + done.stderr
        name = gone.group(1).rsplit("::", 1)[-1]
        assert not [o for o in rig.objects() if o.rsplit("-", 1)[0] == name], done.stderr
        forgot = rig.engine("state", "delete", gone.group(1))
        assert forgot.returncode == 0, forgot.stderr
        figures.state_deletes += 1
    pytest.fail(f"{operation} did not converge")


def check(rig: Rig, figures: Figures, deployed: bool) -> None:
    """The state equals the node: one object per resource, the dynamic IDs are the
    objects, every object carries the current revision; or, destroyed, nothing at all."""
    objects, state = rig.objects(), rig.state()
    assert state["pending_operations"] == []
    by_name: dict[str, list[str]] = {}
    for o in objects:
        by_name.setdefault(o.rsplit("-", 1)[0], []).append(o)
    wanted = set(_resource_names()) if deployed else set()
    figures.orphans += sum(len(v) for k, v in by_name.items() if k not in wanted)
    figures.duplicates += sum(len(v) - 1 for v in by_name.values() if len(v) > 1)
    assert set(by_name) == wanted, (objects, wanted)
    assert all(len(v) == 1 for v in by_name.values()), objects
    recorded = {r["urn"].rsplit("::", 1)[-1]: r for r in state["resources"]}
    assert set(recorded) == wanted
    for name, rec in recorded.items():
        if name.startswith("dyn-"):
            assert [rec["id"]] == by_name[name]
        content = (rig.node / "objs" / by_name[name][0]).read_text().strip()
        assert content == str(rig.rev), (name, content, rig.rev)


def _killed(rig: Rig, operation: str, rng: random.Random, figures: Figures) -> None:
    """Kill the run at a random point of its progress: after a random number of its node
    actions (one per resource), a random part of one action's pause later; or, before its
    first action, at a random moment of its start. Timed by progress, not by the clock,
    so a loaded machine (the suite runs beside others) moves no kill past the run's end."""
    before = rig.progress()
    proc = rig.start(operation)
    actions = rng.randrange(len(_resource_names()))
    while proc.poll() is None and rig.progress() - before < actions:
        time.sleep(0.02)
    time.sleep(rng.uniform(0.05, rig.pause) if actions else rng.uniform(0.2, rig.start_s))
    figures.kills += 1
    if proc.poll() is None:
        figures.mid_run += 1
        os.kill(proc.pid, signal.SIGKILL)  # the engine alone, as `kill -9 PID`
    proc.wait(timeout=60)


def test_kills_at_random_moments_of_up_and_destroy_each_recover_to_the_nodes_truth(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seed = int(os.environ.get("FAULT_SEED") or random.randrange(10**6))
    cycles = int(os.environ.get("FAULT_CYCLES") or 7)
    rng = random.Random(seed)
    rig, figures = Rig(tmp_path, pause=0.3), Figures()
    rig.configure(1)
    started = time.monotonic()
    first = rig.start("up")  # an undisturbed run: how long its start lasts
    while first.poll() is None and not rig.progress():
        time.sleep(0.02)
    rig.start_s = time.monotonic() - started
    assert first.wait(timeout=300) == 0
    check(rig, figures, deployed=True)
    for cycle in range(cycles):
        rig.configure(2 * cycle + 2)  # every resource is updated
        _killed(rig, "up", rng, figures)
        recover(rig, figures)
        converge(rig, "up", figures)
        check(rig, figures, deployed=True)
        _killed(rig, "destroy", rng, figures)
        recover(rig, figures)
        converge(rig, "destroy", figures)
        check(rig, figures, deployed=False)
        rig.configure(2 * cycle + 3)  # created from nothing
        _killed(rig, "up", rng, figures)
        recover(rig, figures)
        converge(rig, "up", figures)
        check(rig, figures, deployed=True)
    quiet = rig.engine("preview", "--expect-no-changes")
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    line = (
        f"fault suite (seed {seed}): {figures.kills} kills ({figures.mid_run} mid-run) survived; "
        f"pending found {figures.pending_seen}; recovered by {figures.imported} imports, "
        f"{figures.cleared} clears, {figures.state_deletes} state deletes; orphans "
        f"{figures.orphans}, duplicates {figures.duplicates}, processes left behind "
        f"{len(figures.left_behind)}; {time.monotonic() - started:.0f}s"
    )
    with capsys.disabled():
        print(f"\n{line}")
    assert figures.orphans == 0 and figures.duplicates == 0
    assert figures.kills >= 20 and figures.mid_run >= 15, line
    assert not figures.left_behind, line
