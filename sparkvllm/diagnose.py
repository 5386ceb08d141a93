"""Diagnostics: collect what every node knows about the deployment into one tarball, with
secrets redacted, and print a one-screen summary naming the likely fault.

    python -m sparkvllm.diagnose --stack spark [--out DIR]

Per node (one ssh each, read-only): our containers' `docker inspect` and last 200 log
lines, the preflight facts (GPU, memory, netdev, RDMA, the host's NCCL, free disk),
`nvidia-smi` where present, the kernel's OOM lines, `free` and `df`; on Ray's head also
`ray status`; and each model server's /health, /v1/models, metrics and a one-token answer.
The likely fault is the first finding of the drift check (sparkvllm/specs/drift_rules.py)
in order of what breaks the most: a node unreachable, a container stopped (with its exit
code, OOM kill and telling log line), Ray missing a node, the server stuck or unhealthy, an
image or weights that differ. Exit status: 0 (no fault found), 1 (a fault, or the tarball
could not be written), 2 (a bad config, stack file or --out: the last line names it and the
fix, nothing written; `--debug` adds the traceback).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shlex
import sys
import tarfile
import time
from collections.abc import Iterable
from pathlib import Path

from sparkvllm.config import StackConfig, is_secret_name
from sparkvllm.config.stack import model_label, ray_heads
from sparkvllm.drift import Runner, last_outputs, link_drift, read_findings, read_links
from sparkvllm.remote import run_ssh
from sparkvllm.specs import containers, drift_rules
from sparkvllm.specs.facts import facts_command
from sparkvllm.specs.link_checks import LinkRate
from sparkvllm.workstation import SshAccess, add_tool_flags, run_tool, tool_inputs

REDACTED = "[redacted]"
# Which findings break the most, first: the summary names the first one as the likely fault.
SEVERITY = (
    "unreachable",
    "container missing",
    "container not running",
    "left the ray cluster",
    "ray unreachable",
    "ray gpus",
    "model server stuck",
    "model server unhealthy",
    "model server serves another model",
    "image missing",
    "image replaced",
    "image not the pinned digest",
    "image changed since the last up",
    "weights incomplete",
    "weights differ",
    "container on an old image",
    "config not applied",
    "link not measured",
    "link slower",
    "link slow",
)


def collect_command(cfg: StackConfig, stack: str, node_name: str) -> str:
    """Bash (read-only) printing every section of a node's diagnostics, each after a line
    `=== name`; a missing tool or container prints what it could."""
    node = next(n for n in cfg.nodes if n.name == node_name)
    ours = drift_rules.read_containers(cfg, stack)[node_name]
    router = drift_rules.router_spec(cfg, stack)
    if router is not None and node_name == cfg.head:
        ours = [*ours, router.name]
    caches = " ".join(shlex.quote(c) for c in dict.fromkeys(m.hf_cache for m in cfg.served))
    sections = {
        "facts": facts_command(cfg, node),
        "containers": "docker ps -a --filter "
        f"label={shlex.quote(f'{containers.LABEL_PREFIX}.stack={stack}')} "
        "--format '{{.Names}}\t{{.Status}}\t{{.Image}}'",
        **{f"inspect {c}": f"docker inspect {c} 2>&1" for c in ours},
        **{f"logs {c}": f"docker logs --tail 200 {c} 2>&1" for c in ours},
        "nvidia-smi": "command -v nvidia-smi >/dev/null && nvidia-smi 2>&1 || echo absent",
        "oom": "{ dmesg 2>/dev/null || journalctl -k -n 2000 --no-pager 2>/dev/null; } | "
        "grep -iE 'out of memory|oom-kill|killed process' | tail -n 20",
        "memory": "free -m",
        "disk": f"df -h {caches} /var/lib/docker 2>&1",
    }
    if node_name in ray_heads(cfg):
        head = containers.container_name(stack, "ray-head")
        sections["ray status"] = f"timeout 60 docker exec {head} ray status 2>&1"
    return "\n".join(
        f"echo {shlex.quote('=== ' + name)}; {{ {command}; }} 2>&1 || true"
        for name, command in sections.items()
    )


def split_sections(stdout: str) -> dict[str, str]:
    out: dict[str, str] = {}
    name = "preamble"
    for line in stdout.splitlines(keepends=True):
        if line.startswith("=== "):
            name = line[4:].strip()
            out[name] = ""
        else:
            out[name] = out.get(name, "") + line
    return out


_ENV_ITEM = re.compile(r'"([A-Za-z_][A-Za-z0-9_]*)=([^"]*)"')


def redact(text: str, secrets: Iterable[str]) -> str:
    """`text` with every known secret value, and the value of every secret-looking
    variable in an environment listing (`"NAME=value"`, as docker inspect prints), replaced
    by [redacted]."""
    for secret in sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return _ENV_ITEM.sub(
        lambda m: f'"{m.group(1)}={REDACTED}"' if is_secret_name(m.group(1)) else m.group(0),
        text,
    )


def likely_fault(findings: list[drift_rules.Drift]) -> drift_rules.Drift | None:
    rank = {what: i for i, what in enumerate(SEVERITY)}
    return min(findings, key=lambda d: rank.get(d.what, len(SEVERITY)), default=None)


def summary(
    cfg: StackConfig,
    lives: dict[str, dict[str, drift_rules.NodeLive]],
    findings: list[drift_rules.Drift],
    oom: dict[str, str],
) -> str:
    """One line per node (every model's containers on it), then each model's server and
    Ray reading (a set's lines begin with the model's name), then the likely fault."""
    lines = []
    for node in cfg.nodes:
        got = [live[node.name] for live in lives.values() if node.name in live]
        errors = [g.error for g in got if g.error] or ([] if got else ["not read"])
        if errors:
            lines.append(f"{node.name}: UNREACHABLE ({errors[0]})")
            continue
        seen = {n: c.status for g in got for n, c in g.containers.items()}
        states = ", ".join(f"{n}={status}" for n, status in sorted(seen.items()))
        ooms = len([line for line in oom.get(node.name, "").splitlines() if line.strip()])
        lines.append(f"{node.name}: {states or 'no containers'}; kernel OOM lines: {ooms}")
    for m in cfg.served:
        label = model_label(m)
        head = lives.get(label, {}).get(cfg.for_model(m).head)
        said = f"{label} " if len(cfg.served) > 1 else ""
        if head and head.server:
            s = head.server
            lines.append(
                f"{said}server: /health {s.get('health_status')}, token "
                f"{'ok' if (s.get('smoke') or {}).get('ok') else 'NONE'}, models {s.get('models')}"
            )
        if head and head.ray:
            lines.append(f"{said}ray: {head.ray.get('alive')} node(s), {head.ray.get('gpus')} "
                         f"GPU(s), missing {head.ray.get('missing')}")  # fmt: skip
    fault = likely_fault(findings)
    lines.append(f"likely fault: {fault.render()}" if fault else "likely fault: none found")
    lines += [f"  also: {d.render()}" for d in findings if d is not fault]
    return "\n".join(lines)


def diagnose(
    cfg: StackConfig,
    stack: str,
    access: SshAccess,
    out_dir: Path,
    runner: Runner = run_ssh,
    last: dict[str, object] | None = None,
    links: bool = True,
) -> tuple[Path, str, list[drift_rules.Drift]]:
    """(the tarball, the summary, the findings). `links`: also measure the cluster link
    from the head to each worker (a few seconds of traffic each)."""
    secrets = [k for k in {access.private_key, *access.node_keys.values()} if k]
    for value in (cfg.api_key, cfg.hf_token):
        if value is not None:
            secrets.append(value.get_secret_value())
    files: dict[str, str] = {}
    oom: dict[str, str] = {}
    for node in cfg.nodes:
        target = access.targets[node.name]
        result = runner(target, collect_command(cfg, stack, node.name), timeout=600)
        sections = split_sections(result.stdout)
        if result.returncode != 0 and not sections:
            sections = {"ssh": result.stderr}
        oom[node.name] = sections.get("oom", "")
        for name, text in sections.items():
            files[f"{node.name}/{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}.txt"] = text
    lives, findings = read_findings(cfg, stack, access, runner, dict(last or {}))
    measured = read_links(cfg, access, runner) if links else {}
    findings += link_drift(cfg, measured, dict(last or {}))
    text = summary(cfg, lives, findings, oom)
    for worker, rate in measured.items():
        if isinstance(rate, LinkRate):
            shown = ", ".join(f"{p} {gbit:.1f} Gb/s ({tool})" for p, tool, gbit in rate.paths())
            text += f"\nlink {cfg.head} <-> {worker}: {shown or 'nothing measured'}"
    figures = {w: r.as_output() if isinstance(r, LinkRate) else {"error": r}
               for w, r in measured.items()}  # fmt: skip
    files["links.json"] = json.dumps(figures, indent=2)
    files["summary.txt"] = text + "\n"
    files["findings.json"] = json.dumps([d.__dict__ for d in findings], indent=2)
    # A stack of one model: node -> its reading, as before sets; a set: model -> that.
    read = {label: {n: v.__dict__ for n, v in live.items()} for label, live in lives.items()}
    kept = next(iter(read.values())) if len(read) == 1 else read
    files["live.json"] = json.dumps(kept, indent=2, default=lambda o: o.__dict__)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    tarball = out_dir / f"diagnose-{stack}-{stamp}.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        for name, content in sorted(files.items()):
            data = redact(content, secrets).encode()
            info = tarfile.TarInfo(f"diagnose-{stack}-{stamp}/{name}")
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o600
            tar.addfile(info, io.BytesIO(data))
    tarball.chmod(0o600)
    return tarball, redact(text, secrets), findings


def out_problem(out: Path) -> str | None:
    """Why the tarball cannot go to `out` (checked before anything is read or written), or
    None: a folder, or a path under one, this user can write in."""
    if out.exists() and not out.is_dir():
        return f"--out {out}: is not a folder; fix: give a folder (made if missing)"
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not existing.is_dir():
        return f"--out {out}: {existing} is not a folder; fix: give a folder (made if missing)"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"--out {out}: cannot write in {existing}; fix: give a folder you can write in"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparkvllm.diagnose", description=__doc__)
    parser.add_argument("--stack", required=True, help="stack name, e.g. spark or sim")
    parser.add_argument("--out", type=Path, default=Path.cwd(), help="where the tarball goes")
    add_tool_flags(parser)
    args = parser.parse_args(argv)
    problem = out_problem(args.out.absolute())
    if problem:
        parser.error(problem)

    def body() -> int:
        cfg, access = tool_inputs(args.stack, args.cwd)
        last = last_outputs(args.stack, args.cwd)
        tarball, text, findings = diagnose(cfg, args.stack, access, args.out, last=last)
        print(text)
        print(f"diagnostics: {tarball} (secrets redacted)")
        return 1 if findings else 0

    return run_tool(parser.prog, args.debug, body)


if __name__ == "__main__":
    sys.exit(main())
