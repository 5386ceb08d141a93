"""`destroy` leaves no container of the stack on any node and no state. Runs last among
the sim's suites (tests/conftest.py SIM_ORDER): the native story before it has already
destroyed the shared deployment (its own destroy, checked there), so this one finds
nothing to do and checks the nodes and the state; run alone, it destroys the session's
deployment. (TP=1 answering as TP=2 is shown by the set of models' suite: its second
model is the same checkpoint at TP=1 on one node.)"""

from __future__ import annotations

import pytest

from sim import stack
from tests.conftest import SimDeployment, sim_log

pytestmark = pytest.mark.sim


def test_destroy_leaves_no_container_on_any_node_and_no_state(
    sim_deployment: SimDeployment,
) -> None:
    cfg, access = sim_deployment.cfg, sim_deployment.access
    gone = stack.engine("destroy", log=sim_log)
    assert not gone.error, gone.error
    for node in cfg.nodes:
        assert stack.our_containers(cfg, access, node.name) == []
    assert not stack.has_state()
    again = stack.engine("destroy", log=sim_log)
    assert not again.error and not again.changed, again.error
