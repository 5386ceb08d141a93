"""Preview tells the truth, and a change costs only what it must: the real program run
through the local engine against in-memory nodes (what a healthy GB10 node prints, from
tests/pulumi_mocks.py). For each change: `up` the base config, `preview` the changed one,
`up` it, and compare: the preview's plan must equal what `up` did, and only the listed
resources may change."""

from __future__ import annotations

import base64
import copy
import shutil
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dill
import pytest
import yaml

from components.node_step import state_value, step_id
from localengine import wire
from localengine.operations import Result, run
from localengine.program import project_file
from localengine.providers.base import Provider, ProviderError, ReadResult
from localengine.providers.dynamic import DynamicProvider, PluginContext
from sparkvllm.config import load_stack_config
from tests.conftest import ROOT, TEST_HF_TOKEN, TEST_PRIVATE_KEY
from tests.pulumi_mocks import IMAGE_VERSIONS, NodeAnswers
from tests.test_localengine import FakeCommand, FakeDocker, Node

# The real program through the local engine (a program process per operation): end to end.
pytestmark = pytest.mark.engine


class AnswerCommand(FakeCommand):
    """pulumi-command on a healthy node: stdout by resource name."""

    def __init__(self, node: Node, answers: NodeAnswers):
        super().__init__(node)
        self.answers = answers

    def create(self, typ: str, name: str, inputs: dict[str, Any], preview: bool) -> Any:
        id_, outs = super().create(typ, name, inputs, preview)
        if not preview:
            outs = {**outs, "stdout": self.answers.stdout_for(name)}
        return id_, outs

    def update(self, typ: str, name: str, id_: str, olds: Any, news: Any, preview: bool) -> Any:
        outs = super().update(typ, name, id_, olds, news, preview)
        return outs if preview else {**outs, "stdout": self.answers.stdout_for(name)}


def unpickled(inputs: dict[str, Any]) -> Any:
    """The step's provider object, as the host unpickles it (for its judge)."""
    return dill.loads(base64.b64decode(wire.plain(inputs["__provider"])))


