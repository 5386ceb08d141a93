"""Access through a jump host, and a node with a key of its own, on the SIMULATED cluster.

A jump host of the sim's own (sshd in the sim-node image, `Cluster.jump_up`) lets in the
workstation's key and a second key; spark-2 then lets in only that second key (its own,
given as `nodes[1].ssh.private_key_file`), and both nodes refuse ssh from the workstation
directly (an iptables rule against the bridge's gateway). Everything the program does to
reach a node then has to go through the jump with the right key: the drift check, a
refresh (the docker provider's ssh and the NodeSteps' reads), an `up` (pulumi-command's
proxy, as the local engine dials it) and the head's hop to the worker. Node changes are
made and undone with `docker exec` from the host, so the teardown does not depend on them.
"""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sim import stack
from sim.keys import ensure_keypair, public_key_line
from sim.runner import SubprocessRunner
from sim.settings import DEFAULT_SUBNET, REPO_ROOT, StatePaths, gateway_address
from sparkvllm import drift
from sparkvllm.config import load_stack_config
from sparkvllm.remote import run_ssh
from sparkvllm.specs import weights
from sparkvllm.workstation import SshAccess, prepare_ssh_access
from tests.conftest import SimDeployment, sim_log

pytestmark = pytest.mark.sim

WORKER = "spark-2"
GATEWAY = gateway_address(DEFAULT_SUBNET)
REFUSE = ["INPUT", "-p", "tcp", "--dport", "22", "-s", GATEWAY, "-j", "REJECT",
          "--reject-with", "tcp-reset"]  # fmt: skip


def _jump_access(raw: dict[str, Any]) -> SshAccess:
    """The workstation's files for the config behind the jump (every program run rewrites
    them for its own config: prepare them again before using them here)."""
    return prepare_ssh_access(load_stack_config(raw), "sim", REPO_ROOT)


def _node_exec(node: str, *argv: str, check: bool = True) -> str:
    done = subprocess.run(["docker", "exec", f"sparkvllm-sim-{node}", *argv],
                          capture_output=True, text=True, check=check, timeout=60)  # fmt: skip
    return done.stdout


@pytest.fixture(scope="module")
def behind_a_jump(
    sim_deployment: SimDeployment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    d = sim_deployment
    paths = StatePaths.at()
    cluster = stack.cluster(quiet=True)
    worker_key = tmp_path_factory.mktemp("keys") / "spark-2_key"
    ensure_keypair(SubprocessRunner(), worker_key, "spark-2-own-key")
    worker_pub = public_key_line(worker_key.with_suffix(".pub"))
    client_pub = public_key_line(paths.client_public_key)
    address, jump_key = cluster.jump_up([client_pub, worker_pub])
    saved = _node_exec(WORKER, "cat", "/root/.ssh/authorized_keys")
    try:
        _node_exec(
            WORKER, "bash", "-c", f"printf '%s\\n' '{worker_pub}' > /root/.ssh/authorized_keys"
        )
        for n in d.cfg.nodes:
            _node_exec(n.name, "iptables", "-I", *REFUSE)
        raw = copy.deepcopy(stack.stack_raw())
        raw["ssh_jump"] = {"host": address, "user": "root", "host_key": jump_key}
        raw["nodes"][1]["ssh"]["private_key_file"] = str(worker_key)
        yield raw
    finally:
        for n in d.cfg.nodes:
            _node_exec(n.name, "iptables", "-D", *REFUSE, check=False)
        _node_exec(WORKER, "bash", "-c", f"printf '%s' '{saved}' > /root/.ssh/authorized_keys")
        cluster.jump_down()
        # The stack as its own config says (its connections again without the jump).
        # (Without a refresh: the state holds the jump, which is gone.)
        back = stack.engine("up", refresh=False, log=sim_log)
        assert not back.error, back.error
        stack.load()  # the workstation's files as the plain config writes them


def test_the_nodes_answer_only_through_the_jump_host(behind_a_jump: dict[str, Any]) -> None:
    direct = run_ssh(stack.load()[1].targets[WORKER], "true", timeout=60)
    assert direct.returncode != 0, "the rule refuses the workstation's direct ssh"
    access = _jump_access(behind_a_jump)
    for name in ("spark-1", WORKER):
        via = run_ssh(access.targets[name], "hostname", timeout=60)
        assert via.returncode == 0 and via.stdout.strip() == name, via.stderr
    # spark-2 lets in its own key only: the stack's key, through the jump, is refused.
    stack_key = access.node_identity_files["spark-1"]
    from dataclasses import replace

    wrong = access.targets[WORKER]
    wrong = replace(wrong, options=replace(wrong.options, identity=stack_key))
    assert run_ssh(wrong, "true", timeout=60).returncode != 0


def test_an_up_through_the_jump_host_records_the_access_and_touches_no_container(
    behind_a_jump: dict[str, Any],
) -> None:
    """An `up` without a refresh (a refresh reads with the access the state holds: the old
    one; the project refreshes on every up, so `--refresh=false` once): pulumi-command's
    steps run again through the proxy, the docker provider and the NodeSteps record the new
    access; no container changes."""
    raw = behind_a_jump
    found = drift.check(load_stack_config(raw), "sim", _jump_access(raw))
    assert not found, [f.render() for f in found]
    up = stack.engine("up", raw, refresh=False, log=sim_log)
    assert not up.error, up.error
    changes = {s.name: s.op for s in up.steps if s.op != "same"}
    sim_log(f"behind a jump: up did {changes}")
    assert not any(n.endswith("-container") for n in changes), changes
    assert changes and set(changes.values()) == {"update"}, changes


def test_a_refresh_then_reads_every_node_through_the_jump_host(
    behind_a_jump: dict[str, Any],
) -> None:
    raw = behind_a_jump
    preview = stack.engine("preview", raw, refresh=True, log=sim_log)
    assert not preview.error, preview.error
    # Every container (the docker provider's ssh) and every NodeStep read through the
    # jump, nothing on a node changed, and nothing is left to do.
    assert preview.refresh_steps and not [s for s in preview.refresh_steps if s.op != "same"]
    assert not [s for s in preview.steps if s.op != "same"]


def test_the_heads_hop_to_the_worker_uses_the_workers_own_key(
    behind_a_jump: dict[str, Any],
) -> None:
    """The head's copy to the worker authenticates with the worker's own key (sent on
    stdin, as the NodeStep sends its read node's key): the stack's key is refused there."""
    raw = behind_a_jump
    cfg, access = load_stack_config(raw), _jump_access(raw)
    sync = weights.weights_sync(cfg, cfg.worker_nodes[0], access.host_keys.get(WORKER))
    target = access.targets[cfg.head]
    done = run_ssh(target, sync.shell_command, stdin=access.key_of(WORKER), timeout=300)
    assert done.returncode == 0 and "transferred=0" in done.stdout, done.stderr[-1500:]
    refused = run_ssh(target, sync.shell_command, stdin=access.key_of(cfg.head), timeout=300)
    assert refused.returncode != 0 and "cannot ssh to spark-2" in refused.stderr


def test_the_worker_key_file_stays_private(behind_a_jump: dict[str, Any]) -> None:
    access = _jump_access(behind_a_jump)
    own = Path(access.node_identity_files[WORKER])
    assert own.name == f"id.{WORKER}" and own.stat().st_mode & 0o777 == 0o600
