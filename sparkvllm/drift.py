"""Drift check: compare the running cluster with the stack config, node by node.

    python -m sparkvllm.drift --stack spark

Complements `pulumi preview --refresh --expect-no-changes` (which compares Pulumi's state
and the program with what the providers read back) with what they cannot see; see
sparkvllm/specs/drift_rules.py. Exit status: 0 no drift, 1 drift (one line per finding, naming
the node), 2 the config is invalid (or the stack file, or the workstation's key folder: the
last line names it and the fix; `--debug` adds the traceback).

Config: read through the Pulumi CLI (`pulumi config --json --show-secrets`) when it is
installed, else from Pulumi.<stack>.yaml (secrets then come from ssh_private_key_file).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sparkvllm import outputs
from sparkvllm.config import PROJECT_DIR, StackConfig
from sparkvllm.config.stack import model_label
from sparkvllm.remote import run_ssh
from sparkvllm.specs import drift_rules as drift
from sparkvllm.specs import link_checks
from sparkvllm.workstation import SshAccess, add_tool_flags, run_tool, tool_inputs

Runner = Callable[..., subprocess.CompletedProcess[str]]


def read_live(
    cfg: StackConfig, stack: str, access: SshAccess, runner: Runner = run_ssh
) -> dict[str, drift.NodeLive]:
    """Ask every node what runs there (one ssh per node, two more on the head)."""
    live: dict[str, drift.NodeLive] = {}
    for node in cfg.nodes:
        target = access.targets[node.name]
        result = runner(target, drift.state_command(cfg, stack, node), timeout=120)
        if result.returncode != 0:
            reason = (result.stderr.strip().splitlines() or ["no answer"])[-1]
            live[node.name] = drift.NodeLive(error=f"ssh to {node.ssh.host} failed: {reason}")
            continue
        state = drift.parse_state(result.stdout)
        if node.name == cfg.head:
            for attr, probe in (("ray", drift.ray_probe), ("server", drift.server_probe)):
                p = probe(cfg, stack)
                found = state.containers.get(p.container)
                if found is None or found.status != "running":
                    continue  # already reported as a missing or stopped container
                answer = runner(target, p.command, stdin=p.stdin, timeout=300)
                report = drift.probe_result(answer.stdout, answer.returncode)
                if attr == "server" and report and not (report.get("smoke") or {}).get("ok"):
                    report["last_log"] = runner(target, p.logs, timeout=60).stdout.strip()
                setattr(state, attr, report)
        live[node.name] = state
    return live


def read_findings(
    cfg: StackConfig,
    stack: str,
    access: SshAccess,
    runner: Runner = run_ssh,
    last: dict[str, Any] | None = None,
) -> tuple[dict[str, dict[str, drift.NodeLive]], list[drift.Drift]]:
    """(model label -> what its nodes reported, the findings). A stack that serves one
    model is read once; a set, model by model (each as its one-model view: its
    containers, weights and server), the image judged once for every node."""
    router = drift.router_drift(cfg, stack, read_router(cfg, stack, access, runner))
    if len(cfg.served) == 1:
        # As its one model's parts are placed (a `models:` entry may name its own nodes,
        # in its own order, and its own ports).
        view = cfg.for_model(cfg.served[0])
        live = read_live(view, stack, access, runner)
        found = drift.find_drift(view, stack, live, last)
        return {model_label(cfg.served[0]): live}, found + router
    lives = {model_label(m): read_live(cfg.for_model(m), stack, access, runner) for m in cfg.served}
    return lives, drift.find_set_drift(cfg, stack, lives, last) + router


def read_router(
    cfg: StackConfig, stack: str, access: SshAccess, runner: Runner = run_ssh
) -> drift.NodeLive | None:
    """What the stack's head says of the router's container (None: no router)."""
    if cfg.router is None:
        return None
    target = access.targets[cfg.head]
    result = runner(target, drift.router_state_command(cfg, stack), timeout=60)
    if result.returncode != 0:
        reason = (result.stderr.strip().splitlines() or ["no answer"])[-1]
        return drift.NodeLive(error=f"ssh to {target.host} failed: {reason}")
    return drift.parse_state(result.stdout)


def read_links(
    cfg: StackConfig, access: SshAccess, runner: Runner = run_ssh
) -> dict[str, link_checks.LinkRate | str]:
    """What the cluster link carries now, from the head to each worker, one after another
    (scripts/link_rate.sh, as the preflight measures it: a few seconds and a bounded byte
    count each way); worker -> its figures, or why it could not be measured."""
    out: dict[str, link_checks.LinkRate | str] = {}
    head = access.targets[cfg.head]
    for worker in cfg.worker_nodes:
        # The preflight's own step, run as its node runs it (its key on stdin).
        spec = link_checks.link_rate_step(cfg, worker, access.host_keys.get(worker.name))
        result = runner(
            head, spec.shell_command, stdin=access.key_of(worker.name), timeout=spec.timeout_s
        )
        if result.returncode != 0:
            out[worker.name] = (result.stderr.strip().splitlines() or ["no answer"])[-1]
        else:
            out[worker.name] = link_checks.parse_rate(cfg.head, worker.name, result.stdout)
    return out


def link_drift(
    cfg: StackConfig, measured: dict[str, link_checks.LinkRate | str], last: dict[str, Any]
) -> list[drift.Drift]:
    """A path slower than half what it carried when deployed (the `links` output), or slow
    beside the others or its negotiated speed now; a link that could not be measured."""
    rates = {w: r for w, r in measured.items() if isinstance(r, link_checks.LinkRate)}
    found = []
    for w, why in measured.items():
        if isinstance(why, str):
            fix = "" if "fix:" in why else f"; fix: check ssh from {cfg.head} to {w} over the link"
            found.append(drift.Drift(w, "link not measured", why + fix))
    facts = last.get("nodes") or {}
    slower = link_checks.rate_drift(cfg, rates, last.get("links") or {}, facts)
    found += [drift.Drift(w, "link slower", detail) for w, detail in slower]
    if not slower:
        found += [
            drift.Drift(w, "link slow", warning)
            for w, warning in link_checks.slow_paths(cfg, rates, facts)
        ]
    return found


def last_outputs(stack: str, project_dir: Path = PROJECT_DIR) -> dict[str, Any]:
    """The outputs of the stack's last `up`, or {} when there are none."""
    try:
        return outputs.stack_outputs(stack, project_dir)
    except outputs.OutputsError:
        return {}


