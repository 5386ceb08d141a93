"""Preflight facts of a node: a pure command, a pure parser, pure checks (pyinfra's split).

The command prints `key=value` lines and never fails on a missing tool (a missing tool is a
fact); the checks turn facts into problems that name the node and the fact.

    >>> facts = parse_facts(stdout)
    >>> check_facts(cfg, node, facts)
    []
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from sparkvllm import scripts
from sparkvllm.config import SECRET_FIELDS, NodeConfig, StackConfig
from sparkvllm.config.stack import model_nodes
from sparkvllm.specs.commands import CommandSpec
from sparkvllm.specs.output import key_values

# The Docker API version the node's engine must at least speak (Docker 20.10 = API 1.41).
MIN_DOCKER_API = (1, 41)


def facts_script(cfg: StackConfig, node: NodeConfig) -> scripts.Rendered:
    """The node's facts as key=value lines (scripts/facts.sh: bash, no sudo)."""
    return scripts.render(
        "facts",
        NETDEV=node.cluster_link.netdev,
        HF_CACHE=_hf_cache(cfg, node),
        HOST_NCCL_GLOBS=list(HOST_NCCL_GLOBS),
        NCCL_PATH=cfg.host_nccl or "",
    )


def _hf_cache(cfg: StackConfig, node: NodeConfig) -> str:
    """The HF cache whose free space the facts report: the first model's placed on the
    node (else the first model's)."""
    placed = [m for m in cfg.served if node in model_nodes(cfg, m)]
    return (placed or list(cfg.served))[0].hf_cache


def facts_command(cfg: StackConfig, node: NodeConfig) -> str:
    return facts_script(cfg, node).text


@dataclass(frozen=True)
class NodeFacts:
    arch: str
    kernel: str
    hostname: str
    mem_total_kb: int
    mem_available_kb: int
    docker_version: str
    docker_api: str
    gpu_name: str
    gpu_driver: str
    gpu_count: int
    netdev_present: bool
    netdev_state: str
    netdev_mtu: int
    netdev_addresses: tuple[str, ...]
    netdevs: tuple[str, ...]
    rdma_devices: tuple[str, ...]
    hf_cache_free_kb: int | None
    rdma_pci: tuple[str, ...] = ()  # `hca@pci address`, e.g. rocep1s0f1@0000:01:00.1
    nccl_host: str = ""
    nccl_lib: str = ""  # nccl.library host: the file the configured path resolves to
    nccl_lib_version: str = ""
    raw: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def as_output(self) -> dict[str, object]:
        """The facts as a plain dict for stack outputs."""
        return {
            "arch": self.arch,
            "kernel": self.kernel,
            "hostname": self.hostname,
            "mem_total_gib": round(self.mem_total_kb / 2**20, 1),
            "mem_available_gib": round(self.mem_available_kb / 2**20, 1),
            "docker_version": self.docker_version,
            "gpu": {
                "name": self.gpu_name,
                "driver": self.gpu_driver,
                "count": self.gpu_count,
            },
            "netdev": {
                "state": self.netdev_state,
                "mtu": self.netdev_mtu,
                "addresses": list(self.netdev_addresses),
            },
            "rdma_devices": list(self.rdma_devices),
            "nccl_host": self.nccl_host,
            **(
                {"nccl_library": {"path": self.nccl_lib, "version": self.nccl_lib_version}}
                if self.nccl_lib
                else {}
            ),
            "hf_cache_free_gib": None
            if self.hf_cache_free_kb is None
            else round(self.hf_cache_free_kb / 2**20, 1),
        }


def _int(v: str, default: int = 0) -> int:
    try:
        return int(v.strip())
    except ValueError:
        return default


def _list(v: str) -> tuple[str, ...]:
    return tuple(x for x in v.split(",") if x)


