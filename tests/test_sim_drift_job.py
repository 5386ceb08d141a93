"""The drift job (.github/workflows/drift.yml) as a fresh CI runner runs it, on the
SIMULATED cluster: its steps, taken from the workflow by id and run under bash as they
are written, in a HOME that never ran the program, with the local engine standing in for
`pulumi` (a shim on PATH; the CLI cannot be installed here, so the install and login
steps are the only ones not run).

Converged: the check exits 0. A fault: 7. The opted-in heal (one `up`), then the check
again: 0. And before the workstation step has written the key files, the check fails in
one line naming the missing file and the command that writes it.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sim import stack
from sim.settings import REPO_ROOT
from sparkvllm.config import PROJECT
from tests.conftest import SimDeployment, sim_log

pytestmark = pytest.mark.sim

WORKFLOW = REPO_ROOT / ".github" / "workflows" / "drift.yml"
WORKER = "spark-2"
BLOB = (
    "$(readlink -f /root/.cache/huggingface/hub/models--sparkvllm--tiny-qwen3/"
    "snapshots/*/model.safetensors)"
)

# `pulumi` on the runner, stood in for by the local engine: the commands drift.yml runs.
SHIM = """
import json, sys
from pathlib import Path

import yaml

from localengine.__main__ import main as engine

args = sys.argv[1:]
stack = args[args.index("--stack") + 1] if "--stack" in args else ""
if args[:1] == ["login"]:
    sys.exit(0)  # the local engine keeps its states apart (.localengine/ in the checkout)
if args[:1] == ["preview"]:
    flags = [a for a in args[1:] if a in ("--refresh", "--expect-no-changes")]
    sys.exit(engine(["preview", *flags, "--stack", stack]))
if args[:1] == ["up"] and "--yes" in args:
    sys.exit(engine(["up", "--stack", stack]))
if args[:1] == ["config"] and "--json" in args and "--show-secrets" in args:
    # `pulumi config --json --show-secrets`: each key's value as text (objects as JSON).
    data = yaml.safe_load(Path(f"Pulumi.{stack}.yaml").read_text())["config"]
    print(json.dumps({
        k: {"value": v if isinstance(v, str) else json.dumps(v), "secret": False}
        for k, v in data.items()
    }))
    sys.exit(0)
print(f"pulumi shim: not a command drift.yml runs: {args}", file=sys.stderr)
sys.exit(2)
"""


def workflow_steps() -> dict[str, str]:
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    return {s["id"]: s["run"] for s in jobs["drift"]["steps"] if "id" in s and "run" in s}


@pytest.fixture
def runner(tmp_path: Path) -> dict[str, str]:
    """A fresh runner's environment: an empty HOME, `pulumi` on PATH."""
    home, bin_ = tmp_path / "home", tmp_path / "bin"
    home.mkdir()
    bin_.mkdir()
    shim = bin_ / "pulumi"
    # The engine is this checkout's (not an installed package): on the shim's sys.path.
    shim.write_text(
        f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(REPO_ROOT)!r})\n{SHIM}"
    )
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "SPARKVLLM_STATE_DIR"}
    env.update(
        HOME=str(home), PATH=f"{bin_}:{env['PATH']}", STACK=stack.STACK, HEAL="true",
        PULUMI_BACKEND_URL=f"file://{home}/cli-backend",  # the CLI's: unused by the stand-in
    )  # fmt: skip
    return env


def run_step(step: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    script = workflow_steps()[step]
    done = subprocess.run(
        ["bash", "-e", "-c", script], cwd=REPO_ROOT, env=env,
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    sim_log(f"drift.yml step {step}: exit {done.returncode}; {done.stdout.strip()[-300:]}")
    return done


def test_the_drift_job_on_a_fresh_runner_finds_a_fault_and_heals_it(
    sim_deployment: SimDeployment, runner: dict[str, str]
) -> None:
    d = sim_deployment
    steps = workflow_steps()
    assert {"install-pulumi", "login", "prepare", "check", "heal", "recheck"} <= set(steps)
    assert run_step("login", runner).returncode == 0

    missing = run_step("check", runner)
    assert missing.returncode not in (0, 7), "a check without the key files cannot pass"
    said = missing.stdout + missing.stderr
    # The workstation's files are keyed by project and stack (sparkvllm/workstation.py).
    key = Path(runner["HOME"]) / ".cache" / "spark-vllm" / PROJECT / stack.STACK / "id"
    assert f"the SSH key file {key}" in said and "is missing on this workstation" in said
    assert f"run `python -m sparkvllm.workstation --stack {stack.STACK}` first" in said

    for _ in range(2):  # idempotent
        assert run_step("prepare", runner).returncode == 0
    folder = key.parent
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert {p.name for p in folder.iterdir()} >= {"id", "known_hosts"}
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in folder.iterdir())

    assert run_step("check", runner).returncode == 0, "converged: exit 0"
    stack.run_on(d.cfg, d.access, WORKER, f"truncate -s 1000 {BLOB}", timeout=60)
    assert run_step("check", runner).returncode == 7, "a fault: exit 7"
    healed = run_step("heal", runner)
    assert healed.returncode == 0, healed.stderr[-2000:]
    assert run_step("recheck", runner).returncode == 0, "healed: exit 0"
    outputs = json.loads(
        subprocess.run(
            [sys.executable, "-m", "localengine", "output", "--stack", stack.STACK, "--json"],
            cwd=REPO_ROOT, env=runner, capture_output=True, text=True, check=True,
        ).stdout
    )  # fmt: skip
    assert outputs["health"]["ready"] is True
