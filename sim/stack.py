"""The sim stack end to end without the Pulumi CLI: bring the simulated cluster up, then
apply or destroy the program's `sim` stack with the local executor (sim/executor.py).

    python -m sim apply     # deploy; prints the stack outputs as JSON
    python -m sim destroy   # remove every container of the sim stack from the nodes
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from components.deployment import deploy
from sim.cluster import Cluster
from sim.executor import LocalExecutor, apply_program
from sim.progress import Timer
from sim.runner import SubprocessRunner
from sim.settings import REPO_ROOT, StatePaths
from sparkvllm import remote
from sparkvllm.config import StackConfig, load_stack_config
from sparkvllm.remote import SshTarget, run_ssh
from sparkvllm.specs.containers import LABEL_PREFIX
from sparkvllm.workstation import SshAccess, prepare_ssh_access, stack_file_config

STACK = "sim"


def ensure_up(nodes: int = 2, quiet: bool = False) -> list[dict[str, object]]:
    """Start the simulated cluster if it is not running (idempotent)."""
    return Cluster(SubprocessRunner(), StatePaths.at(), Timer(quiet)).up(nodes)


def stack_raw(stack: str = STACK, root: Path = REPO_ROOT) -> dict[str, Any]:
    return stack_file_config(stack, root)


def load(raw: dict[str, Any] | None = None) -> tuple[StackConfig, SshAccess]:
    cfg = load_stack_config(raw if raw is not None else stack_raw())
    return cfg, prepare_ssh_access(cfg, STACK, REPO_ROOT)


def apply(
    cfg: StackConfig, access: SshAccess, log: Callable[[str], None] = print
) -> tuple[LocalExecutor, dict[str, Any]]:
    """Deploy `cfg` on the sim nodes; returns the executor (for destroy) and the outputs."""
    executor = LocalExecutor(log=log)
    try:
        outputs = apply_program(lambda: deploy(cfg, STACK, access), executor, stack=STACK)
    except BaseException:
        executor.halt()  # no step of this apply keeps running behind the caller
        raise
    return executor, outputs


def node_target(cfg: StackConfig, access: SshAccess, name: str) -> SshTarget:
    node = next(n for n in cfg.nodes if n.name == name)
    return remote.node_target(node, access.identity_file, access.known_hosts_file)


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
    result = run_ssh(node_target(cfg, access, name), command, stdin=stdin, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"{name}: {command}: {result.stderr.strip()[-2000:]}")
    return result.stdout


def our_containers(cfg: StackConfig, access: SshAccess, name: str) -> list[str]:
    """Names of this stack's containers on node `name` (running or not)."""
    label = shlex.quote(f"{LABEL_PREFIX}.stack={STACK}")
    listing = f"docker ps -a --filter label={label} --format '{{{{.Names}}}}'"
    return sorted(run_on(cfg, access, name, listing, timeout=60).split())


def destroy_by_label(cfg: StackConfig, access: SshAccess) -> dict[str, list[str]]:
    """Remove every container of the sim stack from every node (no executor state needed)."""
    removed = {}
    for node in cfg.nodes:
        names = our_containers(cfg, access, node.name)
        if names:
            run_ssh(node_target(cfg, access, node.name), f"docker rm -f {shlex.join(names)}")
        removed[node.name] = names
    return removed


def main_apply() -> int:
    ensure_up()
    cfg, access = load()
    _, outputs = apply(cfg, access)
    print(json.dumps(outputs, indent=2, sort_keys=True, default=str))
    return 0 if outputs.get("health", {}).get("ready") else 1


def main_destroy() -> int:
    cfg, access = load()
    for node, names in destroy_by_label(cfg, access).items():
        print(f"{node}: removed {', '.join(names) or 'nothing'}")
    return 0
