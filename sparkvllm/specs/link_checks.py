"""What the cluster link carries, measured from the head to each worker (a pure command, a
pure parser, pure rules): the preflight's link-rate steps and the probe drift check.

A slow link looks like a slow model: NCCL at about 3 GB/s until NCCL_IB_HCA names both
PCIe halves of a ConnectX-7 port and the MTU is 9000 (NVIDIA/dgx-spark-playbooks#102), a
ConnectX-7 stuck near 13 Gb/s after boot (dgx-spark-playbooks PR 108). The step moves a
bounded amount of zeros each way (scripts/link_rate.sh: at most SECONDS_EACH seconds and
MAX_BYTES per direction), beside the speed each interface negotiated, and the rules below
turn the figures into warnings that name the link, the rate, the rate expected and the
likely cause with its fix. Nothing here fails a deployment: a slow link still serves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sparkvllm import scripts
from sparkvllm.config import NodeConfig, StackConfig
from sparkvllm.specs.commands import MAX_STREAMS, CommandSpec, peer_env, peer_values
from sparkvllm.specs.output import key_values

# Per direction, at most. On a LAN TCP reaches its rate within milliseconds (a round trip
# is about 0.1 ms), and a fast link ends at MAX_BYTES first: the seconds bound only a slow
# link's measurement.
SECONDS_EACH = 1
MAX_BYTES = 8 << 30  # per direction: 8 GiB (a 200 Gb/s link carries it in 0.35 s)
# A path below this share of the fastest path measured in the same run is slow (the
# others show what this cluster's links carry; a tenth is a fault, not noise).
OF_FASTEST = 0.5
# A rate below this share of the speed both ends negotiated is slow: TCP from one python
# process does not fill a 200 Gb/s link (a tenth of it still does not pass for healthy:
# 13 Gb/s on a 200 Gb/s port), RDMA's own tool nearly does.
OF_NEGOTIATED = {"tcp": 0.1, "rdma": 0.5}
# The drift check: a path below this share of what it carried when it was deployed.
OF_DEPLOYED = 0.5


@dataclass(frozen=True)
class LinkRate:
    """One head-worker link as measured: Gb/s each way over TCP (None: not measured), Gb/s
    of RDMA writes over every HCA pair (None: not measured), each end's negotiated speed
    in Mb/s (None: unknown, e.g. a virtual interface that reports none)."""

    head: str
    worker: str
    out_gbit: float | None  # head -> worker
    in_gbit: float | None  # worker -> head
    rdma_gbit: float | None = None
    head_speed_mbit: int | None = None
    worker_speed_mbit: int | None = None
    streams: int = 0

    def paths(self) -> list[tuple[str, str, float]]:
        """(path, tool, Gb/s) for every figure measured: `head -> worker` and back."""
        out = []
        if self.out_gbit is not None:
            out.append((f"{self.head} -> {self.worker}", "tcp", self.out_gbit))
        if self.in_gbit is not None:
            out.append((f"{self.worker} -> {self.head}", "tcp", self.in_gbit))
        if self.rdma_gbit is not None:
            out.append((f"{self.head} -> {self.worker}", "rdma", self.rdma_gbit))
        return out

    def as_output(self) -> dict[str, object]:
        return {
            "from": self.head,
            "to_gbit": self.out_gbit,
            "from_gbit": self.in_gbit,
            "rdma_gbit": self.rdma_gbit,
            "speed_mbit": {self.head: self.head_speed_mbit, self.worker: self.worker_speed_mbit},
            "how": f"tcp, {self.streams} stream(s), at most {SECONDS_EACH} s and "
            f"{MAX_BYTES >> 30} GiB each way"
            + (", rdma: ib_write_bw" if self.rdma_gbit is not None else ""),
        }


def _number(v: str) -> float | None:
    try:
        return float(v) if v.strip() else None
    except ValueError:
        return None


def _speed(v: str) -> int | None:
    """/sys/class/net/X/speed: Mb/s; -1 or empty when the interface reports none."""
    n = _number(v)
    return int(n) if n is not None and n > 0 else None


def parse_rate(head: str, worker: str, stdout: str) -> LinkRate:
    kv = key_values(stdout)
    return LinkRate(
        head=head,
        worker=worker,
        out_gbit=_number(kv.get("tcp.out.gbit", "")),
        in_gbit=_number(kv.get("tcp.in.gbit", "")),
        rdma_gbit=_number(kv.get("rdma.gbit", "")),
        head_speed_mbit=_speed(kv.get("head.speed_mbit", "")),
        worker_speed_mbit=_speed(kv.get("peer.speed_mbit", "")),
        streams=int(_number(kv.get("tcp.streams", "")) or 0),
    )


def link_rate_script(cfg: StackConfig, worker: NodeConfig) -> scripts.Rendered:
    head = cfg.head_node
    # HCA i of the head writes to HCA i of the worker, both sorted (a port's halves pair up
    # by name; the config's order is not a change).
    return scripts.render(
        "link_rate",
        **peer_values(cfg, worker),
        HEAD_ADDRESS=str(head.cluster_link.address),
        NETDEV=head.cluster_link.netdev,
        PEER_NETDEV=worker.cluster_link.netdev,
        SECONDS_EACH=SECONDS_EACH,
        MAX_BYTES=MAX_BYTES,
        MAX_STREAMS=MAX_STREAMS,
        RATE_PROBE=scripts.Probe("link_rate"),
        HCAS=sorted(head.cluster_link.roce_hcas),
        PEER_HCAS=sorted(worker.cluster_link.roce_hcas),
    )


def link_rate_step(cfg: StackConfig, worker: NodeConfig, host_key: str | None) -> CommandSpec:
    """Measure the link from the head to `worker` (scripts/link_rate.sh), on the head: a
    check (never read back: a refresh moves no payload); its stdin is the SSH key of the
    worker, its user, port and host key come at run time (`peer_env`)."""
    rate = link_rate_script(cfg, worker)
    return CommandSpec(
        name=f"link-rate-{worker.name}",
        node=cfg.head_node.name,
        create=rate.text,
        stdin_secret="ssh_private_key",
        timeout_s=180,
        env=peer_env(worker, host_key),
        defines=rate.identity,
    )


def _mtu(facts: Mapping[str, Any], node: str) -> int:
    netdev = (facts.get(node) or {}).get("netdev") or {}
    try:
        return int(netdev.get("mtu") or 0)
    except (TypeError, ValueError):
        return 0


def likely_causes(
    cfg: StackConfig, rate: LinkRate, tool: str, facts: Mapping[str, Any] | None = None
) -> list[str]:
    """What the facts point at, each with its fix, most likely first; "unknown" with what
    to look at when they point at nothing."""
    causes = []
    speeds = {rate.head: rate.head_speed_mbit, rate.worker: rate.worker_speed_mbit}
    known = {n: s for n, s in speeds.items() if s}
    if len(known) == 2 and len(set(known.values())) == 2:
        slow = min(known, key=lambda n: known[n])
        netdev = next(n.cluster_link.netdev for n in cfg.nodes if n.name == slow)
        causes.append(
            f"the link speed after boot: {slow}'s {netdev} negotiated {known[slow]} Mb/s, the "
            f"other end {max(known.values())} Mb/s; fix: on {slow}, `ethtool {netdev}`, then "
            f"`ip link set {netdev} down && ip link set {netdev} up` (or reseat the cable, or "
            "reboot it)"
        )
    for name in (rate.head, rate.worker):
        node = next(n for n in cfg.nodes if n.name == name)
        mtu = _mtu(facts or {}, name)
        if 0 < mtu < node.cluster_link.expected_mtu:
            causes.append(
                f"the MTU: {name}'s {node.cluster_link.netdev} has {mtu}, expected "
                f"{node.cluster_link.expected_mtu}; fix: set MTU "
                f"{node.cluster_link.expected_mtu} on both ends"
            )
    if tool == "rdma":
        causes.append(
            "a missing HCA twin: NCCL_IB_HCA (cluster_link.roce_hcas) must name both PCIe "
            "halves of the port on each node; fix: add the other half (`ibdev2netdev`)"
        )
    if not causes:
        ends = [n for n in cfg.nodes if n.name in (rate.head, rate.worker)]
        counters = " and ".join(f"`ethtool -S {n.cluster_link.netdev}` on {n.name}" for n in ends)
        causes.append(
            "unknown from the facts (a wrong netdev would have failed the route check); fix: "
            f"look at the cable and transceivers (error counters: {counters}) and at what "
            "else uses the link"
        )
    return causes


def rate_warnings(
    cfg: StackConfig, rates: Mapping[str, LinkRate], facts: Mapping[str, Any] | None = None
) -> list[str]:
    return [text for _worker, text in slow_paths(cfg, rates, facts)]


def slow_paths(
    cfg: StackConfig, rates: Mapping[str, LinkRate], facts: Mapping[str, Any] | None = None
) -> list[tuple[str, str]]:
    """(worker, warning) for every slow path, measured in one run: below half the fastest
    path of the same tool (the others show what this cluster's links carry), or below the
    share of the negotiated speed a healthy link passes (OF_NEGOTIATED)."""
    out = []
    fastest: dict[str, tuple[str, float]] = {}
    for rate in rates.values():
        for path, tool, gbit in rate.paths():
            if tool not in fastest or gbit > fastest[tool][1]:
                fastest[tool] = (path, gbit)
    for rate in rates.values():
        speeds = [s for s in (rate.head_speed_mbit, rate.worker_speed_mbit) if s]
        for path, tool, gbit in rate.paths():
            expected = []
            top_path, top = fastest[tool]
            if gbit < OF_FASTEST * top:
                expected.append(
                    f"{OF_FASTEST * top:.1f} Gb/s (half the fastest path measured, "
                    f"{top_path}: {top:.1f} Gb/s)"
                )
            if speeds and gbit < OF_NEGOTIATED[tool] * min(speeds) / 1000:
                share = OF_NEGOTIATED[tool]
                expected.append(
                    f"{share * min(speeds) / 1000:.1f} Gb/s ({share:g} of the "
                    f"{min(speeds) / 1000:g} Gb/s negotiated)"
                )
            if expected:
                text = (
                    f"link {path} carries {gbit:.1f} Gb/s over {tool}, expected at least "
                    f"{' and '.join(expected)}; likely cause: "
                    f"{'; or '.join(likely_causes(cfg, rate, tool, facts))}"
                )
                out.append((rate.worker, text))
        known = [s for s in (rate.head_speed_mbit, rate.worker_speed_mbit) if s]
        if len(set(known)) == 2 and not any(w == rate.worker for w, _ in out):
            # Each path carries what it measured, but the ends disagree: one came up slow.
            cause = likely_causes(cfg, rate, "tcp", facts)[0]
            out.append((rate.worker, f"link {rate.head} <-> {rate.worker}: {cause}"))
    return out


def rate_drift(
    cfg: StackConfig,
    rates: Mapping[str, LinkRate],
    deployed: Mapping[str, Any],
    facts: Mapping[str, Any] | None = None,
) -> list[tuple[str, str]]:
    """(worker, detail) for every path now below half what it carried when deployed
    (`deployed`: the stack's `links` output, worker -> LinkRate.as_output()), with the
    likely cause and its fix."""
    out = []
    figures = (("to_gbit", "out_gbit", "tcp"), ("from_gbit", "in_gbit", "tcp"),
               ("rdma_gbit", "rdma_gbit", "rdma"))  # fmt: skip
    for worker, rate in rates.items():
        then = deployed.get(worker) or {}
        for key, attr, tool in figures:
            before, now = then.get(key), getattr(rate, attr)
            if not isinstance(before, int | float) or now is None or before <= 0:
                continue
            if now < OF_DEPLOYED * before:
                path = (
                    f"{worker} -> {rate.head}"
                    if key == "from_gbit"
                    else (f"{rate.head} -> {worker}")
                )
                detail = (
                    f"link {path} carries {now:.1f} Gb/s over {tool}, {before:.1f} Gb/s "
                    f"when deployed ({now / before:.0%}); likely cause: "
                    f"{'; or '.join(likely_causes(cfg, rate, tool, facts))}"
                )
                out.append((worker, detail))
    return out


def links_verdict(
    cfg: StackConfig, stdouts: Mapping[str, str], facts: Mapping[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """(the stack's `links` output: worker -> figures, warnings) from the link-rate steps'
    outputs (worker -> stdout) and the nodes' facts outputs."""
    rates = {w: parse_rate(cfg.head, w, out) for w, out in stdouts.items()}
    return {w: r.as_output() for w, r in rates.items()}, rate_warnings(cfg, rates, facts)
