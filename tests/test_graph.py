"""The graph under Pulumi's mock runtime: dependencies, parenting, providers, secrets,
outputs, and the rendered container and command inputs, for 2 and 4 nodes."""

from __future__ import annotations

import base64
import json
import shlex
import sys
from pathlib import Path
from typing import Any

import pulumi
import pytest

from sparkvllm.config import StackConfig, load_stack_config
from sparkvllm.workstation import prepare_ssh_access, state_dir_ref
from tests.conftest import ROOT, TEST_API_KEY, TEST_HF_TOKEN, TEST_PRIVATE_KEY
from tests.pulumi_mocks import IMAGE_VERSIONS, NodeAnswers, Run, run_program

CONTAINER = "docker:index/container:Container"
COMMAND = "command:remote:Command"
NODE_STEP = "pulumi-python:dynamic:Resource"


def deployed(raw: dict[str, Any], answers: NodeAnswers | None = None) -> tuple[StackConfig, Run]:
    cfg = load_stack_config(raw)
    access = prepare_ssh_access(cfg, "test", ROOT)
    return cfg, run_program(cfg, access, answers)


def expected_arrows(cfg: StackConfig) -> list[tuple[str, str]]:
    """(later, earlier): every arrow of the design's graph, by resource name."""
    head = cfg.head
    arrows = [
        (f"image-obtain-{head}", f"{head}-facts"),
        ("ray-head-container", f"image-obtain-{head}"),
        ("ray-head-container", f"{head}-facts"),
        (f"image-support-{head}", f"image-obtain-{head}"),
        ("ray-head-container", f"image-support-{head}"),
        (f"image-versions-{head}", f"image-obtain-{head}"),
        ("ray-head-container", f"image-versions-{head}"),
        (f"model-download-{head}", f"image-support-{head}"),
        ("model-server-container", f"model-download-{head}"),
        ("model-server-ray-ready", "ray-head-container"),
        ("model-server-guard", "model-server-ray-ready"),
        ("model-server-container", "model-server-ray-ready"),
        ("model-server-container", "model-server-guard"),
        ("model-server-container", f"image-obtain-{head}"),
        ("model-server-health", "model-server-container"),
    ]
    # Nothing is obtained or downloaded before the head said it can reach the model and
    # how big its weights are (offline: their size in its cache).
    preflight = f"{head}-weights-size" if cfg.model.offline else f"{head}-hub-access"
    arrows += [
        (f"image-obtain-{head}", preflight),
        (f"model-download-{head}", preflight),
    ]
    for n in cfg.worker_nodes:
        w = n.name
        arrows += [
            (f"image-sync-{w}", f"image-obtain-{head}"),
            (f"image-sync-{w}", f"{w}-facts"),
            (f"image-sync-{w}", f"image-support-{head}"),
            (f"image-versions-{w}", f"image-sync-{w}"),
            ("ray-head-container", f"image-versions-{w}"),
            (f"ray-worker-{w}-container", f"image-sync-{w}"),
            (f"ray-worker-{w}-container", f"{w}-facts"),
            (f"ray-worker-{w}-container", "ray-head-container"),
            ("model-server-ray-ready", f"ray-worker-{w}-container"),
            (f"model-sync-{w}", f"model-download-{head}"),
            (f"model-sync-{w}", f"{w}-facts"),
            # The memory plan reads every node before the head obtains anything.
            (f"image-obtain-{head}", f"{w}-facts"),
            ("model-server-container", f"model-sync-{w}"),
        ]
        if len(cfg.worker_nodes) >= 2:
            # The first transfer to several workers is relayed (the image leaves the
            # head once) before each worker's own stream step checks it.
            arrows += [
                ("image-relay", f"image-obtain-{head}"),
                ("image-relay", f"image-support-{head}"),
                ("image-relay", f"{w}-facts"),
                (f"image-sync-{w}", "image-relay"),
            ]
    return arrows


def missing_arrows(cfg: StackConfig, run: Run) -> list[tuple[str, str]]:
    return [(a, b) for a, b in expected_arrows(cfg) if not run.depends(a, b)]


@pytest.fixture(params=[2, 4], ids=["2-nodes", "4-nodes"])
def raw(request: pytest.FixtureRequest, spark_raw: dict[str, Any]) -> dict[str, Any]:
    from tests.conftest import four_node_raw

    return spark_raw if request.param == 2 else four_node_raw(spark_raw)


