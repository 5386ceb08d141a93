"""The same Python, Ray, vLLM and torch on every node, and whether the workstation's Ray
could talk to the cluster as a Ray Client.

What goes wrong otherwise: a worker whose image differs from the head's (Ray refuses a
raylet of another version; a vLLM mismatch fails deep inside the engine), and a
workstation `ray` that does not match the cluster's. The program itself never uses a Ray
Client: every Ray question is asked inside the head container with the image's own Ray
(`probes/ray_members.py`), so its checks work whatever Ray the workstation has. The
comparison is for operators who attach a Ray Client (`ray.init("ray://head:10001")`),
which needs the same Ray version and the same Python major.minor on both sides (Ray
compares exactly these since ray PR 42760).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from sparkvllm.config import HOST_NCCL_IN_CONTAINER, NodeConfig, StackConfig
from sparkvllm.probes import script
from sparkvllm.specs.commands import CommandSpec
from sparkvllm.specs.output import NodesDisagreeError, last_json

# What must be equal on every node. Python too: Ray pickles across the cluster.
MUST_MATCH = ("python", "ray", "vllm", "torch", "nccl")


def image_versions(cfg: StackConfig, node: NodeConfig) -> CommandSpec:
    """Read the versions inside the image on `node` (a throwaway container, no GPU, no
    network, nothing imported). Prints the probe's JSON line."""
    return CommandSpec(
        name=f"image-versions-{node.name}",
        node=node.name,
        create="docker run --rm -i --network none --entrypoint python3 "
        f"{shlex.quote(cfg.image.local_ref)} -",
        stdin=script("image_versions"),
        timeout_s=300,
    )


# The versions probe's field `launcher: auto` decides on (the step carries it in its ID).
RAY_FIELD = "json:ray"


def image_ray(cfg: StackConfig) -> CommandSpec:
    """The Ray the image holds on the head (the versions probe's `ray`, "" for none): what
    `parallelism.launcher: auto` decides on. It is not read back itself: the head's obtain
    step reads the image's fingerprint back, and an image changed under its tag re-runs
    that step, whose new generation re-runs this one, unless the image-name step, its
    subject, still names the image it read (components/synced_image.py)."""
    return replace(image_versions(cfg, cfg.head_node), name=f"image-ray-{cfg.head}")


def agreed_versions(cfg: StackConfig, stdout_by_node: Mapping[str, str]) -> dict[str, str]:
    """The versions every node agrees on; NodesDisagreeError naming each node's otherwise,
    or when the image lacks vLLM (or Ray, when parallelism.launcher is ray)."""
    reports = {n: last_json(out) for n, out in stdout_by_node.items()}
    problems = []
    no_ray = False
    for node, report in sorted(reports.items()):
        if not report:
            problems.append(f"{node}: the version probe printed nothing usable")
            continue
        ray = any(m.parallelism.launcher == "ray" for m in cfg.served)
        needed = ("ray", "vllm") if ray else ("vllm",)
        for package in needed:
            if not report.get(package):
                problems.append(f"{node}: image {cfg.image.ref} has no {package} installed")
                no_ray = no_ray or package == "ray"
    if problems:
        fix = (
            "set parallelism.launcher to native (vLLM's own multi-node launcher) or auto, or "
            "use an image with Ray (parallelism.launcher is ray)"
            if no_ray
            else "use an image with vLLM"
        )
        raise NodesDisagreeError("image versions: " + "; ".join(problems) + f"; fix: {fix}")
    agreed: dict[str, str] = {}
    for key in MUST_MATCH:
        values = {n: str(r.get(key, "")) for n, r in reports.items()}
        if len(set(values.values())) == 1:
            agreed[key] = values.popitem()[1]
        else:
            detail = ", ".join(f"{n}={v or 'none'}" for n, v in sorted(values.items()))
            problems.append(f"{key}: {detail}")
    if problems:
        raise NodesDisagreeError(
            "versions differ across nodes: "
            + "; ".join(problems)
            + f"; fix: run one image everywhere (remove the other image tagged {cfg.image.ref}"
            " from the odd node and re-run, so the head's copy is streamed there)"
        )
    return agreed


def _release(nccl: str) -> str:
    """ "2.27.3+cuda12.9+pip:nvidia-nccl-cu12" -> "2.27.3"."""
    return nccl.split("+", 1)[0]


def loaded_library(loaded: Sequence[str]) -> str:
    """Which NCCL the server's processes mapped: `host` (the node's own, mounted by
    nccl.library host), `image` (another libnccl: the image's), `both` (two NCCLs in one
    deployment, which can hang each other), or `none` (no process loaded NCCL: a CPU
    engine, as on the simulated cluster without its stand-in)."""
    host = HOST_NCCL_IN_CONTAINER in loaded
    other = any(p != HOST_NCCL_IN_CONTAINER for p in loaded)
    return {(True, True): "both", (True, False): "host", (False, True): "image"}.get(
        (host, other), "none"
    )


def nccl_report(
    image_nccl: str,
    hosts: Mapping[str, str],
    transport: str,
    loaded: Sequence[str] = (),
    wanted: str = "image",
) -> dict[str, Any]:
    """The NCCL in use: the image's library, each host's own, the transport the server's
    log shows, the library files the server's processes mapped (`loaded`, and which one
    that is: `library`), and warnings: a host whose NCCL release differs from the image's
    when the containers run the image's (a container that also picks up the host's
    library runs two NCCLs that can hang each other), and a running library other than
    the one nccl.library asks for (`wanted`)."""
    warnings = [
        f"node {node}: the host's NCCL is {host}, the image's {_release(image_nccl)} "
        f"({image_nccl}); keep the host's libnccl out of the containers (no mount, no "
        "LD_LIBRARY_PATH), or set nccl.library: host to run the host's"
        for node, host in sorted(hosts.items())
        if wanted == "image" and host and image_nccl and _release(host) != _release(image_nccl)
    ]
    library = loaded_library(loaded)
    if wanted == "host" and library not in ("host", "none"):
        warnings.append(
            f"nccl.library is host, but the server's processes loaded {', '.join(loaded)}; "
            "fix: check that nccl.host_path is a readable NCCL library on every node, then "
            "run up again"
        )
    return {"image": image_nccl, "hosts": dict(hosts), "transport": transport,
            "loaded": list(loaded), "library": library, "warnings": warnings}  # fmt: skip


def ray_client_compatibility(cluster: Mapping[str, str], workstation: Mapping[str, str]) -> str:
    """'' when a Ray Client on the workstation could attach to the cluster, else why not.

    `workstation` is {"python": "3.11.7", "ray": "2.60.0" or ""}."""
    ray_here, py_here = workstation.get("ray", ""), workstation.get("python", "")
    if not ray_here:
        return "no ray installed on the workstation (not needed by this program)"
    reasons = []
    if ray_here != cluster.get("ray"):
        reasons.append(f"ray {ray_here} here, {cluster.get('ray')} on the cluster")
    if _minor(py_here) != _minor(cluster.get("python", "")):
        reasons.append(f"python {py_here} here, {cluster.get('python')} on the cluster")
    if not reasons:
        return ""
    return (
        "a Ray Client from this workstation could not attach to the cluster ("
        + "; ".join(reasons)
        + "); this program does not need one (its Ray checks run inside the image). To attach"
        " one, use the image's Ray and Python, e.g. `docker exec` into the Ray head container"
    )


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])