def parse_facts(stdout: str) -> NodeFacts:
    """Parse the facts command's output. Unknown keys are kept in `raw`; missing ones empty."""
    kv = key_values(stdout)
    g = kv.get
    free = g("hf_cache_free_kb", "")
    return NodeFacts(
        arch=g("arch", ""),
        kernel=g("kernel", ""),
        hostname=g("hostname", ""),
        mem_total_kb=_int(g("mem_total_kb", "0")),
        mem_available_kb=_int(g("mem_available_kb", "0")),
        docker_version=g("docker_version", ""),
        docker_api=g("docker_api", ""),
        gpu_name=g("gpu_name", ""),
        gpu_driver=g("gpu_driver", ""),
        gpu_count=_int(g("gpu_count", "0")),
        netdev_present=g("netdev_present") == "1",
        netdev_state=g("netdev_state", ""),
        netdev_mtu=_int(g("netdev_mtu", "0")),
        netdev_addresses=_list(g("netdev_addresses", "")),
        netdevs=_list(g("netdevs", "")),
        rdma_devices=_list(g("rdma_devices", "")),
        rdma_pci=_list(g("rdma_pci", "")),
        hf_cache_free_kb=_int(free) if free else None,
        nccl_host=g("nccl_host", ""),
        nccl_lib=g("nccl_lib", ""),
        nccl_lib_version=g("nccl_lib_version", ""),
        raw=kv,
    )


def _api_tuple(api: str) -> tuple[int, int]:
    major, _, minor = api.partition(".")
    return (_int(major), _int(minor))


HOST_NCCL_GLOBS = (
    "/usr/lib/*-linux-gnu/libnccl.so.*", "/usr/lib/libnccl.so.*",
    "/usr/local/lib/libnccl.so.*", "/usr/local/cuda*/lib*/libnccl.so.*",
)  # fmt: skip


def check_facts(cfg: StackConfig, node: NodeConfig, facts: NodeFacts) -> list[str]:
    """Problems that stop the deployment on this node, each naming node and fact."""
    n = node.name
    link = node.cluster_link
    out: list[str] = []
    if facts.arch != cfg.image.arch:
        out.append(
            f"node {n}: arch is {facts.arch!r} but the image is built for {cfg.image.arch!r}; "
            "fix: use an image for this architecture (image.arch) or the right node"
        )
    if not facts.docker_version:
        out.append(
            f"node {n}: docker is absent or its engine is not running for user "
            f"{node.ssh.user!r}; fix: install Docker Engine, start it, and add the user to "
            "the docker group"
        )
    elif _api_tuple(facts.docker_api) < MIN_DOCKER_API:
        out.append(
            f"node {n}: docker API {facts.docker_api} is older than "
            f"{'.'.join(map(str, MIN_DOCKER_API))}; fix: upgrade Docker Engine to 20.10+"
        )
    if cfg.accelerator == "nvidia" and facts.gpu_count < node.gpus:
        out.append(
            f"node {n}: {facts.gpu_count} GPU(s) visible to nvidia-smi, config says "
            f"{node.gpus}; fix: check the NVIDIA driver (nvidia-smi) or set nodes[].gpus"
        )
    if not facts.netdev_present:
        present = ", ".join(facts.netdevs) or "none"
        out.append(
            f"node {n}: netdev {link.netdev!r} does not exist (present: {present}); fix: set "
            "cluster_link.netdev to the interface holding the cluster address"
        )
    else:
        if facts.netdev_state not in ("up", "unknown"):
            out.append(
                f"node {n}: netdev {link.netdev} is {facts.netdev_state!r}; fix: bring the "
                f"link up (`ip link set {link.netdev} up`, check the cable)"
            )
        if str(link.address) not in facts.netdev_addresses:
            held = ", ".join(facts.netdev_addresses) or "no IPv4 address"
            out.append(
                f"node {n}: netdev {link.netdev} holds {held}, not {link.address}; fix: set "
                "cluster_link.address to the node's address on that interface"
            )
    if cfg.host_nccl and not facts.nccl_lib:
        out.append(
            f"node {n}: nccl.library is host, but there is no NCCL library at "
            f"{cfg.host_nccl}; fix: install it there (DGX OS, Debian: libnccl2), set "
            "nccl.host_path to where it is, or set nccl.library: image"
        )
    if link.roce_hcas:
        missing = [h for h in link.roce_hcas if h not in facts.rdma_devices]
        if missing:
            out.append(
                f"node {n}: RoCE HCA(s) {', '.join(missing)} not found (present: "
                f"{', '.join(facts.rdma_devices) or 'none'}); fix: correct "
                "cluster_link.roce_hcas (see `ibdev2netdev`) or empty it to run without RDMA"
            )
    return out