def test_every_arrow_of_the_graph_is_a_real_dependency(raw: dict[str, Any]) -> None:
    cfg, run = deployed(raw)
    assert missing_arrows(cfg, run) == []
    # The wiring is not accidental: the model check on the head runs before any stream.
    for w in cfg.worker_nodes:
        assert not run.depends(f"image-support-{cfg.head}", f"image-sync-{w.name}")
    # One worker: nothing to relay, no relay step.
    relay = [r for r in run.registrations.values() if r.name == "image-relay"]
    assert len(relay) == (1 if len(cfg.worker_nodes) >= 2 else 0)


@pytest.mark.parametrize(
    "drop",
    # Resources whose explicit depends_on carries an arrow no other path implies.
    [
        "model-server-container",
        "image-obtain-spark-1",
        "image-sync-spark-2",
        "model-download-spark-1",
        "ray-head-container",
    ],
)
def test_dropping_a_dependency_is_caught(
    spark_raw: dict[str, Any], drop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The arrow check can fail: strip one resource's depends_on and it reports it."""
    import components.adapters as adapters

    for fn_name in ("container", "remote_command"):
        original = getattr(adapters, fn_name)

        def stripped(spec: Any, _original: Any = original, **kwargs: Any) -> Any:
            if getattr(spec, "resource_name", spec.name) == drop:
                kwargs["depends_on"] = []
            return _original(spec, **kwargs)

        for module in (
            "components.ray_head",
            "components.ray_worker",
            "components.model_server",
            "components.synced_image",
        ):
            if hasattr(__import__(module, fromlist=[fn_name]), fn_name):
                monkeypatch.setattr(f"{module}.{fn_name}", stripped)
    from components.node_step import NodeStep

    class Stripped(NodeStep):
        def __init__(self, spec: Any, **kwargs: Any) -> None:
            if spec.name == drop and kwargs.get("opts") is not None:
                kwargs["opts"] = pulumi.ResourceOptions(parent=kwargs["opts"].parent)
            super().__init__(spec, **kwargs)

    for module in ("components.synced_image", "components.model_weights",
                   "components.model_server"):  # fmt: skip
        monkeypatch.setattr(f"{module}.NodeStep", Stripped)
    cfg, run = deployed(spark_raw)
    assert any(later == drop for later, _ in missing_arrows(cfg, run))


def test_children_are_parented_to_their_component(spark_raw: dict[str, Any]) -> None:
    _, run = deployed(spark_raw)
    components = {
        r.urn: r.type for r in run.registrations.values() if r.type.startswith("sparkvllm:")
    }
    assert set(components.values()) == {
        "sparkvllm:index:GB10Node",
        "sparkvllm:index:SyncedImage",
        "sparkvllm:index:RayHead",
        "sparkvllm:index:RayWorker",
        "sparkvllm:index:ModelServer",
        "sparkvllm:index:ModelWeights",
        "sparkvllm:index:ClusterLinks",
        "sparkvllm:index:SparkVllmCluster",
    }
    # Every part sits in the one cluster component.
    cluster = next(u for u, t in components.items() if t == "sparkvllm:index:SparkVllmCluster")
    for urn, typ in components.items():
        if urn != cluster:
            assert run.registrations[urn].parent == cluster, typ
    expected_parent = {
        CONTAINER: {
            "sparkvllm:index:RayHead",
            "sparkvllm:index:RayWorker",
            "sparkvllm:index:ModelServer",
        },
        COMMAND: {
            "sparkvllm:index:SyncedImage",
            "sparkvllm:index:ModelWeights",
            "sparkvllm:index:ModelServer",
        },
        NODE_STEP: {
            "sparkvllm:index:GB10Node",  # the preflight: facts, links, the head's hub check
            "sparkvllm:index:ClusterLinks",  # the preflight's link measurements
            "sparkvllm:index:SyncedImage",
            "sparkvllm:index:ModelWeights",
            "sparkvllm:index:ModelServer",
        },
        "pulumi:providers:docker": {"sparkvllm:index:GB10Node"},
    }
    for r in run.registrations.values():
        if r.type in expected_parent:
            assert components.get(r.parent) in expected_parent[r.type], r.name
            # Children are named after their component's resource (name prefix).
            parent_name = run.registrations[r.parent].name
            assert r.name.startswith(parent_name), (r.name, parent_name)


def test_containers_and_images_use_their_own_nodes_docker(raw: dict[str, Any]) -> None:
    cfg, run = deployed(raw)
    for r in run.of_type(CONTAINER):
        node = {lb["label"]: lb["value"] for lb in r.state["labels"]}["ai.sparkvllm.node"]
        assert r.state["image"] == cfg.image.ref  # known in every preview
        provider_urn = r.provider.rsplit("::", 1)[0]
        assert provider_urn.endswith(f"::{node}-docker"), (r.name, r.provider)
    providers = {r.name: r.state for r in run.of_type("pulumi:providers:docker")}
    for n in cfg.nodes:
        p = providers[f"{n.name}-docker"]
        assert p["host"] == f"ssh://{n.ssh.user}@{n.ssh.host}:22"
        assert "StrictHostKeyChecking=yes" in p["sshOpts"]


def test_fixed_name_containers_are_deleted_before_replacement(spark_raw: dict[str, Any]) -> None:
    _, run = deployed(spark_raw)
    for r in run.of_type(CONTAINER):
        assert r.delete_before_replace, r.name


def test_long_waits_have_bounded_timeouts(spark_raw: dict[str, Any]) -> None:
    cfg, run = deployed(spark_raw)
    health = run.by_name("model-server-health")
    assert health.create_timeout == f"{cfg.timeouts.server_ready_s + 300}s"
    inner = shlex.split(health.state["create"])[2]  # bash -c SCRIPT
    assert f"readonly BUDGET='{cfg.timeouts.server_ready_s}'" in inner
    assert health.state["create"].startswith("bash -c ")
    # The Ray wait takes its budget at run time (a new budget is not a new step).
    ray_ready = run.by_name("model-server-ray-ready")
    assert 'probe_loop "${WAIT_S:?the wait budget}"' in ray_ready.state["create"]
    assert ray_ready.plain("wait_s") == cfg.timeouts.ray_ready_s
    assert str(cfg.timeouts.ray_ready_s) not in ray_ready.state["create"]


def _env(r: Any) -> dict[str, str]:
    return dict(e.split("=", 1) for e in r.plain("envs"))


def test_every_node_gets_its_own_network_env(raw: dict[str, Any]) -> None:
    cfg, run = deployed(raw)
    for n in cfg.nodes:
        name = "ray-head-container" if n.name == cfg.head else f"ray-worker-{n.name}-container"
        env = _env(run.by_name(name))
        ip = str(n.cluster_link.address)
        assert env["VLLM_HOST_IP"] == env["RAY_OVERRIDE_NODE_IP_ADDRESS"] == ip
        for var in (
            "NCCL_SOCKET_IFNAME",
            "GLOO_SOCKET_IFNAME",
            "TP_SOCKET_IFNAME",
            "UCX_NET_DEVICES",
        ):
            assert env[var] == n.cluster_link.netdev, (n.name, var)
        assert env["NCCL_IB_HCA"] == ",".join(sorted(n.cluster_link.roce_hcas))
        assert env["RAY_memory_monitor_refresh_ms"] == "0"
        cmd = run.by_name(name).state["command"]
        assert f"--node-ip-address={ip}" in cmd
    # The server (the Ray driver) tells vLLM not to copy these head values to workers.
    server = run.by_name("model-server-container")
    script = server.state["command"][0]
    for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "VLLM_HOST_IP", "NCCL_IB_HCA"):
        assert f'"{var}"' in script.split("ray_non_carry_over_env_vars.json")[0]


