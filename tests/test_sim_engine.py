"""A config change to TP=1 on one node answers the same tokens as the shared TP=2
deployment did, and `destroy` leaves no container of the stack on any node and no state.
Runs last among the sim's suites (tests/conftest.py SIM_ORDER): the native story before it
has already destroyed the shared deployment (its own destroy, checked there); run alone,
this suite deploys TP=2 (the session's fixture) and destroys it first."""

from __future__ import annotations

import time

import pytest

from sim import stack
from tests.conftest import SIM_PROMPT, SimDeployment, sim_complete, sim_log

pytestmark = pytest.mark.sim


def test_tp2_answer_equals_tp1_and_destroy_leaves_nodes_clean(
    sim_deployment: SimDeployment,
) -> None:
    cfg, access = sim_deployment.cfg, sim_deployment.access
    tp2_answer = sim_deployment.answer  # taken when it was deployed
    gone = stack.engine("destroy", log=sim_log)
    assert not gone.error, gone.error
    for node in cfg.nodes:
        assert stack.our_containers(cfg, access, node.name) == []
    assert not stack.has_state()

    raw = stack.stack_raw()
    raw["nodes"] = raw["nodes"][:1]
    raw["parallelism"] = {"tensor": 1, "pipeline": 1}
    started = time.monotonic()
    tp1 = stack.engine("up", raw, log=sim_log)
    sim_log(f"phase: deploy TP=1 (engine up) {time.monotonic() - started:.1f}s")
    try:
        assert not tp1.error, tp1.error
        tp1_answer = sim_complete(tp1.outputs["endpoint"])
    finally:
        assert not stack.engine("destroy", raw, log=sim_log).error
    sim_log(f"TP=1 vs TP=2 for {SIM_PROMPT!r}: {tp1_answer!r} vs {tp2_answer!r}")
    assert tp2_answer == tp1_answer
    assert tp2_answer.strip() != ""
    cfg, access = stack.load()  # the workstation's files for both nodes again
    for node in cfg.nodes:
        assert stack.our_containers(cfg, access, node.name) == []
    assert not stack.has_state()
