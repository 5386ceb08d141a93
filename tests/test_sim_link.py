"""The cluster link measured, on the SIMULATED cluster: the worker's egress shaped with `tc`
to a tenth of what it carried when deployed (the sim's "link" is a Docker bridge; `tc tbf`
on the worker's eth0 makes one path slow, as a port stuck at a low speed would), then

(a) the probe drift check (`sparkvllm.drift`, read-only) names the worker and the path,
    with the rate now and when deployed;
(b) the preflight's measurement, run again (`up --replace` of its step), warns with the
    rate, the rate expected (the other direction of the same link) and the likely cause;
(c) with the shaping removed, a measurement again finds nothing to say.
"""

from __future__ import annotations

import pytest

from sim import stack
from sparkvllm import drift
from tests.conftest import SimDeployment, sim_log

pytestmark = pytest.mark.sim

HEAD, WORKER = "spark-1", "spark-2"
STEP = f"link-rate-{WORKER}"


def on(d: SimDeployment, node: str, command: str) -> str:
    return stack.run_on(d.cfg, d.access, node, command, timeout=120)


def remeasure(lines: list[str]) -> stack.operations.Result:
    """One `up` that replaces the measurement step (the CLI's `up --replace URN`)."""
    urn = next(s.urn for s in stack.engine("preview", log=sim_log).steps if s.name == STEP)

    def log(line: str) -> None:
        lines.append(line)
        sim_log(line)

    result = stack.engine("up", log=log, replace=frozenset({urn}))
    assert not result.error, result.error
    return result


def test_a_link_shaped_to_a_tenth_is_caught_and_named(sim_deployment: SimDeployment) -> None:
    d = sim_deployment
    deployed = d.outputs["links"][WORKER]
    sim_log(f"link at deploy: {deployed}")
    assert deployed["from"] == HEAD
    assert deployed["to_gbit"] > 0 and deployed["from_gbit"] > 0
    tenth_mbit = max(50, int(deployed["from_gbit"] * 100))  # Gb/s / 10, in Mbit/s
    on(d, WORKER, f"tc qdisc replace dev eth0 root tbf rate {tenth_mbit}mbit burst 1mb "
                  "latency 200ms")  # fmt: skip
    warned: list[str] = []
    try:
        found = drift.check(d.cfg, "sim", d.access, last=drift.last_outputs("sim"), links=True)
        for f in found:
            sim_log(f"drift check: {f.render()}")
        # The shaped path, named (the other direction is not shaped: on this shared CPU
        # it may read slower than at deploy too, with the model now running).
        (slower,) = [
            f for f in found
            if f.what == "link slower" and f.detail.startswith(f"link {WORKER} -> {HEAD} ")
        ]  # fmt: skip
        assert slower.node == WORKER
        assert "when deployed" in slower.detail and "likely cause" in slower.detail

        result = remeasure(warned)
        now = result.outputs["links"][WORKER]
        assert now["from_gbit"] < deployed["from_gbit"] / 5, now
    finally:
        on(d, WORKER, "tc qdisc del dev eth0 root 2>/dev/null || true")
    (warning,) = [w for w in warned if f"link {WORKER} -> {HEAD} carries" in w]
    assert "expected at least" in warning
    assert f"half the fastest path measured, {HEAD} -> {WORKER}" in warning
    assert "likely cause:" in warning and "fix:" in warning

    healed: list[str] = []
    again = remeasure(healed).outputs["links"][WORKER]
    assert again["from_gbit"] > 3 * now["from_gbit"], again  # clearly not shaped any more
    assert not [w for w in healed if "link " in w and "carries" in w], healed
    found = drift.check(d.cfg, "sim", d.access, last=drift.last_outputs("sim"), links=True)
    assert not [f for f in found if f.what.startswith("link")], found