def test_containers_carry_what_a_gb10_cluster_needs(spark_raw: dict[str, Any]) -> None:
    cfg, run = deployed(spark_raw)
    for r in run.of_type(CONTAINER):
        s = r.state
        assert s["networkMode"] == "host" and s["ipcMode"] == "host"
        assert s["gpus"] == "all"
        assert s["devices"] == [
            {
                "hostPath": "/dev/infiniband",
                "containerPath": "/dev/infiniband",
                "permissions": "rwm",
            }
        ]
        assert s["ulimits"] == [{"name": "memlock", "soft": -1, "hard": -1}]
        assert s["capabilities"] == {"adds": ["IPC_LOCK"]}
        assert {
            "hostPath": cfg.model.hf_cache,
            "containerPath": "/root/.cache/huggingface",
            "readOnly": False,
        } in s["volumes"]
        assert s["mustRun"] is True
    server = run.by_name("model-server-container").state
    assert server["pidMode"] == "host"  # the driver finds the raylet (Ray's session dir too)
    assert "--tensor-parallel-size=2" in server["command"][0]
    assert "--distributed-executor-backend=ray" in server["command"][0]


def test_without_rdma_no_devices_and_ib_disabled(spark_raw: dict[str, Any]) -> None:
    for n in spark_raw["nodes"]:
        n["cluster_link"]["roce_hcas"] = []
    _, run = deployed(spark_raw)
    for r in run.of_type(CONTAINER):
        assert r.state.get("devices") in (None, [])
        assert _env(r)["NCCL_IB_DISABLE"] == "1"
        assert "NCCL_IB_HCA" not in _env(r)