class AnswerStep(DynamicProvider):
    """NodeSteps on a healthy node: create prints the node's answer, judged by the step's
    own pickled judge (a preflight); reads see it as left. (Check and diff are the real
    ones.)"""

    def __init__(self, node: Node, answers: NodeAnswers, project_dir: Path):
        super().__init__(PluginContext(project_dir, project_file(project_dir), "127.0.0.1:0"))
        self.node, self.answers = node, answers

    def create(self, typ: str, name: str, inputs: dict[str, Any], preview: bool) -> Any:
        if preview:
            return "", dict(inputs)
        self.node.calls.append(f"step {name}")
        stdout = self.answers.stdout_for(name)
        judge = unpickled(inputs).judge
        if judge is not None:
            try:
                judge(stdout)
            except Exception as e:
                raise ProviderError(f"{name}: {e}") from None
        key = inputs.get("state_key")
        value = state_value(stdout, str(key)) if key else ""
        outs = {**inputs, "stdout": stdout, "expected": value, "observed": value,
                "generation": uuid.uuid4().hex[:16]}  # fmt: skip
        return step_id(inputs, stdout, outs["generation"]), outs

    def delete(self, typ: str, id_: str, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
        self.node.calls.append(f"undo {id_}")

    def read(
        self, typ: str, id_: str, inputs: dict[str, Any], outputs: dict[str, Any]
    ) -> ReadResult:
        """The node as each step left it."""
        return ReadResult(id_, inputs, outputs)


@pytest.fixture
def base(spark_raw: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    return base_config(spark_raw, tmp_path)


def base_config(spark_raw: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The spark stack's config with a key file in `folder`, MTP and an API key."""
    raw = copy.deepcopy(spark_raw)
    key = folder / "id_test"
    key.write_text(TEST_PRIVATE_KEY)
    raw.pop("ssh_private_key")
    raw["ssh_private_key_file"] = str(key)
    raw["vllm"]["speculative_config"] = {"method": "mtp", "num_speculative_tokens": 1}
    raw["api_key"] = "sk-first-1"
    return raw


class Stack:
    def __init__(self, backend: Path, monkeypatch: pytest.MonkeyPatch):
        monkeypatch.setenv("LOCALENGINE_BACKEND_URL", f"file://{backend}")
        self.node = Node()
        self.answers: NodeAnswers | None = None
        self.project_dir = ROOT
        # What the image holds, as its versions probe prints it (default: with Ray).
        self.versions: dict[str, str] | None = None
        self.logged: list[str] = []

    def factory(self, pkg: str, inputs: dict[str, Any]) -> Provider:
        assert self.answers is not None
        if pkg == "command":
            return AnswerCommand(self.node, self.answers)
        if pkg == "docker":
            return FakeDocker(self.node, inputs)
        return AnswerStep(self.node, self.answers, self.project_dir)

    def run(
        self, operation: str, raw: dict[str, Any], refresh: bool = False, check: bool = True,
        stack: str = "spark",
    ) -> Result:  # fmt: skip
        self.answers = NodeAnswers(load_stack_config(raw))
        if self.versions is not None:
            versions = dict(self.versions)
            self.answers.versions = lambda _node: dict(versions)
        self.node.images.setdefault(raw["image"]["ref"], "sha256:" + "f" * 64)
        secret: list[str] = [k for k in ("api_key", "hf_token") if k in raw]
        return self.run_in(operation, stack, ROOT, raw, secret, refresh, check)

    def run_in(
        self, operation: str, stack: str, project_dir: Path, config: dict[str, Any],
        secret_keys: list[str] | None = None, refresh: bool = False, check: bool = True,
    ) -> Result:  # fmt: skip
        """One engine operation on these in-memory nodes, for any project and stack."""
        result = run(operation, stack, project_dir, config=config, refresh=refresh,
                     secret_keys=secret_keys, provider_factory=self.factory,
                     log=self.logged.append)  # fmt: skip
        assert not (check and result.error), result.error
        return result


def changed(result: Result) -> dict[str, str]:
    return {s.name: s.op for s in result.steps if s.op != "same"}


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(raw: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        d = raw
        for p in parents:
            d = d[p]
        d[leaf] = value

    return change


def _rotate_key(raw: dict[str, Any]) -> None:
    Path(raw["ssh_private_key_file"]).write_text(TEST_PRIVATE_KEY.replace("7f3a", "0b2c"))


def _reverse(path: str) -> Callable[[dict[str, Any]], None]:
    def change(raw: dict[str, Any]) -> None:
        if path == "nodes":
            raw["nodes"] = list(reversed(raw["nodes"]))
        else:
            for node in raw["nodes"]:
                node["cluster_link"]["roce_hcas"] = list(
                    reversed(node["cluster_link"]["roce_hcas"])
                )
        # nothing else

    return change


def _reorder_speculative(raw: dict[str, Any]) -> None:
    raw["vllm"]["speculative_config"] = {"num_speculative_tokens": 1, "method": "mtp"}


# The guard's read asks the server for the served model: a new one is recorded (an update
# that runs nothing), else its next refresh would ask for the old name and call it stuck.
SERVER = {"model-server-container", "model-server-health", "model-server-guard"}
DROPS = {"model-server-drop-caches-spark-1", "model-server-drop-caches-spark-2"}
WEIGHTS = {"model-download-spark-1", "model-sync-spark-2"}
IMAGE = {"image-obtain-spark-1", "image-sync-spark-2", "image-support-spark-1",
         "image-versions-spark-1", "image-versions-spark-2"}  # fmt: skip
# What a new image replaces: the Ray containers, the server and their steps.
CONTAINERS = {"ray-head-container", "ray-worker-spark-2-container", "model-server-ray-ready",
              "model-server-guard"}  # fmt: skip
REPO = "hellohal2064/vllm-qwen3.5-gb10"
NEW_IMAGE = IMAGE | WEIGHTS | SERVER | DROPS | CONTAINERS | {"image-name-spark-1"}
# The pulumi-command steps (their connection holds the key); the preflight steps are
# NodeSteps, which read the key from the identity file at call time.
COMMANDS_OF_KEY = {
    "image-support-spark-1", "image-versions-spark-1", "image-versions-spark-2",
    "model-server-drop-caches-spark-1", "model-server-drop-caches-spark-2",
}  # fmt: skip

CASES: list[tuple[str, Callable[[dict[str, Any]], None], set[str]]] = [
    # A new key reaches the pulumi-command steps (their connection); no node step re-runs
    # and no container is replaced.
    ("ssh key rotation", _rotate_key, COMMANDS_OF_KEY | {"model-server-health"}),
    ("served_name", _set("model.served_name", "qwen"), SERVER),
    (
        "max_model_len",
        _set("vllm.max_model_len", 4096),
        SERVER | {"model-server-drop-caches-spark-1", "model-server-drop-caches-spark-2"},
    ),
    # Only the readiness wait runs again (the container's healthcheck does not carry it:
    # the provider cannot change a live container's healthcheck).
    ("server_ready_s", _set("timeouts.server_ready_s", 3000), {"model-server-health"}),
    ("ray_ready_s", _set("timeouts.ray_ready_s", 900), set()),
    # The liveness reads' bound: the guard's new read is recorded; nothing runs.
    ("answer_s", _set("timeouts.answer_s", 20), {"model-server-guard"}),
    ("gpu_memory_utilization", _set("vllm.gpu_memory_utilization", 0.7), SERVER | DROPS),
    ("an extra vLLM argument", _set("vllm.extra_args", ["--max-num-seqs", "8"]), SERVER | DROPS),
    ("the API key", _set("api_key", "sk-rotated-2"), SERVER),
    ("node list order", _reverse("nodes"), set()),
    # The hub check, the weights steps and the (read-only) check that the image implements
    # the model's architectures, then the server (its command names the revision).
    (
        "model revision",
        _set("model.revision", "r2"),
        WEIGHTS | SERVER | {"image-support-spark-1", "spark-1-hub-access"},
    ),
    # The image steps and their checks, then every container, in order.
    ("image tag", _set("image.ref", f"{REPO}:v2"), NEW_IMAGE),
    # The digest the running image carries: its steps run again (the local name changes)
    # and the containers keep running it under the name they have: nothing is replaced.
    (
        "image pinned to its digest",
        _set("image.ref", f"{REPO}@sha256:{'d' * 64}"),
        IMAGE | WEIGHTS | {"image-name-spark-1"},
    ),
    # Another digest: another image, so everything built on it.
    ("image pinned to another digest", _set("image.ref", f"{REPO}@sha256:{'b' * 64}"), NEW_IMAGE),
    ("speculative_config order", _reorder_speculative, set()),
    ("roce_hcas order", _reverse("roce_hcas"), set()),
]


@dataclass
class Deployed:
    """The base config deployed once for every case below (its state, its in-memory node,
    its workstation folder), each case starting from a copy: the same start as a deploy
    of its own, without running it again."""

    raw: dict[str, Any]
    backend: Path
    node: Node
    state_dir: Path


@pytest.fixture(scope="module")
def deployed_base(tmp_path_factory: pytest.TempPathFactory) -> Deployed:
    from tests.conftest import stack_file

    work = tmp_path_factory.mktemp("base")
    raw = {**stack_file("spark"), "ssh_private_key": TEST_PRIVATE_KEY}
    raw = base_config(raw, work)
    # An explicit launcher: every preview is exact (tests/test_launcher.py: auto's).
    raw = {**raw, "parallelism": {**raw["parallelism"], "launcher": "ray"}}
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPARKVLLM_STATE_DIR", str(work / "state"))
        stack = Stack(work / "backend", env)
        stack.run("up", raw)
        assert changed(stack.run("up", raw)) == {}, "a second up is a no-op"
    return Deployed(raw, work / "backend", stack.node, work / "state")


@pytest.mark.parametrize(("change", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_preview_equals_up_and_only_what_must_change_changes(
    deployed_base: Deployed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    change: Callable[[dict[str, Any]], None], expected: set[str],
) -> None:  # fmt: skip
    monkeypatch.setenv("SPARKVLLM_STATE_DIR", str(deployed_base.state_dir))
    shutil.copytree(deployed_base.backend, tmp_path / "backend")
    stack = Stack(tmp_path / "backend", monkeypatch)
    stack.node = copy.deepcopy(deployed_base.node)
    base = deployed_base.raw
    # The key as deployed (the key-rotation case writes another into the file).
    Path(base["ssh_private_key_file"]).write_text(TEST_PRIVATE_KEY)
    after = copy.deepcopy(base)
    change(after)
    plan = changed(stack.run("preview", after))
    done = changed(stack.run("up", after))
    assert plan == done, "preview shows what up does"
    assert set(done) <= expected, set(done) - expected
    containers = {n for n in expected if n.endswith("-container")}
    replaced = {n for n, op in done.items() if n.endswith("-container") and op != "update"}
    assert replaced <= containers if expected & SERVER == SERVER else not replaced, replaced
    assert changed(stack.run("up", after)) == {}
    # What the nodes report back agrees with what up left: no change that never converges.
    assert changed(stack.run("preview", after, refresh=True)) == {}


# Keys generated for these tests; they belong to no machine.
OTHER_HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGkOjN3s22+QhA4wz72cIgOQjtSDf/gxKmuP7FkpQ1zc"
JUMP_HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILRN1qemAe0sgfsZ0ahtxAdCCDJ/GfIYJkzKf+7Skuvo"
JUMP = {"host": "10.1.230.1", "user": "bastion", "host_key": JUMP_HOST_KEY}


def _node(index: int, path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(raw: dict[str, Any]) -> None:
        d = raw["nodes"][index]
        *parents, leaf = path.split(".")
        for p in parents:
            d = d[p]
        d[leaf] = value

    return change


def _own_key_file(raw: dict[str, Any]) -> None:
    own = Path(raw["ssh_private_key_file"]).with_name("id_worker")
    own.write_text(TEST_PRIVATE_KEY)
    raw["nodes"][1]["ssh"]["private_key_file"] = str(own)


def _with_jump(raw: dict[str, Any]) -> None:
    raw["ssh_jump"] = dict(JUMP)


def _hf_token(raw: dict[str, Any]) -> None:
    raw["hf_token"] = TEST_HF_TOKEN


Change = Callable[[dict[str, Any]], None]
# How the workstation reaches a node: none of these changes what runs on a node, so none
# replaces a step or a container; what `up` records (an update that runs nothing, or a
# pulumi-command that runs again with the new connection) is exactly what preview showed.
# One exception, on purpose: a node's new ssh port is what the other nodes' link
# preflight tests (a TCP connect to that sshd over the cluster link), so that read-only
# check runs again, and nothing downstream of it.
ACCESS_CASES: list[tuple[str, Change, Change, set[str]]] = [
    ("head host key", lambda raw: None, _node(0, "ssh.host_key", OTHER_HOST_KEY), set()),
    ("worker host key", lambda raw: None, _node(1, "ssh.host_key", OTHER_HOST_KEY), set()),
    ("head ssh user", lambda raw: None, _node(0, "ssh.user", "operator"), set()),
    ("worker ssh user", lambda raw: None, _node(1, "ssh.user", "operator"), set()),
    ("head ssh port", lambda raw: None, _node(0, "ssh.port", 2222), {"spark-2-links"}),
    ("worker ssh port", lambda raw: None, _node(1, "ssh.port", 2222), {"spark-1-links"}),
    ("a node's own key file", lambda raw: None, _own_key_file, set()),
    ("a jump host added", lambda raw: None, _with_jump, set()),
    ("a jump host removed", _with_jump, lambda raw: raw.pop("ssh_jump"), set()),
    ("hf_token added", lambda raw: None, _hf_token, set()),
]


@pytest.mark.parametrize(
    ("before", "change", "rechecked"),
    [c[1:] for c in ACCESS_CASES],
    ids=[c[0] for c in ACCESS_CASES],
)
def test_an_access_change_previews_what_up_does_and_replaces_nothing(
    base: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    before: Change, change: Change, rechecked: set[str],
) -> None:  # fmt: skip
    stack = Stack(tmp_path / "backend", monkeypatch)
    first = copy.deepcopy(base)
    before(first)
    stack.run("up", first)
    after = copy.deepcopy(first)
    change(after)
    plan = changed(stack.run("preview", after))
    done = changed(stack.run("up", after))
    assert plan == done, "preview shows what up does"
    assert {n: op for n, op in done.items() if op != "update"} == dict.fromkeys(
        rechecked, "replace"
    ), done
    assert not any(n.endswith("-container") for n in done), done
    assert changed(stack.run("up", after)) == {}


OLD_LAYOUT_PROGRAM = """
from pathlib import Path

import pulumi

from components.deployment import deploy
from sparkvllm import config_sources
from sparkvllm.workstation import prepare_ssh_access

cfg = config_sources.from_runtime()
stack = pulumi.get_stack()
for key, value in deploy(cfg, stack, prepare_ssh_access(cfg, stack, Path("ROOT"))).items():
    pulumi.export(key, value)
"""


def test_a_stack_made_before_the_cluster_component_changes_nothing(
    base: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parts of a stack deployed when they were top-level resources keep their state
    under SparkVllmCluster (aliases to no parent, inherited by their children): the next
    `up` creates the component and touches nothing on a node."""

    old = tmp_path / "old-project"
    old.mkdir()
    project = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
    project["runtime"]["options"]["virtualenv"] = sys.prefix  # the repo's, from elsewhere
    (old / "Pulumi.yaml").write_text(yaml.safe_dump(project))
    (old / "__main__.py").write_text(OLD_LAYOUT_PROGRAM.replace("ROOT", str(ROOT)))
    stack = Stack(tmp_path / "backend", monkeypatch)
    stack.project_dir = old
    stack.answers = NodeAnswers(load_stack_config(base))
    stack.node.images.setdefault(base["image"]["ref"], "sha256:" + "f" * 64)
    first = run("up", "spark", old, config=base, refresh=False, secret_keys=["api_key"],
                provider_factory=stack.factory, log=lambda _m: None)  # fmt: skip
    assert not first.error, first.error
    assert not any(s.name == "spark-vllm" for s in first.steps)
    calls = len(stack.node.calls)
    plan = changed(stack.run("preview", base))
    done = changed(stack.run("up", base))
    assert plan == done == {"spark-vllm": "create"}
    assert len(stack.node.calls) == calls, stack.node.calls[calls:]
    assert changed(stack.run("up", base)) == {}


def test_a_failed_preflight_is_checked_again_once_the_node_is_fixed(
    base: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The preflight judges each node in its step's create: a failed one records nothing,
    so after the node is fixed (the config unchanged) the next `up` asks it again and
    passes. (Judged in an apply of the program, the failed output stayed recorded and every
    later `up` failed on it until the config changed.)"""
    stack = Stack(tmp_path / "backend", monkeypatch)
    cfg = load_stack_config(base)
    good = NodeAnswers(cfg).stdout_for("spark-2-facts")
    broken = good.replace("netdev_present=1", "netdev_present=0")
    assert broken != good
    original = NodeAnswers.stdout_for

    def node_answers(self: NodeAnswers, name: str) -> str:
        return broken if name == "spark-2-facts" else original(self, name)

    monkeypatch.setattr(NodeAnswers, "stdout_for", node_answers)
    stack.answers = NodeAnswers(cfg)
    stack.node.images.setdefault(base["image"]["ref"], "sha256:" + "f" * 64)
    failed = run("up", "spark", ROOT, config=base, refresh=False, secret_keys=["api_key"],
                 provider_factory=stack.factory, log=lambda _m: None)  # fmt: skip
    assert failed.error and "netdev" in failed.error and "does not exist" in failed.error
    assert not any(s.name.endswith("-container") and s.op != "same" for s in failed.steps)
    monkeypatch.setattr(NodeAnswers, "stdout_for", original)  # the node is fixed
    healed = stack.run("up", base)
    assert changed(healed).get("spark-2-facts") == "create", changed(healed)
    assert changed(stack.run("up", base)) == {}


# `parallelism.launcher: auto` on a stack whose image holds Ray (the mocked image does).
PIN_OWN = f"{REPO}@{NodeAnswers.repo_digest}"  # the registry digest the running image carries
PIN_OTHER = f"{REPO}@sha256:{'b' * 64}"  # a digest of another image
NO_RAY = {**IMAGE_VERSIONS, "ray": ""}


def _assumed(logged: list[str]) -> list[str]:
    return [m for m in logged if "launcher: native assumed" in m]


@pytest.mark.parametrize(
    "change",
    [_set("image.ref", PIN_OWN), _set("image.source", "present")],
    ids=["pinned to its digest", "a new source"],
)
def test_auto_previews_a_new_ref_of_the_running_image_as_up_keeps_it(
    base: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    change: Callable[[dict[str, Any]], None],
) -> None:  # fmt: skip
    """The digest the running image carries (or a new way to obtain it): the obtain step
    runs again, and `up` keeps the Ray cluster and the server (the image-ray step is kept:
    the image-name step, kept, still names the image it read); the preview knows it, so it
    plans exactly that, warning of nothing."""
    stack = Stack(tmp_path / "backend", monkeypatch)
    first = stack.run("up", base)
    assert first.outputs["launcher"]["name"] == "ray"
    after = copy.deepcopy(base)
    change(after)
    stack.logged.clear()
    plan = changed(stack.run("preview", after))
    assert not _assumed(stack.logged), _assumed(stack.logged)
    up = stack.run("up", after)
    done = changed(up)
    assert plan == done, "preview shows what up does"
    assert done.get("image-ray-spark-1") == "update", done
    assert set(done) <= IMAGE | WEIGHTS | {"image-name-spark-1", "image-ray-spark-1"}, done
    assert up.outputs["launcher"]["name"] == "ray", up.outputs["launcher"]
    assert changed(stack.run("up", after)) == {}
    assert changed(stack.run("preview", after, refresh=True)) == {}


@pytest.mark.parametrize("holds_ray", [True, False], ids=["with ray", "without ray"])
def test_auto_cannot_preview_a_pin_of_another_image_and_says_exactly_why(
    base: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, holds_ray: bool
) -> None:
    """Another image's digest: its Ray is read only when `up` obtains it, so the preview
    assumes native and its warning names the ref, that it is new to the head and that `up`
    decides from the image's Ray; `up` then runs what that image holds."""
    stack = Stack(tmp_path / "backend", monkeypatch)
    stack.run("up", base)
    after = copy.deepcopy(base)
    after["image"]["ref"] = PIN_OTHER
    if not holds_ray:
        stack.versions = NO_RAY
    stack.logged.clear()
    plan = changed(stack.run("preview", after))
    [warning] = _assumed(stack.logged)
    assert PIN_OTHER in warning and "new to the head" in warning, warning
    assert "`up` decides from the Ray it holds" in warning, warning
    up = stack.run("up", after)
    assert up.outputs["launcher"]["name"] == ("ray" if holds_ray else "native")
    if not holds_ray:
        assert plan == changed(up), "what the preview assumed is what up found"
    assert changed(stack.run("up", after)) == {}