def check(
    cfg: StackConfig,
    stack: str,
    access: SshAccess,
    runner: Runner = run_ssh,
    last: dict[str, Any] | None = None,
    links: bool = False,
) -> list[drift.Drift]:
    """`links`: also measure the cluster link (a few seconds of traffic per worker)."""
    _, found = read_findings(cfg, stack, access, runner, last)
    if links:
        found += link_drift(cfg, read_links(cfg, access, runner), last or {})
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparkvllm.drift", description=__doc__)
    parser.add_argument("--stack", required=True, help="stack name, e.g. spark or sim")
    parser.add_argument(
        "--no-links",
        action="store_true",
        help="do not measure the cluster link (by default: a few seconds of traffic, at "
        "most 8 GiB each way, from the head to each worker)",
    )
    add_tool_flags(parser)
    args = parser.parse_args(argv)

    def body() -> int:
        cfg, access = tool_inputs(args.stack, args.cwd)
        last = last_outputs(args.stack, args.cwd)
        found = check(cfg, args.stack, access, last=last, links=not args.no_links)
        for d in found:
            print(d.render())
        if not found:
            print(f"drift: none ({len(cfg.nodes)} node(s) match the {args.stack} stack config)")
        return 1 if found else 0

    return run_tool(parser.prog, args.debug, body)


if __name__ == "__main__":
    sys.exit(main())
