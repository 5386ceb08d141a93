"""The sim stack end to end without the Pulumi CLI: bring the simulated cluster up, then
run the program's `sim` stack through the local engine (localengine/), with its state in
this checkout (`.pulumi/stacks/spark-vllm/sim.json`, the same as
`python -m localengine up --stack sim`).

    python -m sim apply     # = python -m localengine up --stack sim (after `sim up`)
    python -m sim destroy   # = python -m localengine destroy --stack sim
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localengine import operations
from localengine.state import StateFile
from sim.cluster import Cluster
from sim.progress import Timer
from sim.runner import SubprocessRunner
from sim.settings import REPO_ROOT, StatePaths
from sparkvllm.config import StackConfig, load_stack_config
from sparkvllm.remote import run_ssh
from sparkvllm.specs import ssh
from sparkvllm.specs.containers import LABEL_PREFIX
from sparkvllm.specs.ssh import SshTarget
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


def engine(
    operation: str,
    raw: dict[str, Any] | None = None,
    *,
    refresh: bool | None = None,
    log: Callable[[str], None] = print,
) -> operations.Result:
    """One local-engine operation on the sim stack; `raw` is the config to use instead of
    Pulumi.sim.yaml (namespace stripped, as in the file)."""
    return operations.run(operation, STACK, REPO_ROOT, refresh=refresh, config=raw, log=log)


def has_state() -> bool:
    return any(StateFile(REPO_ROOT, STACK).load())


def node_target(cfg: StackConfig, access: SshAccess, name: str) -> SshTarget:
    node = next(n for n in cfg.nodes if n.name == name)
    return ssh.node_target(node, access.identity_file, access.known_hosts_file)


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
    """Remove every container of the sim stack from every node (no engine state needed)."""
    removed = {}
    for node in cfg.nodes:
        names = our_containers(cfg, access, node.name)
        if names:
            run_ssh(node_target(cfg, access, node.name), f"docker rm -f {shlex.join(names)}")
        removed[node.name] = names
    return removed


def main_apply() -> int:
    from localengine.__main__ import main

    ensure_up()
    if not has_state():
        cfg, access = load()
        destroy_by_label(cfg, access)  # containers no state knows of would block creates
    return main(["up", "--stack", STACK])


def main_destroy() -> int:
    from localengine.__main__ import main

    return main(["destroy", "--stack", STACK])
