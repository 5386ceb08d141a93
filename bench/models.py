"""A set of models on the SIMULATED cluster (issue 42's figures): the router's cost beside
the model's own endpoint, one model's change while the other is asked, and each node's
available memory before, with and after the second model.

The set is the sim stack's model and a second on spark-2 (sim/stack.py `set_of_two`,
the same as tests/test_sim_models.py), behind the router (LiteLLM's proxy). On the sim,
the nodes are containers of one machine: /proc/meminfo in a node is this machine's, so
its MemAvailable moves with anything else the machine does (the bench runs alone), and
vLLM's CPU build takes VLLM_CPU_KVCACHE_SPACE for its KV cache whatever its
gpu_memory_utilization (the plan's figure is a GB10's rule, not this).
"""

from __future__ import annotations

import math
import threading
import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.figures import Figures, stopwatch
from bench.measure import Sim, complete
from sim import stack

ROUNDS = 5  # direct and through the router, alternating
PER_ROUND = 10  # completions each way per round
TOKENS = 32
CHANGED_FLAG = ["--max-num-seqs", "64"]  # the second model's change: one flag
# One stream's decode rate of the seed's model on two Sparks (bench served_model's smoke
# figure cites it): what a request's own time is there, beside the router's added time.
SPARK_TOK_S = 27.0


def _pct(values: list[float], p: float) -> float:
    """The p-th percentile (nearest rank) of `values`."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def router_cost(router: str, direct: str, model: str, figures: Figures) -> None:
    """The same completions to the model's own endpoint and through the router, alternating
    rounds (neither side gets a warmer machine): tokens/s over the wall time of each side's
    requests, and each request's latency."""
    took: dict[str, list[float]] = {"direct": [], "router": []}
    tokens: dict[str, int] = {"direct": 0, "router": 0}
    complete(direct, model, 1)
    complete(router, model, 1)  # both paths warm
    for _ in range(ROUNDS):
        for side, endpoint in (("direct", direct), ("router", router)):
            for _ in range(PER_ROUND):
                with stopwatch() as t:
                    tokens[side] += complete(endpoint, model, TOKENS)
                took[side].append(t[0])
    rate = {side: tokens[side] / sum(took[side]) for side in took}
    how = (f"{ROUNDS} rounds of {PER_ROUND} completions of {TOKENS} tokens, one at a time, "
           f"to model {model}, alternating direct and router")  # fmt: skip
    figures.add("direct_tok_s", rate["direct"], "tokens/s", f"its own endpoint: {how}")
    figures.add("router_tok_s", rate["router"], "tokens/s", f"through the router: {how}")
    figures.add("router_vs_direct", rate["router"] / rate["direct"], "ratio",
                "router_tok_s / direct_tok_s, side by side in one run", ">= 0.98")  # fmt: skip
    added_p50 = _pct(took["router"], 50) - _pct(took["direct"], 50)
    spark_s = TOKENS / SPARK_TOK_S
    figures.add(
        "router_vs_direct_spark_estimate", spark_s / (spark_s + added_p50), "ratio",
        f"an ESTIMATE, not a measurement: a {TOKENS}-token request at the seed's "
        f"{SPARK_TOK_S:g} tokens/s ({spark_s:.2f} s) over it plus the router's p50 added "
        "time measured here (on the sim the tiny model answers in tens of ms, so the "
        "router's fixed cost weighs far more than beside a Spark's model)",
    )  # fmt: skip
    for p in (50, 99):
        added = _pct(took["router"], p) - _pct(took["direct"], p)
        figures.add(
            f"router_added_latency_p{p}_ms", added * 1000, "ms",
            f"the p{p} of a {TOKENS}-token completion's time through the router minus the "
            f"p{p} direct ({ROUNDS * PER_ROUND} each; the p99 of 50 is the slowest)",
        )  # fmt: skip


