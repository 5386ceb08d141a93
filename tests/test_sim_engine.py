"""The sim stack through the local engine (localengine/): a first `up` from no state on the
SIMULATED cluster, a second `up` that is a no-op (zero provider calls that change a node),
`preview --refresh --expect-no-changes` clean on the converged stack, then `destroy`
leaving no container of the stack on any node."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from localengine.operations import run
from sim import stack
from sim.settings import REPO_ROOT

pytestmark = pytest.mark.sim


def _log(message: str) -> None:
    print(message, flush=True)


def test_up_noop_preview_destroy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stack.ensure_up()
    cfg, access = stack.load()
    stack.destroy_by_label(cfg, access)  # other suites' leftovers
    monkeypatch.setenv("PULUMI_BACKEND_URL", f"file://{tmp_path}")

    started = time.monotonic()
    first = run("up", "sim", REPO_ROOT, log=_log)
    _log(f"phase: engine up from no state {time.monotonic() - started:.1f}s")
    assert not first.error, first.error
    assert first.counts["create"] >= 20 and first.counts["update"] == 0
    assert first.outputs["health"]["ready"] is True

    again = run("up", "sim", REPO_ROOT, log=_log)
    _log(f"phase: engine no-op up {again.seconds:.1f}s")
    assert not again.error, again.error
    assert {s.op for s in again.steps} == {"same"}
    assert again.provider_writes == 0
    assert again.outputs["endpoint"] == first.outputs["endpoint"]

    check = run("preview", "sim", REPO_ROOT, refresh=True, log=_log)
    assert not check.error, check.error
    assert not check.changed, [(s.name, s.op, s.keys) for s in check.steps if s.op != "same"]
    assert {s.op for s in check.refresh_steps} == {"same"}
    assert len(check.refresh_steps) >= 8  # every docker resource and command was read

    gone = run("destroy", "sim", REPO_ROOT, log=_log)
    assert not gone.error, gone.error
    for node in cfg.nodes:
        assert stack.our_containers(cfg, access, node.name) == []
