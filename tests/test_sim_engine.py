"""The sim stack through the local engine, on the session's shared deployment: a second
`up` is a no-op (zero provider calls that change a node), `preview --refresh
--expect-no-changes` is clean, a config change to TP=1 on one node answers the same tokens
as TP=2, and `destroy` leaves no container of the stack on any node. Runs after the
cluster and drift suites (it ends the shared deployment)."""

from __future__ import annotations

import time

import pytest

from sim import stack
from tests.conftest import SIM_PROMPT, SimDeployment, sim_complete, sim_log

pytestmark = pytest.mark.sim


def test_a_second_up_is_a_no_op(sim_deployment: SimDeployment) -> None:
    again = stack.engine("up", log=sim_log)
    sim_log(f"phase: engine no-op up {again.seconds:.1f}s")
    assert not again.error, again.error
    assert {s.op for s in again.steps} == {"same"}
    assert again.provider_writes == 0
    assert again.outputs["endpoint"] == sim_deployment.outputs["endpoint"]
    assert len(again.refresh_steps) >= 10  # Pulumi.yaml refresh: always read them all
    assert {s.op for s in again.refresh_steps} == {"same"}


def test_preview_refresh_finds_nothing_to_change(sim_deployment: SimDeployment) -> None:
    check = stack.engine("preview", refresh=True, log=sim_log)
    assert not check.error, check.error
    assert not check.changed, [(s.name, s.op, s.keys) for s in check.steps if s.op != "same"]
    assert check.provider_writes == 0


def test_tp2_answer_equals_tp1_and_destroy_leaves_nodes_clean(
    sim_deployment: SimDeployment,
) -> None:
    cfg, access = sim_deployment.cfg, sim_deployment.access
    tp2_answer = sim_complete(sim_deployment.outputs["endpoint"])
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