def hca_twins(rdma_pci: tuple[str, ...]) -> dict[str, list[str]]:
    """HCA -> the other HCAs of the same port: a GB10's ConnectX-7 port shows as two PCIe
    functions in two PCI domains, the same bus, device and function (0000:01:00.1 and
    0002:01:00.1: rocep1s0f1 and roceP2p1s0f1), and NCCL gets the whole link only with both
    in NCCL_IB_HCA (NVIDIA/dgx-spark-playbooks#102)."""
    where: dict[str, str] = {}
    for item in rdma_pci:
        hca, _, pci = item.partition("@")
        if hca and pci.count(":") == 2:
            where[hca] = pci.split(":", 1)[1]  # bus:device.function, without the domain
    return {h: sorted(o for o in where if o != h and where[o] == at) for h, at in where.items()}


def warnings_for(node: NodeConfig, facts: NodeFacts) -> list[str]:
    """Things worth a warning that do not stop the deployment."""
    out = []
    link = node.cluster_link
    if facts.netdev_present and 0 < facts.netdev_mtu < link.expected_mtu:
        out.append(
            f"node {node.name}: netdev {link.netdev} MTU is {facts.netdev_mtu}, expected "
            f"{link.expected_mtu}; NCCL bandwidth suffers without jumbo frames"
        )
    twins = hca_twins(facts.rdma_pci)
    for hca in link.roce_hcas:
        missing = [t for t in twins.get(hca, []) if t not in link.roce_hcas]
        if missing:
            out.append(
                f"node {node.name}: cluster_link.roce_hcas names {hca} but not "
                f"{', '.join(missing)}, the other PCIe half of the same port; NCCL then "
                "carries about half the link; fix: add "
                f"{', '.join(missing)} to cluster_link.roce_hcas"
            )
    return out


class PreflightError(Exception):
    """A node's facts do not fit the config."""


def facts_step(cfg: StackConfig, node: NodeConfig) -> CommandSpec:
    facts = facts_script(cfg, node)
    return CommandSpec(
        name=f"{node.name}-facts", node=node.name, create=facts.text, timeout_s=120,
        defines=facts.identity,
    )  # fmt: skip


def links_step(cfg: StackConfig, node: NodeConfig) -> CommandSpec:
    links = links_script(cfg, node)
    return CommandSpec(
        name=f"{node.name}-links", node=node.name, create=links.text, timeout_s=120,
        defines=links.identity,
    )  # fmt: skip


def public_config(cfg: StackConfig) -> str:
    """`cfg` without its secrets, as JSON text: what a check step's judge carries into the
    state (pickled with the provider). Plain text, so the pickle is the same bytes on
    every run and whatever the hash seed, and an old state does not depend on the layout
    of the config classes (docs/provider-contract.md)."""
    # Keys as the stack file writes them (`model`, not the field's name); the form not
    # used is left out, so a single-model stack's text is what it was before `models`.
    unused = (
        {"models"} if cfg.single_form else {"single_model", "single_parallelism", "single_vllm"}
    )
    data = cfg.model_dump(mode="json", by_alias=True, exclude=SECRET_FIELDS | unused)
    return json.dumps(data, sort_keys=True)


# In place of a secret key the judge never needs (the schema wants one to be named).
_NOT_CARRIED = "(the stack's key: not carried into the state)"


def _judged(cfg: StackConfig | str) -> StackConfig:
    """The config a judge checks against: `public_config`'s text, or (a judge pickled by
    earlier code, still in a deployed stack's state) the config object itself."""
    if isinstance(cfg, StackConfig):
        return cfg
    data = json.loads(cfg)
    if not data.get("ssh_private_key_file"):
        data["ssh_private_key_file"] = _NOT_CARRIED
    return StackConfig.model_validate(data)


