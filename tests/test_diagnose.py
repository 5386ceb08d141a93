"""Diagnostics against stand-in nodes: one read-only collection per node, a tarball with
every secret redacted, and a summary that names the fault that breaks the most."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from sparkvllm import diagnose
from sparkvllm.config import StackConfig, load_stack_config
from sparkvllm.specs import containers
from sparkvllm.specs.containers import SPEC_LABEL
from sparkvllm.specs.drift_rules import ContainerLive, Drift, NodeLive
from sparkvllm.workstation import prepare_ssh_access
from tests.conftest import ROOT, TEST_API_KEY, TEST_PRIVATE_KEY

IMG = "sha256:" + "1" * 64
HF = "hf_" + "Q" * 30


@pytest.fixture
def cfg(spark_raw: dict[str, Any]) -> StackConfig:
    spark_raw["api_key"] = TEST_API_KEY
    return load_stack_config(spark_raw)


def test_the_collection_is_one_read_only_script_per_node(cfg: StackConfig) -> None:
    for node in cfg.nodes:
        script = diagnose.collect_command(cfg, "spark", node.name)
        subprocess.run(["bash", "-n", "-c", script], check=True)
        for word in ("docker rm", "docker stop", "docker run", "docker kill", "rm -"):
            assert word not in script
        assert ("=== ray status" in script) == (node.name == cfg.head)
        assert "=== logs sparkvllm-spark-" in script and "=== oom" in script


def test_secrets_are_redacted(cfg: StackConfig) -> None:
    text = (
        f'"Env": ["VLLM_API_KEY={TEST_API_KEY}", "HF_TOKEN={HF}", "PATH=/usr/bin"]\n'
        f"key:\n{TEST_PRIVATE_KEY}\nlog: Bearer {TEST_API_KEY}\n"
    )
    out = diagnose.redact(text, [TEST_PRIVATE_KEY, TEST_API_KEY])
    assert TEST_API_KEY not in out and HF not in out and "TEST-ONLY" not in out
    assert '"PATH=/usr/bin"' in out and '"HF_TOKEN=[redacted]"' in out


def test_the_likely_fault_is_what_breaks_the_most() -> None:
    found = [
        Drift("spark-2", "image replaced", "x"),
        Drift("spark-1", "model server stuck", "y"),
        Drift("spark-1", "container not running", "z"),
    ]
    fault = diagnose.likely_fault(found)
    assert fault is not None and fault.what == "container not running"
    assert diagnose.likely_fault([]) is None


def test_a_diagnosis_of_a_crashed_server(cfg: StackConfig, tmp_path: Path) -> None:
    """The server was OOM-killed: the summary says so first; the tarball holds each
    node's sections, mode 0600, and no secret."""
    access = prepare_ssh_access(cfg, "spark", ROOT)
    server = containers.model_server(cfg, "spark")
    specs: dict[str, list[containers.ContainerSpec]] = {n.name: [] for n in cfg.nodes} | {
        cfg.head: [containers.ray_head(cfg, "spark"), server]
    }
    for n in cfg.worker_nodes:
        specs[n.name] = [containers.ray_worker(cfg, "spark", n)]
    calls: list[str] = []

    def runner(target: Any, command: str, **_: Any) -> subprocess.CompletedProcess[str]:
        calls.append(command)
        host = target.host
        node = next(n.name for n in cfg.nodes if n.ssh.host == host)
        if "=== facts" in command:
            out = (
                "=== facts\narch=aarch64\n=== oom\n[1.2] Out of memory: Killed process 7 (python)\n"
                f'=== inspect {server.name}\n"Env": ["VLLM_API_KEY={TEST_API_KEY}", '
                f'"HF_TOKEN={HF}"]\n'
            )
        elif "echo container." in command or "echo container." in command:
            lines = []
            for s in specs[node]:
                status = "exited 137" if s is server else "running 0"
                extra = " 3 true" if s is server else " 0 false"
                lines.append(f"container.{s.name}={status} {s.labels[SPEC_LABEL]} {IMG}{extra}")
            if node == cfg.head:
                lines.append(f"container_log.{server.name}=torch.OutOfMemoryError: out of memory")
            lines += [f"image.id={IMG}", "image.fingerprint=" + "f" * 64,
                      "weights.manifest=" + "e" * 64]  # fmt: skip
            out = "\n".join(lines) + "\n"
        else:
            out = '{"missing": [], "unexpected": [], "gpus": 2.0, "alive": 2}\n'
        return subprocess.CompletedProcess([], 0, out, "")

    tarball, text, findings = diagnose.diagnose(cfg, "spark", access, tmp_path, runner)
    fault_line = next(line for line in text.splitlines() if line.startswith("likely fault:"))
    assert fault_line.startswith("likely fault: node spark-1: container not running: ")
    assert "exit code 137, restarted 3 time(s), killed for lack of memory (OOM)" in fault_line
    assert "last log: torch.OutOfMemoryError" in fault_line
    assert "kernel OOM lines: 1" in text
    assert tarball.stat().st_mode & 0o777 == 0o600
    with tarfile.open(tarball) as tar:
        names = tar.getnames()
        members = [tar.extractfile(m) for m in tar.getmembers() if m.isfile()]
        blob = b"".join(f.read() for f in members if f is not None)
    assert any(n.endswith("/spark-1/oom.txt") for n in names)
    assert any(n.endswith("/summary.txt") for n in names)
    assert TEST_API_KEY.encode() not in blob and HF.encode() not in blob
    assert b"TEST-ONLY" not in blob
    fault = diagnose.likely_fault(findings)
    assert fault is not None and fault.what == "container not running"


def _live(containers_: dict[str, str], server: dict[str, Any] | None = None) -> NodeLive:
    return NodeLive(
        containers={n: ContainerLive(s, 0, "", "") for n, s in containers_.items()}, server=server
    )


def test_a_sets_summary_reads_every_model(spark_raw: dict[str, Any]) -> None:
    """Each model's server is read on its own rank 0 and said under its name; a node's line
    holds every model's containers there; `ray status` is collected on the Ray model's head
    (here spark-2), not on the stack's."""
    from tests.test_models_config import two_models

    raw = two_models(spark_raw)
    raw["models"][0]["nodes"] = ["spark-2", "spark-1"]
    raw["models"][0]["parallelism"] = {"tensor": 2, "launcher": "ray"}
    raw["models"][0]["vllm"]["gpu_memory_utilization"] = 0.5
    raw["models"][1]["nodes"] = ["spark-1"]
    cfg = load_stack_config(raw)
    big, coder = (cfg.for_model(m) for m in cfg.served)
    assert (big.head, coder.head) == ("spark-2", "spark-1")
    ok = {"health_status": 200, "smoke": {"ok": True}, "models": ["qwen3.5-122b"]}
    lives = {
        "qwen3.5-122b": {
            "spark-2": _live({"model-server": "running"}, ok),
            "spark-1": _live({"ray-worker": "running"}),
        },
        "coder": {"spark-1": _live({"coder-model-server": "exited"}, {"health_status": None})},
    }
    text = diagnose.summary(cfg, lives, [], {})
    lines = text.splitlines()
    assert "spark-1: coder-model-server=exited, ray-worker=running; kernel OOM lines: 0" in lines
    assert "qwen3.5-122b server: /health 200, token ok, models ['qwen3.5-122b']" in lines
    assert "coder server: /health None, token NONE, models None" in lines
    scripts = {n.name: diagnose.collect_command(cfg, "spark", n.name) for n in cfg.nodes}
    assert ["=== ray status" in scripts[n] for n in ("spark-1", "spark-2")] == [False, True]