def test_secrets_stay_secret(spark_raw: dict[str, Any]) -> None:
    spark_raw["api_key"] = TEST_API_KEY
    spark_raw["hf_token"] = TEST_HF_TOKEN
    _, run = deployed(spark_raw)
    dumped = json.dumps(run.outputs, default=str)
    assert TEST_PRIVATE_KEY.splitlines()[1] not in dumped
    assert TEST_API_KEY not in dumped and TEST_HF_TOKEN not in dumped
    for r in run.of_type(COMMAND):
        assert r.secret_input("connection"), r.name  # holds the private key
        assert TEST_PRIVATE_KEY.splitlines()[1] not in r.state["create"]
    # NodeSteps carry no key at all: the node-to-node key is read from the identity file
    # at call time and sent on stdin.
    for r in run.of_type(NODE_STEP):
        assert TEST_PRIVATE_KEY.splitlines()[1] not in json.dumps(r.state, default=str), r.name
    assert run.by_name("image-sync-spark-2").plain("stdin_identity") is True
    # The hf_token: the head's hub check and the weights download (NodeSteps) name the
    # 0600 file the workstation wrote, never the token; no input holds it.
    token_file = f"{state_dir_ref('test')}/hf_token"
    for name in ("spark-1-hub-access", "model-download-spark-1"):
        assert run.by_name(name).plain("stdin_file") == token_file, name
    assert oct(Path(token_file).expanduser().stat().st_mode)[-3:] == "600"
    assert Path(token_file).expanduser().read_text().strip() == TEST_HF_TOKEN
    for r in run.registrations.values():
        assert TEST_HF_TOKEN not in json.dumps(r.state, default=str), r.name
    # Nor the providers pickled into the state (the preflight judges carry the config).
    for r in run.of_type(NODE_STEP):
        blob = base64.b64decode(str(r.plain("__provider")))
        for secret in (TEST_HF_TOKEN, TEST_API_KEY, TEST_PRIVATE_KEY.splitlines()[1]):
            assert secret.encode() not in blob, (r.name, secret)
    facts = base64.b64decode(str(run.by_name("spark-1-facts").plain("__provider")))
    assert b"spark-1" in facts  # the judge and its config are in there
    download = run.by_name("model-download-spark-1")
    # Handed to the download's container by name (`-e HF_TOKEN`), never as a value.
    create = download.plain("create")
    assert "readonly TOKEN='1'" in create and "hub_env+=(-e HF_TOKEN)" in create
    assert "HF_TOKEN=" not in create
    server = run.by_name("model-server-container")
    assert server.secret_input("envs")
    assert f"VLLM_API_KEY={TEST_API_KEY}" in server.plain("envs")
    assert "--api-key" not in json.dumps(server.state["command"])
    for r in run.of_type(CONTAINER):
        if r.name != "model-server-container":
            assert not any(TEST_API_KEY in e for e in r.plain("envs"))


def test_outputs_endpoint_health_and_operator_facts(raw: dict[str, Any]) -> None:
    cfg, run = deployed(raw)
    out = run.outputs
    assert out["endpoint"] == "http://10.1.230.180:8000/v1"
    assert out["health"]["ready"] is True
    assert out["health"]["models"] == ["qwen3.5-122b"]
    assert out["health"]["ray"]["nodes"] == len(cfg.nodes)
    assert out["health"]["ray"]["gpus"] == cfg.total_gpus
    # The dashboard (its Jobs API runs any code) listens on the cluster link only; the
    # workstation reaches it through an ssh port forward to the head.
    assert out["ray_dashboard"] == "http://192.168.100.10:8265"
    assert out["ray_dashboard_tunnel"] == (
        "ssh -N -L 8265:192.168.100.10:8265 -p 22 -l aurora -- 10.1.230.180"
    )
    assert set(out["nodes"]) == {n.name for n in cfg.nodes}
    assert out["nodes"]["spark-1"]["gpu"]["name"] == "NVIDIA GB10"
    assert out["image"]["fingerprint"] == "f" * 64