@dataclass
class Asked:
    """Completions to one model through the router, one after another, for as long as it
    runs: when each answered or failed."""

    endpoint: str
    model: str
    every_s: float = 0.2
    answered: list[float] = field(default_factory=list)
    failed: list[tuple[float, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                complete(self.endpoint, self.model, 2, timeout=30)
                self.answered.append(time.monotonic())
            except (urllib.error.URLError, OSError, ValueError) as e:
                self.failed.append((time.monotonic(), f"{type(e).__name__}: {e}"))
            self._stop.wait(self.every_s)

    def __enter__(self) -> Asked:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def without_service_s(self) -> float:
        """From the last answer before the first failure to the first answer after the
        last failure (0 when nothing failed)."""
        if not self.failed:
            return 0.0
        first, last = self.failed[0][0], self.failed[-1][0]
        before = max((t for t in self.answered if t < first), default=first)
        after = min((t for t in self.answered if t > last), default=last)
        return after - before


def mem_available_gib(sim: Sim) -> dict[str, float]:
    read = "awk '/^MemAvailable:/ {print $2}' /proc/meminfo"
    return {n.name: int(sim.on(n.name, read).strip()) / 2**20 for n in sim.cfg.nodes}


def _step_s(result: Any, suffixes: tuple[str, ...]) -> float:
    return sum(s.seconds for s in result.steps if s.name.endswith(suffixes) and s.op != "same")


def measure(sim: Sim, figures: Figures) -> None:
    """The set deployed by one `up` from the converged single model, its figures, then the
    single model again (the second model and the router removed by one `up`)."""
    say: Callable[[str], None] = sim.say
    converged = stack.engine("up", log=lambda _m: None)
    assert not converged.error, converged.error
    first = str(converged.outputs["served_model"])
    time.sleep(10)  # the page cache and the server settle
    before = mem_available_gib(sim)
    added = stack.engine("up", stack.set_of_two(), log=say)
    assert not added.error, added.error
    models = added.outputs["models"]
    second = models[stack.SECOND]
    router = str(added.outputs["endpoint"])
    served_second = str(stack.set_of_two()["models"][1]["served_name"])
    time.sleep(10)
    with_set = mem_available_gib(sim)
    plan = added.outputs["memory"]
    for node in sim.cfg.nodes:
        name = node.name
        figures.add(
            f"memory_taken_gib_{name}", before[name] - with_set[name], "GiB",
            f"MemAvailable on {name} before the second model and the router minus with them "
            "ready (the sim's nodes share this machine's memory: a machine-wide figure)",
        )  # fmt: skip
        planned = plan.get(name, {}).get("models", {}).get(stack.SECOND, {}).get("budget_gib")
        if planned is not None:
            figures.add(
                f"memory_planned_gib_{name}", float(planned), "GiB",
                f"the memory output's budget for {stack.SECOND} on {name} (its "
                "gpu_memory_utilization x the node's memory: a GB10's rule; vLLM's CPU build "
                "takes VLLM_CPU_KVCACHE_SPACE instead)",
            )  # fmt: skip

    say("the router against the model's own endpoint")
    router_cost(router, str(second["endpoint"]), served_second, figures)

    say(f"{stack.SECOND}'s flags changed ({' '.join(CHANGED_FLAG)}) while both are asked")
    changed = stack.set_of_two()
    changed["models"][1]["vllm"]["extra_args"] = [
        *changed["models"][1]["vllm"].get("extra_args", []),
        *CHANGED_FLAG,
    ]
    with Asked(router, first) as other, Asked(router, served_second) as itself:
        change = stack.engine("up", changed, log=say)
        assert not change.error, change.error
        ended = time.monotonic()
        while not itself.answered or itself.answered[-1] < ended:  # once more, after the up
            assert time.monotonic() < ended + 60, "the changed model did not answer again"
            time.sleep(0.5)
    replaced = sorted(s.name for s in change.steps if s.op in ("replace", "delete"))
    say(f"the change replaced {replaced}")
    figures.add("change_other_failed", len(other.failed), "requests",
                f"requests to {first} that failed while {stack.SECOND} changed "
                f"({len(other.answered)} answered)", "0")  # fmt: skip
    start = _step_s(change, (f"{stack.SECOND}-model-server-container",
                             f"{stack.SECOND}-model-server-health"))  # fmt: skip
    gap = itself.without_service_s()
    figures.add("change_start_s", start, "s",
                f"{stack.SECOND}'s new server: its container's step and its health step, "
                "from the up's own step times")  # fmt: skip
    figures.add("change_without_service_s", gap, "s",
                f"{stack.SECOND} asked through the router every 0.2 s: from its last answer "
                "before the first failure to its first answer after the last")  # fmt: skip
    figures.add("change_gap_vs_start", gap / start if start else 0.0, "ratio",
                "change_without_service_s / change_start_s", "<= 1.1")  # fmt: skip

    say("the second model and the router removed")
    removed = stack.engine("up", log=say)
    assert not removed.error, removed.error
    time.sleep(10)
    after = mem_available_gib(sim)
    figures.add(
        "memory_returned_ratio", min(after[n] / before[n] for n in before), "ratio",
        "each node's MemAvailable once the second model and the router are removed, over "
        "before they came (the lowest node)", ">= 0.98",
    )  # fmt: skip
