"""The `sim` stack's helpers, for the tests and bench/: bring the simulated cluster up,
run the program's `sim` stack through the local engine (localengine/, state in this
checkout's `.localengine/stacks/spark-vllm/sim.json`, as `python -m localengine up --stack
sim`), and run commands on the simulated nodes over ssh."""

from __future__ import annotations

import copy
import json
import shlex
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from localengine import operations
from localengine.state import StateFile
from sim.nodes import Cluster
from sim.progress import Timer
from sim.runner import SubprocessRunner
from sim.settings import (
    NODE_IMAGES_DIR,
    REPO_ROOT,
    ROUTER_IMAGE_REF,
    SECOND_MODEL_ID,
    SIM_STACK,
    StatePaths,
)
from sparkvllm.config import StackConfig, load_stack_config
from sparkvllm.config_sources import stack_file_raw
from sparkvllm.remote import run_ssh
from sparkvllm.specs.commands import CommandSpec
from sparkvllm.specs.containers import LABEL_PREFIX
from sparkvllm.workstation import SshAccess, prepare_ssh_access

STACK = SIM_STACK


def cluster(quiet: bool = False) -> Cluster:
    return Cluster(SubprocessRunner(), StatePaths.at(), Timer(quiet))


def ensure_up(nodes: int = 2, quiet: bool = False) -> list[dict[str, object]]:
    """Start the simulated cluster if it is not running (idempotent)."""
    return cluster(quiet).up(nodes)


def stack_raw(stack: str = STACK, root: Path = REPO_ROOT) -> dict[str, Any]:
    return stack_file_raw(stack, root)


def stack_raw_over(nodes: int) -> dict[str, Any]:
    """The sim stack's config over the first `nodes` simulated nodes (`python -m sim up
    --nodes N`), tensor-parallel across all of them (the tiny model splits over 1, 2 or 3)."""
    raw = stack_raw()
    table = json.loads(StatePaths.at().nodes_json.read_text())
    if len(table) < nodes:
        raise SystemExit(f"the simulation has {len(table)} nodes; bring it up with --nodes {nodes}")
    template = raw["nodes"][-1]
    raw["nodes"] = []
    for entry in table[:nodes]:
        node = copy.deepcopy(template)
        node["name"] = entry["name"]
        node["ssh"]["host"] = node["cluster_link"]["address"] = entry["address"]
        node["ssh"]["host_key_file"] = f".sim/{entry['name']}.host_key.pub"
        raw["nodes"].append(node)
    raw["parallelism"] = {"tensor": nodes, "pipeline": 1}
    return raw


# The second model of the sim stack as a set (tests/test_sim_models.py, bench --models).
SECOND = "tiny2"


def set_of_two() -> dict[str, Any]:
    """The sim stack as a set: its model unchanged (Ray named: in a set `auto` is native),
    and a second on spark-2 alone, from its own repo in the nodes' caches (SIMULATION: a
    copy of the tiny model's files, sim/settings.py SECOND_MODEL_ID)."""
    raw = stack_raw()
    first = {
        **raw.pop("model"),
        "parallelism": {**raw.pop("parallelism"), "launcher": "ray"},
        "vllm": raw.pop("vllm"),
    }
    second = {
        **{k: first[k] for k in ("revision", "hf_cache", "offline")},
        "id": SECOND_MODEL_ID,
        "name": SECOND,
        "served_name": "tiny-two",
        "nodes": ["spark-2"],
        "ports": {"api": 8001, "master": 29502},
        "parallelism": {"tensor": 1, "launcher": "native"},
        "vllm": {**first["vllm"], "gpu_memory_utilization": 0.3},
    }
    raw["models"] = [first, second]
    raw["router"] = {
        "image": {
            "ref": ROUTER_IMAGE_REF,
            "source": "tarball",
            "tarball": f"{NODE_IMAGES_DIR}/router-sim.tar",
            "arch": "x86_64",
        },
    }
    return raw


def load(raw: dict[str, Any] | None = None) -> tuple[StackConfig, SshAccess]:
    cfg = load_stack_config(raw if raw is not None else stack_raw())
    return cfg, prepare_ssh_access(cfg, STACK, REPO_ROOT)


def engine(
    operation: str,
    raw: dict[str, Any] | None = None,
    *,
    refresh: bool | None = None,
    log: Callable[[str], None] = print,
    replace: frozenset[str] = frozenset(),
) -> operations.Result:
    """One local-engine operation on the sim stack; `raw` is the config to use instead of
    Pulumi.sim.yaml (namespace stripped, as in the file); `replace`: URNs to replace (the
    CLI's --replace)."""
    return operations.run(
        operation, STACK, REPO_ROOT, refresh=refresh, config=raw, log=log, replace_urns=replace
    )


def has_state() -> bool:
    return any(StateFile(REPO_ROOT, STACK).load())


def run_on(
    cfg: StackConfig,
    access: SshAccess,
    name: str,
    command: str,
    *,
    stdin: str | None = None,
    timeout: float = 600,
) -> str:
    """stdout of `command` on node `name`; RuntimeError naming both if it fails."""
    result = run_ssh(access.targets[name], command, stdin=stdin, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"{name}: {command}: {result.stderr.strip()[-2000:]}")
    return result.stdout


def run_spec(cfg: StackConfig, access: SshAccess, spec: CommandSpec) -> str:
    """A step's command on its node as the program runs it (the SSH key on stdin for a
    step that takes it, else the step's own stdin); stdout, or RuntimeError."""
    stdin = access.private_key if spec.stdin_secret == "ssh_private_key" else spec.stdin
    return run_on(cfg, access, spec.node, spec.shell_command, stdin=stdin, timeout=spec.timeout_s)


def our_containers(cfg: StackConfig, access: SshAccess, name: str) -> list[str]:
    """Names of this stack's containers on node `name` (running or not)."""
    label = shlex.quote(f"{LABEL_PREFIX}.stack={STACK}")
    listing = f"docker ps -a --filter label={label} --format '{{{{.Names}}}}'"
    return sorted(run_on(cfg, access, name, listing, timeout=60).split())


@contextmanager
def image_update(cfg: StackConfig, access: SshAccess, layer_bytes: int) -> Iterator[None]:
    """The head's image under the stack's tag gains one layer of `layer_bytes` random
    bytes (an update of the image); the other nodes keep the previous version. After, the
    previous image is under the tag on every node again (checked)."""
    ref = shlex.quote(cfg.image.local_ref)
    image_id = f"docker image inspect --format '{{{{.Id}}}}' {ref}"
    original = run_on(cfg, access, cfg.head, image_id).strip()
    dockerfile = f"FROM {cfg.image.local_ref}\nRUN head -c {layer_bytes} /dev/urandom > /u\n"
    run_on(cfg, access, cfg.head, f"docker build -q -t {ref} - >&2", stdin=dockerfile)
    try:
        yield
    finally:
        for node in cfg.nodes:
            restore = f"docker tag {original} {ref} && docker image prune -f >&2"
            run_on(cfg, access, node.name, restore)
            assert run_on(cfg, access, node.name, image_id).strip() == original