def test_preflight_mismatch_stops_the_deployment(spark_raw: dict[str, Any]) -> None:
    cfg = load_stack_config(spark_raw)
    answers = NodeAnswers(cfg)
    answers.overrides["spark-2-facts"] = answers.stdout_for("spark-2-facts").replace(
        "arch=aarch64", "arch=x86_64"
    )
    with pytest.raises(Exception, match=r"node spark-2: arch is 'x86_64'"):
        run_program(cfg, prepare_ssh_access(cfg, "test", ROOT), answers)


def test_differing_images_across_nodes_fail(spark_raw: dict[str, Any]) -> None:
    cfg = load_stack_config(spark_raw)
    answers = NodeAnswers(cfg, fingerprint=lambda node: ("a" if node == "spark-1" else "b") * 64)
    with pytest.raises(
        Exception, match="image differs across nodes: spark-1=aaaaaaaaaaaa, spark-2=bbbbbbbbbbbb"
    ):
        run_program(cfg, prepare_ssh_access(cfg, "test", ROOT), answers)


def test_workstation_files_for_docker_ssh(spark_raw: dict[str, Any], tmp_path: Path) -> None:
    cfg = load_stack_config(spark_raw)
    access = prepare_ssh_access(cfg, "test", ROOT)
    ident = Path(access.identity_file)
    assert ident.read_text() == TEST_PRIVATE_KEY
    assert ident.stat().st_mode & 0o777 == 0o600
    kh = Path(access.known_hosts_file).read_text().splitlines()
    assert kh[0].startswith("10.1.230.180 ssh-ed25519 AAAA")
    assert len(kh) == 2
    # ssh's connection-sharing sockets live in the stack's own 0700 directory, not /tmp.
    state = Path(access.control_dir_ref).expanduser()
    assert state.stat().st_mode & 0o777 == 0o700
    reach = access.reaches[cfg.nodes[0].name]
    opts = reach.docker_ssh_opts("kh", access.control_dir_ref)
    assert f"ControlPath={access.control_dir_ref}/{reach.control_name()}" in opts


