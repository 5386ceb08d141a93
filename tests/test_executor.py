"""The local executor (sim/executor.py) with a recording fake runner, Ray-autoscaler
style: which node each step ran on, in which order, and how it is undone."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from components.deployment import deploy
from sim.executor import ExecutionError, LocalExecutor, apply_program, docker_run_argv
from sparkvllm.config import load_stack_config
from sparkvllm.remote import SshTarget
from sparkvllm.workstation import prepare_ssh_access
from tests.conftest import ROOT, TEST_API_KEY
from tests.pulumi_mocks import NodeAnswers


class FakeNodes:
    """Answers like healthy nodes; records (host, command) in call order."""

    def __init__(self, answers: NodeAnswers, fail_on: str | None = None):
        self.answers = answers
        self.calls: list[tuple[str, str]] = []
        self.fail_on = fail_on

    def __call__(
        self, target: SshTarget, command: str, *, stdin: str | None = None, timeout: float = 0
    ) -> subprocess.CompletedProcess[str]:
        self.calls.append((target.host, command))
        if self.fail_on and self.fail_on in command:
            return subprocess.CompletedProcess([], 1, "", "boom: no such netdev\n")
        stdout = ""
        if "echo arch=$(uname -m)" in command:
            node = next(n for n in self.answers.cfg.nodes if n.ssh.host == target.host)
            stdout = self.answers.stdout_for(f"{node.name}-facts")
        elif ".route=$(ip -o route get" in command:
            node = next(n for n in self.answers.cfg.nodes if n.ssh.host == target.host)
            stdout = self.answers.stdout_for(f"{node.name}-links")
        elif "docker save" in command:
            stdout = self.answers.stdout_for("image-sync-spark-2")
        elif (
            "docker pull" in command
            and "docker image inspect" in command
            and "fingerprint" in command
        ):
            stdout = self.answers.stdout_for("image-obtain-spark-1")
        elif "def versions" in (stdin or ""):
            stdout = self.answers.stdout_for("image-versions-spark-1")
        elif "def model_architectures" in (stdin or ""):
            stdout = self.answers.stdout_for("image-support-spark-1")
        elif "manifest()" in command:
            stdout = self.answers.stdout_for("model-sync-spark-2")
        elif "def summarize" in (stdin or ""):
            stdout = self.answers.stdout_for("model-server-ray-ready")
        elif "def probe" in (stdin or ""):
            stdout = self.answers.stdout_for("model-server-health")
        elif command.startswith("docker image inspect"):
            stdout = "sha256:" + "f" * 64
        elif "docker run -d" in command:
            stdout = "c0ffee"
        return subprocess.CompletedProcess([], 0, stdout, "")


def _apply(
    spark_raw: dict[str, Any], fail_on: str | None = None
) -> tuple[LocalExecutor, FakeNodes, dict[str, Any]]:
    cfg = load_stack_config(spark_raw)
    access = prepare_ssh_access(cfg, "test", ROOT)
    fake = FakeNodes(NodeAnswers(cfg), fail_on)
    executor = LocalExecutor(log=lambda _: None, runner=fake)
    outputs = apply_program(lambda: deploy(cfg, "test", access), executor, stack="test")
    return executor, fake, outputs


def _index(calls: list[tuple[str, str]], host: str, needle: str) -> int:
    return next(i for i, (h, c) in enumerate(calls) if h == host and needle in c)


def test_steps_run_on_their_nodes_in_graph_order(spark_raw: dict[str, Any]) -> None:
    _, fake, outputs = _apply(spark_raw)
    head, worker = "10.1.230.180", "10.1.230.181"
    facts2 = _index(fake.calls, worker, "echo arch=$(uname -m)")
    sync = _index(fake.calls, head, "docker save")
    image2 = _index(fake.calls, worker, "docker image inspect --format '{{.Id}}'")
    ray_head = _index(fake.calls, head, "sparkvllm-test-ray-head")
    ray_worker = _index(fake.calls, worker, "sparkvllm-test-ray-worker-spark-2")
    server = _index(fake.calls, head, "--name sparkvllm-test-model-server")
    assert facts2 < sync < image2 < ray_worker
    assert ray_head < ray_worker < server
    assert outputs["health"]["ready"] is True


def test_a_failing_step_stops_everything_after_it(spark_raw: dict[str, Any]) -> None:
    with pytest.raises(Exception, match="boom: no such netdev"):
        _apply(spark_raw, fail_on="docker save")


def test_destroy_undoes_containers_newest_first(spark_raw: dict[str, Any]) -> None:
    executor, fake, _ = _apply(spark_raw)
    fake.calls.clear()
    assert executor.destroy() == []
    removed = [c for _, c in fake.calls if c.startswith("docker rm -f")]
    assert removed[0].startswith("docker rm -f sparkvllm-test-model-server")
    assert removed[-1].startswith("docker rm -f sparkvllm-test-ray-head")
    assert len(removed) == 3
    # Images are kept by default (keep_locally): no image removal.
    assert not any("docker image rm" in c for _, c in fake.calls)


def test_container_inputs_render_to_docker_run(spark_raw: dict[str, Any]) -> None:
    spark_raw["api_key"] = TEST_API_KEY
    executor, _, _ = _apply(spark_raw)
    server = next(a for a in executor.applied if a.name == "model-server-container")
    argv = docker_run_argv(server.name, server.inputs)
    joined = " ".join(argv)
    for part in (
        "--network host",
        "--ipc host",
        "--pid host",
        "--gpus all",
        "--device /dev/infiniband:/dev/infiniband:rwm",
        "--ulimit memlock=-1:-1",
        "--cap-add IPC_LOCK",
        "--restart on-failure:3",
        "--entrypoint bash",
        f"-e VLLM_API_KEY={TEST_API_KEY}",
        "--health-start-period 40m0s",
    ):
        assert part in joined, part
    image_at = argv.index("sha256:" + "f" * 64)
    assert argv[image_at + 1] == "-c"
    assert argv[image_at + 2].startswith("mkdir -p /root/.config/vllm && ")
    assert argv[image_at + 2].endswith(
        '\'--speculative-config={"method":"mtp","num_speculative_tokens":1}\''
    )


def test_unknown_container_inputs_are_refused() -> None:
    with pytest.raises(ExecutionError, match=r"does not support inputs \['privileged'\]"):
        docker_run_argv("x", {"name": "x", "image": "i", "privileged": True})


@pytest.mark.parametrize(
    ("live", "kept"),
    [
        ("true SPEC sha256:img", True),
        ("false SPEC sha256:img", False),  # stopped
        ("true OTHER sha256:img", False),  # config changed
        ("true SPEC sha256:old", False),  # image replaced
        ("", False),  # removed
    ],
)
def test_reapply_keeps_only_a_container_that_still_matches(
    tmp_path: Any, live: str, kept: bool
) -> None:
    """The converge command, run by bash against a stand-in `docker` that logs its calls."""
    calls = tmp_path / "calls"
    fake = tmp_path / "docker"
    fake.write_text(
        "#!/bin/bash\n"
        f'echo "$*" >> {calls}\n'
        f'if [ "$1" = inspect ] && [ "$3" != "{{{{.Id}}}}" ]; then printf %s {live!r}; fi\n'
        'if [ "$1" = inspect ] && [ "$3" = "{{.Id}}" ]; then echo live-id; fi\n'
        'if [ "$1" = run ]; then echo new-id; fi\n'
    )
    fake.chmod(0o755)

    def local(target: SshTarget, command: str, **_: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", command], capture_output=True, text=True,
            env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, check=False,
        )  # fmt: skip

    executor = LocalExecutor(log=lambda _: None, runner=local)
    executor._providers["p"] = SshTarget("root", "127.0.0.1", 22, ())
    inputs = {
        "name": "c1",
        "image": "sha256:img",
        "labels": [{"label": "ai.sparkvllm.spec", "value": "SPEC"}],
        "command": ["sleep", "1"],
    }
    container_id, _, _ = executor._container("c1", inputs, "urn::p")
    ran = calls.read_text()
    assert container_id == ("live-id" if kept else "new-id")
    assert ("run -d --name c1" in ran) is not kept
    assert ("rm -f c1" in ran) is not kept


def test_after_a_failed_step_no_new_step_starts() -> None:
    """Like the engine's default: the first failure halts the apply; a step registered
    later is refused without touching its node."""
    calls: list[str] = []

    def failing(target: SshTarget, command: str, **_: Any) -> subprocess.CompletedProcess[str]:
        calls.append(command)
        return subprocess.CompletedProcess([], 1, "", "boom\n")

    executor = LocalExecutor(log=lambda _: None, runner=failing)

    def command(name: str) -> Any:
        import pulumi

        conn = {"host": "127.0.0.1", "user": "root", "privateKey": "k"}
        args = {"connection": conn, "create": f"echo {name}"}
        return pulumi.runtime.MockResourceArgs("command:remote:Command", name, args, custom=True)

    with pytest.raises(ExecutionError, match=r"first failed on 127\.0\.0\.1"):
        executor.new_resource(command("first"))
    refused = "second: not applied, an earlier step failed: first failed on"
    with pytest.raises(ExecutionError, match=refused):
        executor.new_resource(command("second"))
    assert calls == ["echo first"]
    executor.halt()  # nothing in flight: returns at once