def _node(cfg: StackConfig, name: str) -> NodeConfig:
    return next(n for n in cfg.nodes if n.name == name)


def _raise_if(problems: list[str]) -> None:
    if problems:
        raise PreflightError("preflight failed:\n  - " + "\n  - ".join(problems))


def facts_check(public: str | StackConfig, node: str, facts_stdout: str) -> None:
    """The facts step's judgement (components/node_step.py `check`): PreflightError when
    the node does not fit the config (`public_config`'s text)."""
    cfg = _judged(public)
    _raise_if(check_facts(cfg, _node(cfg, node), parse_facts(facts_stdout)))


def links_check(public: str | StackConfig, node: str, links_stdout: str) -> None:
    """The links step's judgement (it runs after the facts step passed)."""
    cfg = _judged(public)
    _raise_if(check_links(cfg, _node(cfg, node), links_stdout)[0])


def verdict(
    cfg: StackConfig, node: NodeConfig, facts_stdout: str, links_stdout: str
) -> tuple[dict[str, object], list[str]]:
    """(the facts as an output, warnings) when the node fits the config, else
    PreflightError listing every problem, each naming the node and the fact."""
    facts = parse_facts(facts_stdout)
    problems = check_facts(cfg, node, facts)
    link_problems, link_warnings = (
        check_links(cfg, node, links_stdout) if facts.netdev_present else ([], [])
    )
    problems += link_problems
    if problems:
        raise PreflightError("preflight failed:\n  - " + "\n  - ".join(problems))
    return facts.as_output(), warnings_for(node, facts) + link_warnings


def links_script(cfg: StackConfig, node: NodeConfig) -> scripts.Rendered:
    """From `node`, for every other node: the route the kernel picks to its cluster address
    (device and source address), a TCP connect to its sshd, and a don't-fragment ping at
    the expected MTU (scripts/links.sh). Prints `peer.<name>.<fact>=value` lines; never
    fails by itself."""
    peers = [p for p in cfg.nodes if p.name != node.name]
    return scripts.render(
        "links",
        PEER_NAMES=[p.name for p in peers],
        PEER_ADDRESSES=[str(p.cluster_link.address) for p in peers],
        PEER_PORTS=[str(p.ssh.port) for p in peers],
        PING_SIZE=node.cluster_link.expected_mtu - 28,  # IPv4 + ICMP headers
    )


def _route_fields(route: str) -> dict[str, str]:
    words = route.split()
    return {words[i]: words[i + 1] for i in range(len(words) - 1) if words[i] in ("dev", "src")}


def check_links(cfg: StackConfig, node: NodeConfig, stdout: str) -> tuple[list[str], list[str]]:
    """(problems, warnings) of `node`'s view of the cluster link."""
    kv = key_values(stdout)
    problems, warns = [], []
    link = node.cluster_link
    for peer in cfg.nodes:
        if peer.name == node.name:
            continue
        key = f"peer.{peer.name}"
        addr = peer.cluster_link.address
        route = _route_fields(kv.get(f"{key}.route", ""))
        if route.get("dev") != link.netdev or route.get("src") != str(link.address):
            problems.append(
                f"node {node.name}: traffic to {peer.name} ({addr}) leaves via "
                f"{route.get('dev', '?')} from {route.get('src', '?')}, not {link.netdev} from "
                f"{link.address}; fix: give {link.netdev} an address in {peer.name}'s subnet "
                "(NCCL and Ray would use the wrong interface)"
            )
        if kv.get(f"{key}.tcp") != "ok":
            problems.append(
                f"node {node.name}: cannot reach {peer.name} at {addr}:{peer.ssh.port} over the "
                "cluster link; fix: check the cable, addresses and firewall on both nodes"
            )
        if kv.get(f"{key}.mtu") == "fail":
            warns.append(
                f"node {node.name}: a {link.expected_mtu}-byte unfragmented packet to "
                f"{peer.name} did not pass; set MTU {link.expected_mtu} on both ends of the link"
            )
    return problems, warns
