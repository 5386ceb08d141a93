"""Container specs of the long-running processes: Ray head, Ray workers, model server.

Pure data: no Pulumi, no I/O. `components/` turns a ContainerSpec into a docker.Container;
the local engine (localengine/) carries out the very same resource inputs.

What a working GB10 cluster needs: host network (Ray, NCCL and vLLM bind the
cluster address), host IPC (NCCL/shared memory), all GPUs, and when RDMA is configured the
/dev/infiniband devices with unlimited memlock and IPC_LOCK (without them NCCL logs
"NET/IB : No device found" and silently uses TCP). The model server is a Ray driver in its
own container: it finds the raylet only when it shares the host PID namespace and Ray's
temp dir with the head container (seen on the sim cluster: otherwise `ray.init` finds no
raylet).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import asdict, dataclass, replace

from sparkvllm.config import HOST_NCCL_ENV, HOST_NCCL_IN_CONTAINER, NodeConfig, StackConfig
from sparkvllm.config.stack import ray_heads
from sparkvllm.specs.environment import HF_HOME, NON_CARRY_OVER, node_env, rdma_enabled
from sparkvllm.specs.health import ANSWER_TIMEOUT_S, answers_check
from sparkvllm.specs.scope import scoped
from sparkvllm.specs.ssh import SshOptions, SshTarget, url_host

LABEL_PREFIX = "ai.sparkvllm"
# Ray's session dir, shared by the head container and the model server (raylet discovery).
RAY_TMP_ON_HOST = "/tmp/sparkvllm-ray"
RAY_TMP_IN_CONTAINER = "/tmp/ray"
# vLLM's engine and its rank-0 worker (an actor in the Ray head container) talk over ZeroMQ
# ipc:// sockets under VLLM_RPC_BASE_PATH: the server and the Ray containers must share it,
# or the engine waits forever in MessageQueue.wait_until_ready (seen on the sim cluster).
VLLM_RPC_ON_HOST = "/tmp/sparkvllm-vllm-rpc"
VLLM_RPC_IN_CONTAINER = "/tmp/vllm-rpc"
VLLM_CONFIG_ROOT = "/root/.config/vllm"
ENGINE_READY_BOUND_S = 4 * 3600  # timeouts.server_ready_s is at most this


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    read_only: bool = False


@dataclass(frozen=True)
class Device:
    host_path: str
    container_path: str
    permissions: str = "rwm"


@dataclass(frozen=True)
class Ulimit:
    name: str
    soft: int
    hard: int


@dataclass(frozen=True)
class Healthcheck:
    test: tuple[str, ...]
    interval_s: int
    timeout_s: int
    start_period_s: int
    retries: int


@dataclass(frozen=True)
class ContainerSpec:
    """Everything docker needs to run one long-running container.

    `secret_env` names variables whose values are secrets the component injects (the spec
    never holds a secret value). `name` is the container's name on its node,
    `resource_name` the docker.Container resource's name in the program.
    """

    name: str
    resource_name: str
    node: str
    role: str
    command: tuple[str, ...]
    env: dict[str, str]
    labels: dict[str, str]
    entrypoint: tuple[str, ...] | None = None
    secret_env: tuple[str, ...] = ()
    mounts: tuple[Mount, ...] = ()
    devices: tuple[Device, ...] = ()
    ulimits: tuple[Ulimit, ...] = ()
    cap_add: tuple[str, ...] = ()
    network_mode: str = "host"
    ipc_mode: str = "host"
    pid_mode: str | None = None
    gpus: str | None = None
    restart: str = "unless-stopped"
    max_retry_count: int | None = None
    healthcheck: Healthcheck | None = None
    stop_timeout_s: int = 30


SPEC_LABEL = f"{LABEL_PREFIX}.spec"
# On the model server: the generation of the Ray membership it started on. Replacing a
# Ray container or restarting a raylet kills vLLM's Ray workers, so the server must be
# replaced too: the membership step re-runs, and its new generation changes this label.
RAY_CLUSTER_LABEL = f"{LABEL_PREFIX}.ray-cluster"
# On the model server: the generation of its guard, which a refresh that finds the server
# stopped or hung replaces, and with it (a label change) the server.
GUARD_LABEL = f"{LABEL_PREFIX}.guard"
# On a Ray worker: the head container it joined. A new head replaces the workers (their
# raylets would otherwise wait on a GCS that is gone).
HEAD_LABEL = f"{LABEL_PREFIX}.ray-head"
# Native launcher. On a worker rank: the rank-0 container it joined (a new rank 0 replaces
# every rank). On rank 0: the worker ranks' guard generations and specs (a rank lost, or a
# rank's new spec, replaces the whole group: vLLM cannot take a rank back).
RANK0_LABEL = f"{LABEL_PREFIX}.rank0"
RANKS_LABEL = f"{LABEL_PREFIX}.ranks"


def spec_digest(spec: ContainerSpec) -> str:
    """A digest of everything the spec asks for (labels aside). Carried as a label, so a
    live container can be compared with what the current config would run."""
    data = asdict(spec)
    data.pop("labels")
    # How the program names the resource is not something docker runs.
    data.pop("resource_name")
    # The healthcheck stays in: the docker provider takes a new one as an in-place update
    # that docker cannot apply to a live container, so refresh would read the old one back
    # forever (resourceDockerContainerUpdate changes restart and resources only). Through
    # this label a new healthcheck replaces the container; its timings are fixed, so only
    # what already replaces the server (port, served name) changes it. A container without
    # one digests as before the healthcheck counted (no churn for the Ray containers).
    if data["healthcheck"] is None:
        data.pop("healthcheck")
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def with_spec_label(spec: ContainerSpec) -> ContainerSpec:
    """`spec` labelled with its own digest (SPEC_LABEL): what the drift check compares."""
    return replace(spec, labels={**spec.labels, SPEC_LABEL: spec_digest(spec)})


def container_name(stack: str, role: str, node: str | None = None) -> str:
    base = f"sparkvllm-{stack}-{role}"
    return f"{base}-{node}" if node else base


def labels(stack: str, role: str, node: str, model: str | None = None) -> dict[str, str]:
    """A container's labels; a named model's parts also carry its name (the model without
    one keeps the labels, so the spec, of a single-model stack's)."""
    return {
        f"{LABEL_PREFIX}.stack": stack,
        f"{LABEL_PREFIX}.role": role,
        f"{LABEL_PREFIX}.node": node,
        **({f"{LABEL_PREFIX}.model": model} if model else {}),
    }


def _common(cfg: StackConfig, node: NodeConfig) -> dict[str, object]:
    """Settings shared by every container on a node: GPUs, RDMA, mounts."""
    rdma = rdma_enabled(node)
    return {
        "gpus": "all" if cfg.accelerator == "nvidia" else None,
        "devices": (Device("/dev/infiniband", "/dev/infiniband"),) if rdma else (),
        "ulimits": (Ulimit("memlock", -1, -1),) if rdma else (),
        "cap_add": ("IPC_LOCK",) if rdma else (),
    }


def _mounts(cfg: StackConfig) -> tuple[Mount, ...]:
    """HF cache (the Ray workers load the weights), Ray's session dir and vLLM's RPC dir."""
    return (
        Mount(cfg.model.hf_cache, HF_HOME),
        Mount(RAY_TMP_ON_HOST, RAY_TMP_IN_CONTAINER),
        Mount(VLLM_RPC_ON_HOST, VLLM_RPC_IN_CONTAINER),
    )


def _env(cfg: StackConfig, node: NodeConfig) -> dict[str, str]:
    return {**node_env(cfg, node), "VLLM_RPC_BASE_PATH": VLLM_RPC_IN_CONTAINER}


def _nccl_mounts(cfg: StackConfig) -> tuple[Mount, ...]:
    """nccl.library host: the node's own library, read-only, where HOST_NCCL_ENV loads it
    from (nothing for the image's: a container as before)."""
    host = cfg.host_nccl
    return (Mount(host, HOST_NCCL_IN_CONTAINER, read_only=True),) if host else ()


def _nccl_env(cfg: StackConfig) -> dict[str, str]:
    return dict(HOST_NCCL_ENV) if cfg.host_nccl else {}


def gcs_address(cfg: StackConfig) -> str:
    """The Ray GCS address on the cluster link (what workers and the server join)."""
    return f"{cfg.head_node.cluster_link.address}:{cfg.ports.ray_gcs}"


def _ray_container(
    cfg: StackConfig, stack: str, node: NodeConfig, role: str, resource: str, args: list[str]
) -> ContainerSpec:
    """`ray start --block ARGS` bound to `node`'s own cluster address, with its own env."""
    cmd = (
        "ray",
        "start",
        "--block",
        *args,
        f"--node-ip-address={node.cluster_link.address}",
        f"--num-gpus={node.gpus}",
        "--disable-usage-stats",
    )
    return with_spec_label(
        ContainerSpec(
            name=container_name(stack, role, None if role == "ray-head" else node.name),
            resource_name=resource,
            node=node.name,
            role=role,
            command=cmd,
            env={**_env(cfg, node), **_nccl_env(cfg)},
            labels=labels(stack, role, node.name),
            mounts=_mounts(cfg) + _nccl_mounts(cfg),
            # The model server (a Ray driver in its own container) finds the raylet by its
            # process: Ray's containers and the server share the host PID namespace.
            pid_mode="host",
            **_common(cfg, node),  # type: ignore[arg-type]
        )
    )


def dashboard_bind(cfg: StackConfig) -> str:
    """Where the Ray dashboard listens: its Jobs API runs any code it is sent, without
    authentication, so only on the cluster link unless the config exposes it."""
    return "0.0.0.0" if cfg.expose_ray_dashboard else str(cfg.head_node.cluster_link.address)


def exposure_warnings(cfg: StackConfig) -> list[str]:
    """What the deployment exposes beyond the cluster link, said at every preview and up."""
    head = cfg.head_node
    out = []
    if cfg.api_key is None and cfg.router is not None:
        out.append(
            f"the router listens on 0.0.0.0:{cfg.router.port} of {head.name} with no api_key: "
            "anyone who reaches that port can use every model; fix: `pulumi config set "
            "--secret api_key $(openssl rand -hex 32)`"
        )
    if cfg.api_key is None:
        for view in map(cfg.for_model, cfg.served):
            out.append(
                f"the OpenAI API listens on 0.0.0.0:{view.ports.api} of {view.head} with no "
                "api_key: anyone who reaches that port can use the model; fix: `pulumi config "
                "set --secret api_key $(openssl rand -hex 32)`"
            )
    rays = ray_heads(cfg)
    if cfg.expose_ray_dashboard and rays:
        out.append(
            f"the Ray dashboard listens on 0.0.0.0:{cfg.ports.ray_dashboard} of {rays[0]} "
            "(expose_ray_dashboard): its Jobs API runs any code it is sent, without "
            "authentication; fix: set expose_ray_dashboard: false and use the "
            "ray_dashboard_tunnel output"
        )
    return out


def dashboard_access(cfg: StackConfig) -> tuple[str, str]:
    """(the dashboard's URL where it listens, the workstation's ssh command that forwards
    local port ports.ray_dashboard to it over the head's ssh)."""
    head = cfg.head_node
    port = cfg.ports.ray_dashboard
    shown = head.ssh.host if cfg.expose_ray_dashboard else dashboard_bind(cfg)
    there = "127.0.0.1" if cfg.expose_ray_dashboard else dashboard_bind(cfg)
    login = SshTarget(head.ssh.user, head.ssh.host, head.ssh.port, SshOptions())
    jump = cfg.jump_for(head)
    # Through the head's jump host when it has one (ssh -J, ProxyJump: user@host:port).
    via = ["-J", f"{jump.user}@{url_host(jump.host)}:{jump.port}"] if jump else []
    forward = ["ssh", "-N", *via, "-L", f"{port}:{there}:{port}", *login.destination()]
    return f"http://{url_host(shown)}:{port}", shlex.join(forward)


def ray_head(cfg: StackConfig, stack: str) -> ContainerSpec:
    """`ray start --head --block` on the head node, bound to its cluster-link address."""
    args = [
        "--head",
        f"--port={cfg.ports.ray_gcs}",
        f"--dashboard-host={dashboard_bind(cfg)}",
        f"--dashboard-port={cfg.ports.ray_dashboard}",
    ]
    node = cfg.head_node
    return _ray_container(cfg, stack, node, "ray-head", "ray-head-container", args)


def ray_worker(cfg: StackConfig, stack: str, node: NodeConfig) -> ContainerSpec:
    """`ray start --block --address=<head>` on a worker, bound to its OWN cluster address.

    Its env carries this node's own interface values; Ray workers spawned here inherit
    them, and NON_CARRY_OVER stops vLLM from overwriting them with the head's.
    """
    join = [f"--address={gcs_address(cfg)}"]
    return _ray_container(cfg, stack, node, "ray-worker", f"ray-worker-{node.name}-container", join)


RAY, NATIVE = "ray", "native"
# Worker ranks of the native launcher: `vllm serve --headless` on each non-head node.
RANK_ROLE = "vllm-rank"


def ranks(cfg: StackConfig) -> list[NodeConfig]:
    """The native launcher's node ranks: the head is rank 0 (it serves the API), the other
    nodes follow in config order."""
    return [cfg.head_node, *cfg.worker_nodes]


def _launcher_args(cfg: StackConfig, launcher: str, node: NodeConfig) -> list[str]:
    """How `vllm serve` spreads its ranks: over Ray, or vLLM's own multi-node launcher (a
    rank per node, meeting at the head's cluster-link address and ports.master)."""
    if launcher == RAY:
        return ["--distributed-executor-backend=ray"]
    rank = [n.name for n in ranks(cfg)].index(node.name)
    return [
        "--distributed-executor-backend=mp",
        f"--nnodes={len(cfg.nodes)}",
        f"--node-rank={rank}",
        f"--master-addr={cfg.head_node.cluster_link.address}",
        f"--master-port={cfg.ports.master}",
        *(["--headless"] if rank else []),
    ]


def vllm_serve_args(
    cfg: StackConfig, launcher: str = RAY, node: NodeConfig | None = None
) -> list[str]:
    """The `vllm serve` argv of `node`'s rank (default: the head's), without the secret API
    key (that is VLLM_API_KEY)."""
    v = cfg.vllm
    m = cfg.model
    args = [
        "vllm",
        "serve",
        m.id,
        f"--revision={m.revision}",
        f"--served-model-name={m.name_for_clients}",
        "--host=0.0.0.0",
        f"--port={cfg.ports.api}",
        f"--tensor-parallel-size={cfg.parallelism.tensor}",
        f"--pipeline-parallel-size={cfg.parallelism.pipeline}",
        *_launcher_args(cfg, launcher, node or cfg.head_node),
        f"--gpu-memory-utilization={v.gpu_memory_utilization}",
    ]
    if v.max_model_len is not None:
        args.append(f"--max-model-len={v.max_model_len}")
    if v.max_num_batched_tokens is not None:
        args.append(f"--max-num-batched-tokens={v.max_num_batched_tokens}")
    if v.dtype != "auto":
        args.append(f"--dtype={v.dtype}")
    if v.kv_cache_dtype != "auto":
        args.append(f"--kv-cache-dtype={v.kv_cache_dtype}")
    if v.load_format != "auto":
        args.append(f"--load-format={v.load_format}")
    if v.enable_prefix_caching:
        args.append("--enable-prefix-caching")
    if v.reasoning_parser:
        args.append(f"--reasoning-parser={v.reasoning_parser}")
    if v.enable_auto_tool_choice:
        args.append("--enable-auto-tool-choice")
    if v.tool_call_parser:
        args.append(f"--tool-call-parser={v.tool_call_parser}")
    if v.speculative_config is not None:
        args.append(
            "--speculative-config="
            + json.dumps(v.speculative_config, separators=(",", ":"), sort_keys=True)
        )
    if v.enable_expert_parallel:
        args.append("--enable-expert-parallel")
    if v.language_model_only:
        args.append("--language-model-only")
    args.extend(v.extra_args)
    return args


# The model server starts at most this many times per boot of its node without once
# answering /health; then it stays down (and says so) until an `up` replaces it.
SERVER_STARTS_BOUND = 3
GAVE_UP = "sparkvllm: the model server failed to start"


def gave_up(container: str) -> str:
    """Bash condition: `container` (the model server) gave up starting (_bounded_starts)."""
    return f"docker logs --tail 5 {container} 2>&1 | grep -qF {shlex.quote(GAVE_UP)}"


# In the container's own layer (its home): a replacement container starts counting afresh.
_STARTS_FILE = "${HOME:-/root}/.sparkvllm/server-starts"


def _bounded_starts(port: int) -> list[str]:
    """Bash: count this container's starts per boot (the kernel's boot_id, so a reboot
    starts afresh); after SERVER_STARTS_BOUND starts that never answered /health, wait
    doing nothing (and say why) instead of starting again. Docker's own retry bound
    (on-failure:N) would keep the server down after a reboot too (a graceful stop exits 0),
    and an unbounded restart loop on unified memory can wedge the host."""
    health = shlex.quote(
        f"import urllib.request as u; u.urlopen('http://127.0.0.1:{port}/health', timeout=5)"
    )
    said = shlex.quote(
        f"{GAVE_UP} {SERVER_STARTS_BOUND} times since this boot; it stays down until the "
        "next `up` replaces it (the lines before say why)"
    )
    return [
        f'starts="{_STARTS_FILE}"; mkdir -p "$(dirname "$starts")"',
        "boot=$(cat /proc/sys/kernel/random/boot_id); was=; n=0",
        'read -r was n < "$starts" 2>/dev/null || true',
        '[ "$was" = "$boot" ] || n=0',
        f'if [ "$n" -ge {SERVER_STARTS_BOUND} ]; then',
        f"  echo {said} >&2",
        # Waits for docker's stop (a TERM ends it at once); PID 1 ignores signals it has
        # no handler for, so a bare `sleep` would hold a stop for the whole grace period.
        "  trap 'exit 0' TERM INT; sleep infinity & wait $!; exit 0",
        "fi",
        'echo "$boot $((n + 1))" > "$starts"',
        # Once it answers, a later crash counts from zero again.
        (
            f"( until python3 -c {health} 2>/dev/null; do sleep 10; done; "
            'echo "$boot 0" > "$starts" ) >/dev/null 2>&1 &'
        ),
    ]


def model_server(cfg: StackConfig, stack: str, launcher: str = RAY) -> ContainerSpec:
    """`vllm serve` TP x PP in its own container on the head node: the Ray driver (launcher
    ray), or rank 0 of vLLM's own launcher, serving the API (native).

    With Ray, the entrypoint writes vLLM's non-carry-over list (so Ray workers keep their
    own NCCL/GLOO/UCX values). It bounds its starts per boot (_bounded_starts), then execs
    `vllm serve`.
    """
    node = cfg.head_node
    ray = launcher == RAY
    non_carry = json.dumps(list(NON_CARRY_OVER))
    script = "\n".join(
        [
            *(
                [
                    (
                        f"mkdir -p {VLLM_CONFIG_ROOT} && printf '%s' {shlex.quote(non_carry)} "
                        f"> {VLLM_CONFIG_ROOT}/ray_non_carry_over_env_vars.json"
                    )
                ]
                if ray
                else []
            ),
            *_bounded_starts(cfg.ports.api),
            f"exec {shlex.join(vllm_serve_args(cfg, launcher))}",
        ]
    )
    env = {
        **(_env(cfg, node) if ray else node_env(cfg, node)),
        **cfg.vllm.env,
        **({"RAY_ADDRESS": gcs_address(cfg), "VLLM_CONFIG_ROOT": VLLM_CONFIG_ROOT} if ray else {}),
        # vLLM's own engine start-up bound is the largest wait budget the config allows, so
        # it never gives up before our readiness wait; a fixed value, because the budget is
        # a property of the wait, and an env change would replace the running server.
        "VLLM_ENGINE_READY_TIMEOUT_S": str(ENGINE_READY_BOUND_S),
        **_nccl_env(cfg),
    }
    # Healthy means it generates: /health stays 200 while the engine is stuck.
    health_test = ("CMD", "python3", "-c", answers_check(cfg.ports.api, cfg.model.name_for_clients))
    return with_spec_label(
        ContainerSpec(
            name=container_name(stack, scoped(cfg, "model-server")),
            resource_name=scoped(cfg, "model-server-container"),
            node=node.name,
            role="model-server",
            entrypoint=("bash", "-c"),
            command=(script,),
            env=env,
            secret_env=("VLLM_API_KEY",) if cfg.api_key else (),
            labels=labels(stack, "model-server", node.name, cfg.model.name),
            mounts=(_mounts(cfg) if ray else (Mount(cfg.model.hf_cache, HF_HOME),))
            + _nccl_mounts(cfg),
            pid_mode="host" if ray else None,
            # Back after a reboot, like the Ray containers; crash loops are bounded by the
            # entrypoint (_bounded_starts), not by docker.
            restart="unless-stopped",
            healthcheck=Healthcheck(
                test=health_test,
                interval_s=60,
                timeout_s=ANSWER_TIMEOUT_S + 15,
                # The largest load the config allows (a first success ends it early): a
                # new wait budget must not change the container.
                start_period_s=ENGINE_READY_BOUND_S,
                retries=3,
            ),
            **_common(cfg, node),  # type: ignore[arg-type]
        )
    )


def vllm_rank(cfg: StackConfig, stack: str, node: NodeConfig) -> ContainerSpec:
    """A worker rank of vLLM's own launcher: `vllm serve --headless` with this node's rank
    and its OWN cluster-link environment (no Ray: nothing carries the head's values over).
    It joins rank 0 at ports.master and retries until rank 0 listens; it serves no API."""
    return with_spec_label(
        ContainerSpec(
            name=container_name(stack, scoped(cfg, "rank"), node.name),
            resource_name=scoped(cfg, f"rank-{node.name}-container"),
            node=node.name,
            role=RANK_ROLE,
            command=tuple(vllm_serve_args(cfg, NATIVE, node)),
            env={**node_env(cfg, node), **cfg.vllm.env, **_nccl_env(cfg)},
            labels=labels(stack, RANK_ROLE, node.name, cfg.model.name),
            mounts=(Mount(cfg.model.hf_cache, HF_HOME), *_nccl_mounts(cfg)),
            **_common(cfg, node),  # type: ignore[arg-type]
        )
    )
