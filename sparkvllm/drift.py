"""Drift check: compare the running cluster with the stack config, node by node.

    python -m sparkvllm.drift --stack spark

Complements `pulumi preview --refresh --expect-no-changes` (which compares Pulumi's state
and the program with what the providers read back) with what they cannot see; see
sparkvllm/specs/drift.py. Exit status: 0 no drift, 1 drift (one line per finding, naming
the node), 2 the config is invalid.

Config: read through the Pulumi CLI (`pulumi config --json --show-secrets`) when it is
installed, else from Pulumi.<stack>.yaml (secrets then come from ssh_private_key_file).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from sparkvllm.config import (
    ConfigError,
    StackConfig,
    load_stack_config,
    parse_pulumi_config,
)
from sparkvllm.remote import run_ssh
from sparkvllm.specs import drift
from sparkvllm.specs.ssh import node_target
from sparkvllm.workstation import SshAccess, prepare_ssh_access, stack_file_config

ROOT = Path(__file__).resolve().parent.parent
Runner = Callable[..., subprocess.CompletedProcess[str]]


def read_live(
    cfg: StackConfig, stack: str, access: SshAccess, runner: Runner = run_ssh
) -> dict[str, drift.NodeLive]:
    """Ask every node what runs there (one ssh per node, two more on the head)."""
    live: dict[str, drift.NodeLive] = {}
    for node in cfg.nodes:
        target = node_target(node, access.identity_file, access.known_hosts_file)
        result = runner(target, drift.state_command(cfg, stack, node), timeout=120)
        if result.returncode != 0:
            reason = (result.stderr.strip().splitlines() or ["no answer"])[-1]
            live[node.name] = drift.NodeLive(error=f"ssh to {node.ssh.host} failed: {reason}")
            continue
        state = drift.parse_state(result.stdout)
        if node.name == cfg.head:
            for attr, probe in (("ray", drift.ray_probe), ("server", drift.server_probe)):
                command, stdin = probe(cfg, stack)
                container = command.split()[3]
                if state.containers.get(container, None) is None:
                    continue  # already reported as a missing container
                if state.containers[container].status != "running":
                    continue
                answer = runner(target, command, stdin=stdin, timeout=300)
                setattr(state, attr, drift.probe_result(answer.stdout, answer.returncode))
        live[node.name] = state
    return live


def check(
    cfg: StackConfig, stack: str, access: SshAccess, runner: Runner = run_ssh
) -> list[drift.Drift]:
    return drift.find_drift(cfg, stack, read_live(cfg, stack, access, runner))


def load_config(stack: str) -> StackConfig:
    if shutil.which("pulumi"):
        shown = subprocess.run(
            ["pulumi", "config", "--json", "--show-secrets", "--stack", stack],
            capture_output=True, text=True, check=True, cwd=ROOT,
        )  # fmt: skip
        data = json.loads(shown.stdout)
        values = {k: v["value"] if isinstance(v["value"], str) else json.dumps(v["value"])
                  for k, v in data.items() if "value" in v}  # fmt: skip
        secret = [k for k, v in data.items() if v.get("secret")]
        return load_stack_config(parse_pulumi_config(values, secret))
    return load_stack_config(stack_file_config(stack, ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparkvllm.drift", description=__doc__)
    parser.add_argument("--stack", required=True, help="stack name, e.g. spark or sim")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.stack)
        access = prepare_ssh_access(cfg, args.stack, ROOT)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    found = check(cfg, args.stack, access)
    for d in found:
        print(d.render())
    if not found:
        print(f"drift: none ({len(cfg.nodes)} node(s) match the {args.stack} stack config)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
