"""The program's own registered resources, carried out for real on the SIMULATED cluster
through the local engine (the session's shared deployment, tests/conftest.py): every
command, node step and container spec the components register runs on the sim nodes over
ssh, in the order the program's dependency graph allows. Then we check what really
happened on the nodes.

Model and prompt for the TP=1 vs TP=2 comparison (tests/test_sim_models.py): the tiny
random-weight Qwen3 model made offline (`sim/model/`), served in float32 (`vllm.dtype` in
Pulumi.sim.yaml), completion of a fixed prompt at temperature 0 with 12 tokens. float32
keeps the greedy argmax stable when the matmuls are split across two ranks.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request

import pytest

from sim import stack
from sparkvllm.probes import server_health
from sparkvllm.specs import weights
from sparkvllm.specs.commands import image_sync
from sparkvllm.specs.output import key_values
from tests.conftest import ROOT, SimDeployment, sim_complete, sim_log

pytestmark = pytest.mark.sim

Deployed = SimDeployment


@pytest.fixture(scope="module")
def tp2(sim_deployment: SimDeployment) -> SimDeployment:
    return sim_deployment


def _log(message: str) -> None:
    print(message, flush=True)


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
    sync = image_sync(tp2.cfg, tp2.cfg.nodes[1], tp2.access.host_keys["spark-2"])
    started = time.monotonic()
    out = stack.run_on(tp2.cfg, tp2.access, sync.node, sync.shell_command,
                       stdin=tp2.access.private_key, timeout=600)  # fmt: skip
    facts = key_values(out)
    assert facts["transferred"] == "0"
    assert facts["fingerprint"] == tp2.outputs["image"]["fingerprint"]
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
    assert claimed["nccl_transport"] == "gloo"  # CPU build: torch.distributed over gloo


def test_weights_were_already_in_place_and_verified(tp2: Deployed) -> None:
    assert len(tp2.outputs["model"]["weights_manifest"]) == 64
    assert tp2.outputs["model"]["support"]["architectures"] == ["Qwen3ForCausalLM"]
    read = weights.weights_read(tp2.cfg)
    for node in tp2.cfg.nodes:
        out = stack.run_on(tp2.cfg, tp2.access, node.name, f"bash -c {shlex.quote(read)}")
        assert key_values(out)["manifest"] == tp2.outputs["model"]["weights_manifest"]


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


def test_the_monitor_watches_the_cluster_in_tmux(tp2: Deployed) -> None:
    """`python -m sparkvllm.monitor --stack sim` in a real terminal (tmux), while requests
    are answered: both nodes with their memory, the GPU figures absent (the sim has no
    nvidia-smi: none invented), the deployment's containers running, and the model's
    generated tokens/s above 0 from vLLM's own /metrics."""
    session = f"sparkvllm-monitor-{os.getpid()}"
    # A new terminal's size is its own: not the COLUMNS/LINES this test's process holds.
    command = (
        f"env -u COLUMNS -u LINES {shlex.quote(sys.executable)} -m sparkvllm.monitor "
        "--stack sim --every 1"
    )
    tmux = ["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "50"]
    subprocess.run([*tmux, "-c", str(ROOT), command], check=True, timeout=30)
    try:
        screen, deadline = "", time.monotonic() + 60
        while time.monotonic() < deadline:
            sim_complete(tp2.outputs["endpoint"], tokens=24)
            pane = ["tmux", "capture-pane", "-p", "-t", session]
            screen = subprocess.run(pane, capture_output=True, text=True, timeout=30).stdout
            row = re.search(r"^ +tiny-qwen3 +spark-1 +([0-9.]+) ", screen, re.M)
            if row and float(row.group(1)) > 0:
                break
        else:
            raise AssertionError(f"no tokens/s above 0 on the monitor's screen:\n{screen}")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], timeout=30, check=False)
    for node in ("spark-1", "spark-2"):
        memory = rf"^ +{node} +[0-9.]+/[0-9.]+ GiB +[0-9.]+ GiB +absent +absent +absent +absent "
        assert re.search(memory, screen, re.M), screen
    assert re.search(r"^ +spark-1 +sparkvllm-sim-model-server +running", screen, re.M)
    assert re.search(r"^ +spark-2 +sparkvllm-sim-ray-worker-spark-2 +running", screen, re.M)


def test_the_metrics_target_serves_the_dashboards_series(tp2: Deployed) -> None:
    """The `metrics` output's target, scraped from this machine as a Prometheus would:
    vLLM's exposition holds every series the Grafana dashboard draws (the speculative ones
    only with speculative decoding, which the sim's model does not do)."""
    from sparkvllm.specs import scrape as metrics

    (target,) = tp2.outputs["metrics"]["targets"]
    assert target["model"] == "tiny-qwen3" and target["node"] == "spark-1"
    sim_complete(tp2.outputs["endpoint"])
    with urllib.request.urlopen(target["url"], timeout=30) as response:
        exposition = response.read().decode()
    served = {line.split("{")[0].split(" ")[0] for line in exposition.splitlines()}
    drawn = set(re.findall(r"vllm:[a-z_]+", json.dumps(metrics.dashboard("sim"))))
    speculative = {metrics.SPEC_ACCEPTED, metrics.SPEC_DRAFT}
    assert drawn - speculative <= served, sorted(drawn - speculative - served)