def test_an_image_without_the_model_stops_before_any_container(spark_raw: dict[str, Any]) -> None:
    cfg = load_stack_config(spark_raw)
    answers = NodeAnswers(cfg)
    answers.overrides["image-support-spark-1"] = json.dumps(
        {
            "vllm_found": True,
            "vllm_version": "0.16.0",
            "support": {},
            "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        }
    )
    created = _record_creations(answers)
    with pytest.raises(Exception, match=r"has vLLM 0.16.0, which does not implement Qwen3_5Moe"):
        run_program(cfg, prepare_ssh_access(cfg, "test", ROOT), answers)
    assert CONTAINER not in {typ for typ, _ in created}
    # Found on the head before the image is streamed anywhere or weights are fetched.
    assert not [
        name
        for _, name in created
        if name.startswith(("image-sync-", "model-download-", "model-sync-"))
    ]


def _record_creations(answers: NodeAnswers) -> list[tuple[str, str]]:
    """(type, name) of every resource the mocks create, in order."""
    created: list[tuple[str, str]] = []
    original = answers.new_resource

    def recording(args: Any) -> Any:
        created.append((args.typ, args.name))
        return original(args)

    answers.new_resource = recording  # type: ignore[method-assign]
    return created


def test_versions_that_differ_across_nodes_stop_before_any_container(
    spark_raw: dict[str, Any],
) -> None:
    cfg = load_stack_config(spark_raw)
    answers = NodeAnswers(
        cfg,
        versions=lambda node: {
            **IMAGE_VERSIONS,
            "ray": "2.54.0" if node == "spark-2" else "2.60.0",
        },
    )
    created = _record_creations(answers)
    with pytest.raises(Exception, match=r"ray: spark-1=2\.60\.0, spark-2=2\.54\.0"):
        run_program(cfg, prepare_ssh_access(cfg, "test", ROOT), answers)
    assert CONTAINER not in {typ for typ, _ in created}
    assert ("command:remote:Command", "image-versions-spark-2") in created


def test_ray_client_output_compares_the_workstation_with_the_cluster(
    spark_raw: dict[str, Any],
) -> None:
    import platform

    _, run = deployed(spark_raw)
    assert run.outputs["image"]["versions"] == IMAGE_VERSIONS
    client = run.outputs["ray_client"]
    assert client["workstation"]["python"] == platform.python_version()
    # A cluster on another Python than this one (whichever this is): no Ray Client.
    other = {**IMAGE_VERSIONS, "python": "3.99.1"}
    cfg = load_stack_config(spark_raw)
    _, run = deployed(spark_raw, NodeAnswers(cfg, versions=lambda _node: dict(other)))
    client = run.outputs["ray_client"]
    assert client["compatible"] is False
    assert f"python {platform.python_version()} here" in client["detail"]
    assert "3.99.1 on the cluster" in client["detail"]


def test_weights_that_differ_across_nodes_fail(spark_raw: dict[str, Any]) -> None:
    cfg = load_stack_config(spark_raw)
    answers = NodeAnswers(
        cfg, manifest=lambda parts: ("a" if "spark-1" in "-".join(parts) else "b") * 64
    )
    with pytest.raises(Exception, match="model weights differ across nodes: spark-1=aaaaaaaaaaaa"):
        run_program(cfg, prepare_ssh_access(cfg, "test", ROOT), answers)


def test_page_cache_is_dropped_on_every_node_right_before_the_server(
    spark_raw: dict[str, Any],
) -> None:
    spark_raw["drop_page_cache"] = True
    cfg, run = deployed(spark_raw)
    for n in cfg.nodes:
        drop = f"model-server-drop-caches-{n.name}"
        assert run.depends("model-server-container", drop)
        assert run.depends(drop, "model-server-ray-ready")
        assert run.by_name(drop).state["connection"]  # runs on its own node
    spark_raw["drop_page_cache"] = False
    _, run = deployed(spark_raw)
    assert not [r for r in run.registrations.values() if "drop-caches" in r.name]


def test_server_is_bound_to_the_ray_membership_and_its_guard(spark_raw: dict[str, Any]) -> None:
    """The server carries the generations of the Ray membership step and of its guard (a
    new generation, i.e. either step re-ran, replaces it); a worker carries its head's ID."""
    import hashlib

    from sparkvllm.specs.containers import GUARD_LABEL, HEAD_LABEL, RAY_CLUSTER_LABEL

    _, run = deployed(spark_raw)

    def gen(name: str) -> str:  # the mock's generation for a NodeStep
        return hashlib.sha256(name.encode()).hexdigest()[:16]

    server = run.by_name("model-server-container")
    labels = {lb["label"]: lb["value"] for lb in server.plain("labels")}
    assert labels[RAY_CLUSTER_LABEL] == gen("model-server-ray-ready")
    assert labels[GUARD_LABEL] == gen("model-server-guard")
    ray_ready = run.by_name("model-server-ray-ready")
    head_id = f"ray-head-container-{hashlib.sha256(b'ray-head-container').hexdigest()[:12]}"
    assert head_id in ray_ready.plain("triggers")
    worker = run.by_name("ray-worker-spark-2-container")
    assert {lb["label"]: lb["value"] for lb in worker.plain("labels")}[HEAD_LABEL] == head_id


def test_model_outputs(spark_raw: dict[str, Any]) -> None:
    _, run = deployed(spark_raw)
    model = run.outputs["model"]
    assert model["id"] == "Qwen/Qwen3.5-122B-A10B-FP8"
    assert model["support"]["vllm_version"] == "0.17.1rc1.dev25"
    assert model["weights_manifest"] == "e" * 64


def test_every_resource_is_named_by_its_spec(spark4_raw: dict[str, Any]) -> None:
    """One name per step: each command, node step and container the program registers is
    named by a spec of the plans (sparkvllm/specs/plans.py); no component names one itself."""
    import dataclasses

    from sparkvllm.specs import plans
    from sparkvllm.specs.commands import CommandSpec
    from sparkvllm.specs.containers import ContainerSpec

    cfg, run = deployed(spark4_raw)
    access = prepare_ssh_access(cfg, "test", ROOT)
    built: list[Any] = [
        *(
            plans.node(cfg, n, reach=access.reaches[n.name], known_hosts_ref="",
                       control_dir_ref="")
            for n in cfg.nodes
        ),
        plans.links(cfg, access.host_keys),
        plans.image(cfg, access.host_keys),
        plans.model_weights(cfg, access.host_keys),
        plans.ray_head(cfg, "test"),
        *(plans.ray_worker(cfg, "test", n) for n in cfg.worker_nodes),
        plans.model_server(cfg, "test"),
    ]  # fmt: skip

    def specs(value: Any) -> list[Any]:
        if isinstance(value, CommandSpec | ContainerSpec):
            return [value]
        if isinstance(value, dict):
            return [s for v in value.values() for s in specs(v)]
        if isinstance(value, tuple):
            return [s for v in value for s in specs(v)]
        return []

    names = {
        s.name if isinstance(s, CommandSpec) else s.resource_name
        for plan in built
        for f in dataclasses.fields(plan)
        for s in specs(getattr(plan, f.name))
    }
    registered = {r.name for r in run.registrations.values()
                  if r.type in (CONTAINER, COMMAND, NODE_STEP)}  # fmt: skip
    assert registered == names
    # Components are named by their plans too.
    parts = [
        r
        for r in run.registrations.values()
        if r.type.startswith("sparkvllm:") and r.type != plans.CLUSTER_TYPE
    ]
    assert {r.name for r in parts} == {p.name for p in built}
    assert {r.type for r in parts} == {type(p).TYPE for p in built}


def test_components_take_plans_not_the_config() -> None:
    """A component's Args carry what it adapts (its plan, the resources it builds on),
    never the StackConfig or a NodeConfig to re-derive things from."""
    import dataclasses
    import typing

    from components import (
        cluster_link,
        gb10_node,
        model_server,
        model_weights,
        ray_head,
        ray_worker,
        synced_image,
    )

    args = [
        cluster_link.ClusterLinksArgs,
        gb10_node.GB10NodeArgs,
        synced_image.SyncedImageArgs,
        model_weights.ModelWeightsArgs,
        ray_head.RayHeadArgs,
        ray_worker.RayWorkerArgs,
        model_server.ModelServerArgs,
    ]
    for cls in args:
        hints = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
        fields = {f.name: str(hints[f.name]) for f in dataclasses.fields(cls)}
        assert "plan" in fields, cls
        assert not any("StackConfig" in t or "NodeConfig" in t for t in fields.values()), fields


def test_outputs_are_the_documented_contract(spark_raw: dict[str, Any]) -> None:
    """docs/outputs.md lists exactly the outputs the program exports, and none is secret."""
    import re

    doc = (ROOT / "docs" / "outputs.md").read_text()
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", doc, re.M))
    _, run = deployed(spark_raw)
    # `models` is a set's only, `router` a router's (docs/models.md); a single-model stack
    # exports the others.
    assert set(run.outputs) == documented - {"models", "router"}
    from tests.test_models_config import ROUTER, two_models

    _, of_a_set = deployed({**two_models(spark_raw), "router": ROUTER})
    assert set(of_a_set.outputs) == documented
    for outputs in (run.outputs, of_a_set.outputs):
        text = json.dumps(outputs, default=str)
        assert "[secret]" not in text and TEST_PRIVATE_KEY not in text


def test_nccl_output_names_a_host_whose_nccl_differs(spark_raw: dict[str, Any]) -> None:
    """The image's NCCL, each host's, the transport; a warning names the odd host."""
    cfg = load_stack_config(spark_raw)
    answers = NodeAnswers(cfg)
    from tests.pulumi_mocks import healthy_facts

    odd = healthy_facts(cfg, cfg.nodes[1]).replace("nccl_host=2.27.3", "nccl_host=2.21.5")
    answers.overrides[f"{cfg.nodes[1].name}-facts"] = odd
    _, run = deployed(spark_raw, answers)
    nccl = run.outputs["nccl"]
    assert nccl["image"] == "2.27.3+pip:nvidia-nccl-cu12"
    assert nccl["hosts"] == {"spark-1": "2.27.3", "spark-2": "2.21.5"}
    (warning,) = nccl["warnings"]
    assert warning.startswith("node spark-2: the host's NCCL is 2.21.5, the image's 2.27.3")
    _, same = deployed(spark_raw)
    assert same.outputs["nccl"]["warnings"] == []
