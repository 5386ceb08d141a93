"""The examples run: the program of its own (examples/two-sparks) under Pulumi's mock
runtime with its own stack file, and the output reader against a state of the local
engine."""

from __future__ import annotations

import json
import runpy
import shutil
import sys
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml

from localengine.program import apply_project_config
from tests.conftest import ROOT, TEST_PRIVATE_KEY
from tests.pulumi_mocks import NodeAnswers, RecordingMonitor, apply_program

EXAMPLE = ROOT / "examples" / "two-sparks"


def example_config(key_file: Path) -> dict[str, str]:
    """The example stack's config as the CLI hands it to the program: Pulumi.dev.yaml with
    the project's declared defaults applied, structured values as JSON."""
    project = yaml.safe_load((EXAMPLE / "Pulumi.yaml").read_text())
    stack = yaml.safe_load((EXAMPLE / "Pulumi.dev.yaml").read_text())["config"]
    stack["my-llm:ssh_key_file"] = str(key_file)
    merged = apply_project_config(project, "dev", stack, set())
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in merged.items()}


def example_cluster(tmp_path: Path) -> tuple[Path, dict[str, str], Any]:
    """A key file, the example stack's config as the program gets it, and the cluster's
    typed config its own module makes of it."""
    key = tmp_path / "id"
    key.write_text(TEST_PRIVATE_KEY)
    values = example_config(key)
    pulumi.runtime.set_all_config(values, [])
    module = runpy.run_path(str(EXAMPLE / "my_llm.py"), run_name="example")
    return key, values, module["cluster_config"](pulumi.Config("my-llm"))


def test_the_example_program_deploys_a_cluster_from_its_own_config(tmp_path: Path) -> None:
    _key, values, cfg = example_cluster(tmp_path)
    assert [n.name for n in cfg.nodes] == ["left", "right"] and cfg.parallelism.tensor == 2
    assert cfg.nodes[1].ssh.user == "nvidia"  # the project's declared default
    answers = NodeAnswers(cfg)
    monitor = RecordingMonitor(answers)

    def program() -> dict[str, Any]:
        # As the language host runs it: the project's folder (on sys.path, so `my_llm`).
        pulumi.runtime.set_all_config(values, [])
        runpy.run_path(str(EXAMPLE), run_name="__main__")
        return {}

    apply_program(program, answers, stack="dev", monitor=monitor, project="my-llm")
    types = sorted(
        r.type for r in monitor.registrations.values() if r.type.startswith("sparkvllm:")
    )
    assert types.count("sparkvllm:index:GB10Node") == 2
    assert "sparkvllm:index:SparkVllmCluster" in types
    urns = list(monitor.registrations)
    assert any(u.endswith("::llm") for u in urns)
    assert all(u.startswith("urn:pulumi:dev::my-llm::") for u in urns)


def test_the_example_deploys_through_the_engine_as_a_user_runs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """examples/two-sparks as a user runs it: a copy of its folder, the virtualenv of its
    own that its Pulumi.yaml names (here this one linked in: the package is installed in
    it), no sys.path edit; the program in its own process, the NodeSteps' provider loaded
    in the SDK's provider host started in the example's folder (where only the installed
    package can give `components`). The nodes are in memory (tests/test_plan_engine.py)."""
    from tests.test_plan_engine import Stack, changed

    key, _values, cfg = example_cluster(tmp_path)
    example = tmp_path / "two-sparks"
    shutil.copytree(EXAMPLE, example, ignore=shutil.ignore_patterns(".venv", ".localengine"))
    (example / ".venv").symlink_to(sys.prefix)
    stack = Stack(tmp_path / "backend", monkeypatch)
    stack.project_dir = example
    stack.answers = NodeAnswers(cfg)
    stack.node.images[cfg.image.ref] = "sha256:" + "e" * 64

    stack_file = yaml.safe_load((EXAMPLE / "Pulumi.dev.yaml").read_text())["config"]
    stack_file["my-llm:ssh_key_file"] = str(key)

    def engine(operation: str) -> dict[str, str]:
        return changed(stack.run_in(operation, "dev", example, stack_file))

    planned = engine("preview")
    done = engine("up")
    # parallelism.launcher auto: a new stack's preview cannot know the image's Ray yet; it
    # shows native (and says so), and `up` runs Ray, which the mocked image holds.
    assert any("launcher: native assumed" in m for m in stack.logged)
    assert "rank-right-container" in planned and "ray-head-container" in done
    serving = ("model-server", "ray-", "rank-")
    assert {n: op for n, op in planned.items() if not n.startswith(serving)} == {
        n: op for n, op in done.items() if not n.startswith(serving)
    }
    assert set(done.values()) == {"create"}
    assert any(n.endswith("-facts") for n in done) and "llm" in done
    assert engine("up") == {}  # a second up: nothing
    state = json.loads((tmp_path / "backend/.localengine/stacks/my-llm/dev.json").read_text())
    urns = [r["urn"] for r in state["checkpoint"]["latest"]["resources"]]
    assert urns and all(u.startswith("urn:pulumi:dev::my-llm::") for u in urns)


def test_the_example_config_is_refused_with_field_value_and_fix(tmp_path: Path) -> None:
    key = tmp_path / "id"
    key.write_text(TEST_PRIVATE_KEY)
    values = example_config(key)
    hosts = json.loads(values["my-llm:hosts"])
    hosts[1]["cluster"] = "192.168.200.1; touch /tmp/x"
    values["my-llm:hosts"] = json.dumps(hosts)
    pulumi.runtime.set_all_config(values, [])
    module = runpy.run_path(str(EXAMPLE / "my_llm.py"), run_name="example")
    from sparkvllm.config import ConfigError

    with pytest.raises(ConfigError, match=r"nodes\[1\]\.cluster_link\.address"):
        module["cluster_config"](pulumi.Config("my-llm"))


def test_call_model_reads_the_outputs_of_a_local_engine_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader takes the endpoint and model from the outputs and posts one completion
    (here to a stand-in server on loopback)."""
    import http.server
    import threading

    seen: list[dict[str, Any]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"path": self.path, "body": body, "auth": self.headers["Authorization"]})
            reply = {"choices": [{"message": {"content": "hi"}}], "usage": {"completion_tokens": 1}}
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    call_model = runpy.run_path(str(ROOT / "examples" / "call_model.py"), run_name="example")
    outputs = {"endpoint": f"http://127.0.0.1:{server.server_port}/v1", "served_model": "m"}
    monkeypatch.setenv("SPARK_VLLM_API_KEY", "k-123")
    try:
        got = call_model["complete"](outputs, "hello", 4)
    finally:
        server.shutdown()
    assert got["text"] == "hi" and got["completion_tokens"] == 1
    assert seen[0]["path"] == "/v1/chat/completions" and seen[0]["auth"] == "Bearer k-123"
    assert seen[0]["body"]["model"] == "m" and seen[0]["body"]["max_tokens"] == 4
