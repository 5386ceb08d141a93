"""Checks before `up` creates anything: free disk space, address collisions."""

from __future__ import annotations

import ipaddress
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from sim.runner import Runner
from sim.settings import NETWORK_NAME

DOCKER = "docker"
GIB = 1024**3
# Measured (README): vllm-sim image ~5 GiB, its tarball about the same, and every node
# loads the image into its own dockerd. Build needs room for the layers being written.
BUILD_NEED_GIB = 10.0
TARBALL_NEED_GIB = 5.0
PER_NODE_NEED_GIB = 6.0


class HostCheckError(RuntimeError):
    """`up` refuses to start; the message names the problem and the fix."""


@dataclass(frozen=True)
class Occupant:
    """Something that already uses an address range: a docker network or a host route."""

    kind: str  # "docker network" | "host route"
    name: str
    subnet: str


def required_gib(nodes: int, images_built: bool, tarball_present: bool) -> float:
    need = PER_NODE_NEED_GIB * nodes
    if not images_built:
        need += BUILD_NEED_GIB
    if not tarball_present:
        need += TARBALL_NEED_GIB
    return need


def check_disk(path: Path, need_gib: float) -> None:
    free_gib = shutil.disk_usage(path).free / GIB
    if free_gib < need_gib:
        raise HostCheckError(
            f"not enough free disk at {path}: {free_gib:.1f} GiB free, the simulation "
            f"needs about {need_gib:.1f} GiB (images, tarball, one image copy per node). "
            "Free some space (e.g. `docker system prune`) or use fewer --nodes."
        )


def collisions(subnet: str, occupants: list[Occupant]) -> list[Occupant]:
    """The occupants whose range overlaps subnet.

    Example:
        collisions("172.28.0.0/24", [Occupant("host route", "eth1", "172.28.0.0/16")])
    """
    wanted = ipaddress.ip_network(subnet)
    hits = []
    for occ in occupants:
        try:
            other = ipaddress.ip_network(occ.subnet, strict=False)
        except ValueError:
            continue
        if other.version == wanted.version and other.overlaps(wanted):
            hits.append(occ)
    return hits


def parse_routes(ip_json: str) -> list[Occupant]:
    """Host routes from `ip -j route show` output (default routes are not ranges)."""
    routes = json.loads(ip_json or "[]")
    return [
        Occupant("host route", f"{r['dst']} dev {r.get('dev', '?')}", r["dst"])
        for r in routes
        if r.get("dst") not in (None, "default")
    ]


def docker_network_occupants(runner: Runner) -> list[Occupant]:
    names = runner.run([DOCKER, "network", "ls", "--format", "{{.Name}}"]).stdout.split()
    if not names:
        return []
    fmt = "{{.Name}}{{range .IPAM.Config}} {{.Subnet}}{{end}}"
    out = runner.run([DOCKER, "network", "inspect", "--format", fmt, *names]).stdout
    occupants = []
    for line in out.splitlines():
        name, *subnets = line.split()
        occupants += [Occupant("docker network", name, s) for s in subnets]
    return occupants


def check_subnet(runner: Runner, subnet: str) -> None:
    """Refuse a subnet that overlaps any docker network or host route."""
    occupants = docker_network_occupants(runner)
    routes = runner.run(["ip", "-j", "route", "show"]).stdout
    hits = collisions(subnet, occupants + parse_routes(routes))
    if hits:
        named = "; ".join(f"{h.kind} {h.name} ({h.subnet})" for h in hits)
        raise HostCheckError(
            f"the simulation subnet {subnet} collides with {named}. Pass a free range with "
            f"`python -m sim up --subnet <cidr>` or remove the other network. (The "
            f"simulation's own network is named {NETWORK_NAME}.)"
        )
