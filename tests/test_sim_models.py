"""A set of models on the SIMULATED cluster (docs/models.md): a second model and the router
added to the live stack (TP=1 on spark-2 alone, native, its own ports) by one `up` while
the first keeps answering (0 failed requests, none of its parts replaced); through the one
endpoint, with the `openai` client, each model by its served name, chat and completions,
streamed and not; the drift check clean; the second model's server hung, named by the drift
check, planned and healed (with its flags changed) by one `up` that touches only its parts;
the first model's Ray worker and its weights on the shared node gone, named, and healed by
one `up` that touches none of the second's parts while the second answers throughout; then
the second model and the router removed by one `up` that touches only their parts, the
first answering throughout.

SIMULATION: the second model is a copy of the tiny model's files in a repo of its own in
the nodes' caches (sparkvllm/tiny-qwen3-two, sim/settings.py): a fault of its weights is its
alone, and its answers (TP=1) can be compared with the first's (TP=2)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from typing import Any

import pytest

from sim import stack
from sim.settings import SECOND_MODEL_ID
from sparkvllm import drift
from sparkvllm.config import load_stack_config
from sparkvllm.specs.containers import container_name
from tests.conftest import SIM_PROMPT, SimDeployment, sim_complete, sim_log

pytestmark = pytest.mark.sim

SECOND = stack.SECOND
SECOND_ID = SECOND_MODEL_ID  # its own repo in the nodes' caches (a copy of the tiny model)
RAY_WORKER = container_name("sim", "ray-worker", "spark-2")  # the first model's, on Ray
# The first model's weights file on spark-2 (the second's are in a repo of their own).
BLOB = (
    "$(readlink -f /root/.cache/huggingface/hub/models--sparkvllm--tiny-qwen3/"
    "snapshots/*/model.safetensors)"
)


def complete(endpoint: str, model: str) -> str:
    body = {"model": model, "prompt": "The DGX Spark", "max_tokens": 4, "temperature": 0}
    req = urllib.request.Request(
        f"{endpoint}/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return str(json.loads(resp.read())["choices"][0]["text"])


def max_model_len(endpoint: str, model: str) -> int:
    """The context length the server says it serves `model` with (`/v1/models`)."""
    with urllib.request.urlopen(f"{endpoint}/models", timeout=60) as resp:
        listed = json.loads(resp.read())["data"]
    return int(next(m["max_model_len"] for m in listed if m["id"] == model))


class Requests:
    """Completions sent to one model, one after another, for as long as it runs."""

    def __init__(self, endpoint: str, model: str):
        self.endpoint, self.model = endpoint, model
        self.answered, self.failed = 0, []  # type: tuple[int, list[str]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                complete(self.endpoint, self.model)
                self.answered += 1
            except Exception as e:
                self.failed.append(f"{type(e).__name__}: {e}")
            self._stop.wait(0.5)

    def __enter__(self) -> Requests:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=90)


def through_the_router(endpoint: str, served: list[str]) -> None:
    """The `openai` client at the one endpoint: both models listed, each answering chat and
    completions, streamed and not, under its own name."""
    from openai import OpenAI

    client = OpenAI(base_url=endpoint, api_key="none", timeout=120, max_retries=0)
    assert sorted(m.id for m in client.models.list()) == sorted(served)
    for model in served:
        chat = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hello"}], max_tokens=4
        )
        assert chat.model.endswith(model) and chat.choices[0].message.content is not None
        text = client.completions.create(model=model, prompt="The DGX Spark", max_tokens=4)
        assert text.choices[0].text
        chunks = list(
            client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                stream=True,
            )
        )  # fmt: skip
        assert any(c.choices and c.choices[0].delta.content for c in chunks)
        streamed = list(
            client.completions.create(
                model=model, prompt="The DGX Spark", max_tokens=4, stream=True
            )
        )
        assert "".join(c.choices[0].text or "" for c in streamed if c.choices)
        sim_log(f"router: {model}: chat, completions, both streamed: answered")


def changed(result: Any) -> dict[str, str]:
    return {s.name: s.op for s in result.steps if s.op != "same"}


def test_a_second_model_comes_and_goes_while_the_first_keeps_serving(
    sim_deployment: SimDeployment,
) -> None:
    d = sim_deployment
    # The stack as its own config says (an earlier suite may have left it mid-way): what
    # the set's `up` then changes is the set's alone.
    converged = stack.engine("up", log=sim_log)
    assert not converged.error, converged.error
    endpoint = converged.outputs["endpoint"]
    first_model = converged.outputs["served_model"]
    with Requests(endpoint, first_model) as first:
        started = time.monotonic()
        added = stack.engine("up", stack.set_of_two(), log=sim_log)
        sim_log(f"phase: a second model added by one up {time.monotonic() - started:.1f}s")
        assert not added.error, added.error
    plan = changed(added)
    sim_log(f"adding {SECOND}: {sorted(plan.items())}; first model: {first.answered} "
            f"answered, {len(first.failed)} failed")  # fmt: skip
    assert first.failed == [] and first.answered > 0
    # Only the second model's parts are created; nothing of the first is replaced or
    # deleted (a set decides no launcher from the image: its read-only Ray probe goes).
    assert not {n for n, op in plan.items() if op in ("replace", "delete")} - {
        "image-ray-spark-1"
    }, plan
    created = {n for n, op in plan.items() if op == "create"}
    assert f"{SECOND}-model-server-container" in created and "router-container" in created
    assert all(n.startswith((f"{SECOND}-", "router")) for n in created), created

    models = added.outputs["models"]
    second = models[SECOND]
    assert second["endpoint"] == "http://172.28.0.12:8001/v1"
    assert second["health"]["ready"] is True and second["launcher"]["name"] == "native"
    assert complete(second["endpoint"], "tiny-two")
    # The second model is the same checkpoint at TP=1 on one node: it answers the tokens
    # the first (TP=2 across both nodes) gave when it was deployed.
    tp1 = sim_complete(second["endpoint"], model="tiny-two")
    sim_log(f"TP=1 vs TP=2 for {SIM_PROMPT!r}: {tp1!r} vs {d.answer!r}")
    assert tp1 == d.answer and tp1.strip()
    assert complete(endpoint, first_model) and models[first_model]["endpoint"] == endpoint

    through_the_router(added.outputs["endpoint"], [first_model, "tiny-two"])

    cfg = load_stack_config(stack.set_of_two())
    found = drift.check(cfg, "sim", d.access, last=added.outputs)
    assert found == [], [f.render() for f in found]

    # A fault of one model, its server hung (its API server process frozen, its container
    # still running): the drift check names that model, a refresh plans only its parts;
    # one `up` heals it, with its flags changed (a shorter max_model_len), while the first
    # keeps serving: only its parts change.
    stack.run_on(cfg, d.access, "spark-2", f"pkill -STOP -f -- '/bin/[v]llm serve {SECOND_ID} '")
    found = drift.check(cfg, "sim", d.access, last=added.outputs)
    assert [(f.node, f.what) for f in found] == [
        ("spark-2", f"model {SECOND}: model server unhealthy")
    ], [f.render() for f in found]
    seen = stack.engine("preview", stack.set_of_two(), refresh=True, log=sim_log)
    assert not seen.error, seen.error
    assert changed(seen) and all(n.startswith(f"{SECOND}-") for n in changed(seen)), changed(seen)
    shorter = stack.set_of_two()
    shorter["models"][1]["vllm"]["max_model_len"] = 256
    with Requests(endpoint, first_model) as first:
        started = time.monotonic()
        healed = stack.engine("up", shorter, log=sim_log)
        sim_log(f"phase: {SECOND}'s hung server healed, its flags changed, by one up "
                f"{time.monotonic() - started:.1f}s")  # fmt: skip
        assert not healed.error, healed.error
    assert first.failed == [] and first.answered > 0
    assert all(n.startswith(f"{SECOND}-") for n in changed(healed)), changed(healed)
    assert healed.outputs["models"][SECOND]["health"]["ready"] is True
    assert complete(healed.outputs["endpoint"], "tiny-two")
    assert max_model_len(second["endpoint"], "tiny-two") == 256

    # Faults of the other model, on the node both share: the first model's Ray worker gone
    # and its weights deleted there. The drift check names that model for each; one `up`
    # heals it while the second keeps serving, none of its parts touched.
    stack.run_on(cfg, d.access, "spark-2", f"docker rm -f {RAY_WORKER} >/dev/null && rm {BLOB}")
    found = drift.check(load_stack_config(shorter), "sim", d.access, last=healed.outputs)
    seen_by = {(f.node, f.what) for f in found}
    wanted = {("spark-2", f"model {first_model}: container missing"),
              ("spark-2", f"model {first_model}: weights incomplete")}  # fmt: skip
    assert wanted <= seen_by, seen_by
    assert all(f"model {first_model}:" in what for _, what in seen_by), seen_by
    with Requests(second["endpoint"], "tiny-two") as other:
        started = time.monotonic()
        healed = stack.engine("up", shorter, log=sim_log)
        sim_log(f"phase: {first_model}'s worker and weights healed by one up "
                f"{time.monotonic() - started:.1f}s; {SECOND}: {other.answered} answered, "
                f"{len(other.failed)} failed")  # fmt: skip
        assert not healed.error, healed.error
    assert other.failed == [] and other.answered > 0
    plan = changed(healed)
    assert plan and not [n for n in plan if n.startswith((f"{SECOND}-", "router"))], plan
    assert complete(endpoint, first_model)

    with Requests(endpoint, first_model) as first:
        started = time.monotonic()
        removed = stack.engine("up", log=sim_log)
        sim_log(f"phase: the second model removed by one up {time.monotonic() - started:.1f}s")
        assert not removed.error, removed.error
    plan = changed(removed)
    sim_log(f"removing {SECOND}: {sorted(plan.items())}; first model: {first.answered} "
            f"answered, {len(first.failed)} failed")  # fmt: skip
    assert first.failed == [] and first.answered > 0
    gone = {n for n, op in plan.items() if op in ("delete", "replace")}
    assert gone and all(n.startswith((f"{SECOND}-", "router")) for n in gone), plan
    assert "models" not in removed.outputs
    left = stack.our_containers(d.cfg, d.access, "spark-2")
    assert not any(SECOND in c or "router" in c for c in left), left
    head = stack.our_containers(d.cfg, d.access, "spark-1")
    assert not any("router" in c for c in head), head
    again = stack.engine("preview", refresh=True, log=sim_log)
    assert not again.error and changed(again) == {}, changed(again)
