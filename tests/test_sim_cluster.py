"""The program's own registered resources, executed for real on the SIMULATED cluster.

`sim.stack.apply` runs the Pulumi program under the local executor: every command and
container spec the components register is run on the sim nodes over ssh, in the order the
program's dependency graph allows. Then we check what really happened on the nodes.

Model and prompt for the TP=1 vs TP=2 comparison: the tiny random-weight Qwen3 model made
offline (`sim/model/`), served in float32 (`vllm.dtype` in Pulumi.sim.yaml), completion of
a fixed prompt at temperature 0 with 12 tokens. float32 keeps the greedy argmax stable
when the matmuls are split across two ranks (fp16/bf16 rounding could flip near-ties).
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from sim import stack
from sim.executor import LocalExecutor
from sparkvllm.config import StackConfig
from sparkvllm.probes import server_health
from sparkvllm.remote import run_ssh
from sparkvllm.specs.commands import parse_kv
from sparkvllm.workstation import SshAccess

pytestmark = pytest.mark.sim

PROMPT = "The simulated spark cluster says"
TOKENS = 12


@dataclass
class Deployed:
    cfg: StackConfig
    access: SshAccess
    executor: LocalExecutor
    outputs: dict[str, Any]
    seconds: float


def _log(message: str) -> None:
    print(message, flush=True)


@pytest.fixture(scope="module")
def sim_cluster() -> list[dict[str, object]]:
    started = time.monotonic()
    table = stack.ensure_up()
    _log(f"phase: sim up {time.monotonic() - started:.1f}s")
    return table


@pytest.fixture(scope="module")
def tp2(sim_cluster: list[dict[str, object]]) -> Iterator[Deployed]:
    cfg, access = stack.load()
    stack.destroy_by_label(cfg, access)  # a previous run's leftovers, if any
    started = time.monotonic()
    executor, outputs = stack.apply(cfg, access, log=_log)
    seconds = time.monotonic() - started
    _log(f"phase: deploy TP=2 {seconds:.1f}s")
    yield Deployed(cfg, access, executor, outputs, seconds)
    assert executor.destroy() == []


def _complete(endpoint: str, model: str) -> dict[str, Any]:
    body = {"model": model, "prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0, "seed": 0}
    req = urllib.request.Request(
        f"{endpoint}/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())


def _ssh(d: Deployed, node: str, command: str) -> str:
    return stack.run_on(d.cfg, d.access, node, command, timeout=120).strip()


def test_preflight_facts_are_what_the_nodes_have(tp2: Deployed) -> None:
    for node in tp2.cfg.nodes:
        facts = tp2.outputs["nodes"][node.name]
        assert facts["hostname"] == _ssh(tp2, node.name, "hostname") == node.name
        assert facts["arch"] == _ssh(tp2, node.name, "uname -m") == "x86_64"
        assert facts["netdev"]["addresses"] == [str(node.cluster_link.address)]
        assert facts["netdev"]["state"] in ("up", "unknown")
        assert facts["docker_version"] == _ssh(
            tp2, node.name, "docker version --format '{{.Server.Version}}'"
        )
        assert facts["mem_total_gib"] > 1


def test_the_image_reached_node_2_with_equal_ids(tp2: Deployed) -> None:
    ids = tp2.outputs["image"]["ids"]
    ref = tp2.cfg.image.ref
    live = {
        n.name: _ssh(tp2, n.name, f"docker image inspect --format '{{{{.Id}}}}' {ref}")
        for n in tp2.cfg.nodes
    }
    assert ids == live
    assert len(set(ids.values())) == 1


def test_a_second_sync_transfers_nothing(tp2: Deployed) -> None:
    sync = next(a for a in tp2.executor.applied if a.name == "image-sync-spark-2")
    assert sync.target is not None
    started = time.monotonic()
    again = run_ssh(sync.target, sync.inputs["create"], stdin=sync.inputs["stdin"], timeout=600)
    assert again.returncode == 0, again.stderr
    facts = parse_kv(again.stdout)
    assert facts["transferred"] == "0"
    assert facts["fingerprint"] == tp2.outputs["image"]["fingerprint"]
    assert "streaming" not in again.stderr
    _log(f"phase: second image sync {time.monotonic() - started:.1f}s (no transfer)")


def test_ray_reports_two_nodes_and_two_gpus(tp2: Deployed) -> None:
    ray = tp2.outputs["health"]["ray"]
    assert ray["nodes"] == 2
    assert ray["gpus"] == 2.0
    assert ray["node_ips"] == ["172.28.0.11", "172.28.0.12"]


def test_vllm_tp2_answers_health_models_and_chat(tp2: Deployed) -> None:
    endpoint = tp2.outputs["endpoint"]
    assert endpoint == "http://172.28.0.11:8000/v1"
    base = endpoint.removesuffix("/v1")
    with urllib.request.urlopen(f"{base}/health", timeout=10) as resp:
        assert resp.status == 200
    with urllib.request.urlopen(f"{endpoint}/models", timeout=10) as resp:
        assert [m["id"] for m in json.loads(resp.read())["data"]] == ["tiny-qwen3"]
    report = server_health.probe(base, "tiny-qwen3")
    assert report["smoke"]["ok"] is True
    assert report["smoke"]["status"] == 200


def test_health_output_is_what_a_fresh_probe_sees(tp2: Deployed) -> None:
    claimed = tp2.outputs["health"]
    fresh = server_health.probe(tp2.outputs["endpoint"].removesuffix("/v1"), "tiny-qwen3")
    assert claimed["ready"] is True
    assert claimed["models"] == fresh["models"]
    assert claimed["vllm_version"] == fresh["vllm_version"] != ""
    assert fresh["metrics"]["vllm:generation_tokens_total"] >= claimed["metrics"].get(
        "vllm:generation_tokens_total", 0
    )
    assert claimed["nccl_transport"] == "unknown"  # CPU build: gloo, no NCCL at all


def test_weights_were_already_in_place_and_verified(tp2: Deployed) -> None:
    sync = next(a for a in tp2.executor.applied if a.name == "model-sync-spark-2")
    assert parse_kv(sync.outputs["stdout"])["transferred"] == "0"
    assert len(tp2.outputs["model"]["weights_manifest"]) == 64
    assert tp2.outputs["model"]["support"]["architectures"] == ["Qwen3ForCausalLM"]


def test_tp2_answer_equals_tp1_and_teardown_leaves_nodes_clean(tp2: Deployed) -> None:
    tp2_answer = _complete(tp2.outputs["endpoint"], "tiny-qwen3")["choices"][0]["text"]
    assert tp2.executor.destroy() == []
    for node in tp2.cfg.nodes:
        assert stack.our_containers(tp2.cfg, tp2.access, node.name) == []

    raw = stack.stack_raw()
    raw["nodes"] = raw["nodes"][:1]
    raw["parallelism"] = {"tensor": 1, "pipeline": 1}
    cfg1, access1 = stack.load(raw)
    started = time.monotonic()
    executor1, outputs1 = stack.apply(cfg1, access1, log=_log)
    _log(f"phase: deploy TP=1 {time.monotonic() - started:.1f}s")
    try:
        tp1_answer = _complete(outputs1["endpoint"], "tiny-qwen3")["choices"][0]["text"]
    finally:
        assert executor1.destroy() == []
    _log(f"TP=1 vs TP=2 for {PROMPT!r}: {tp1_answer!r} vs {tp2_answer!r}")
    assert tp2_answer == tp1_answer
    assert tp2_answer.strip() != ""
    for node in tp2.cfg.nodes:
        assert stack.our_containers(tp2.cfg, tp2.access, node.name) == []
