"""Engine-level end-to-end on the `sim` stack through Pulumi's Automation API:
up, outputs, preview with expect_no_changes, refresh, destroy.

Runs wherever the Pulumi CLI and the docker and command provider plugins exist; skips
with one line otherwise (they are binaries Pulumi downloads and no registry carries).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.engine


def engine_missing() -> str | None:
    """Why the engine test cannot run here, or None when it can."""
    if shutil.which("pulumi") is None:
        return "Pulumi CLI not installed (no package registry carries it); engine e2e skipped"
    listed = subprocess.run(
        ["pulumi", "plugin", "ls", "--json"], capture_output=True, text=True, check=False
    )
    try:
        names = {p["name"] for p in json.loads(listed.stdout or "[]")}
    except json.JSONDecodeError:
        names = set()
    missing = {"docker", "command"} - names
    if missing:
        return f"Pulumi provider plugins missing ({', '.join(sorted(missing))}); engine e2e skipped"
    return None


@pytest.fixture
def sim_stack(tmp_path: Path) -> Iterator[object]:
    reason = engine_missing()
    if reason:
        pytest.skip(reason)
    from pulumi import automation as auto

    from sim.stack import ensure_up

    ensure_up()
    env = {"PULUMI_CONFIG_PASSPHRASE": "sim-e2e", "PULUMI_BACKEND_URL": f"file://{tmp_path}"}
    stack = auto.create_or_select_stack(
        stack_name="sim",
        work_dir=str(ROOT),
        opts=auto.LocalWorkspaceOptions(env_vars=env),
    )
    try:
        yield stack
    finally:
        stack.destroy(on_output=print)
        stack.workspace.remove_stack("sim")


def test_up_converges_and_a_second_preview_has_no_changes(sim_stack: object) -> None:
    from pulumi import automation as auto

    assert isinstance(sim_stack, auto.Stack)
    up = sim_stack.up(on_output=print)
    outputs = {k: v.value for k, v in up.outputs.items()}
    assert outputs["endpoint"] == "http://172.28.0.11:8000/v1"
    assert outputs["health"]["ready"] is True
    assert outputs["health"]["ray"]["nodes"] == 2
    # Converged: nothing left to do, live state included.
    sim_stack.preview(expect_no_changes=True, refresh=True, on_output=print)
    sim_stack.refresh(on_output=print)
    sim_stack.preview(expect_no_changes=True, on_output=print)
