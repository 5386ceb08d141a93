"""Watch a deployed stack in the terminal: one screen for the whole cluster, refreshed every
2 s. Per node: unified memory used and available, GPU utilisation, temperature, SM clock
and power where the node has `nvidia-smi` (a node without shows them as absent, never
invented), the deployment's containers. Per model: generated and prompt tokens/s, running
and waiting requests, KV cache use, mean time to first token, speculative acceptance (vLLM's
/metrics, read inside its server's container).

    python -m sparkvllm.monitor --stack NAME [--every SECONDS] [--once] [--cwd DIR]

Read-only, over the same SSH access as every other tool (one ssh per node per refresh:
sparkvllm/specs/watch.py). `--once`: two readings `--every` apart, one screen printed as
text, exit. Exit status: 0, 2 a bad config or flag (one line naming it), 1 anything else.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from sparkvllm.config import StackConfig
from sparkvllm.remote import run_ssh
from sparkvllm.specs import watch
from sparkvllm.workstation import SshAccess, add_tool_flags, run_tool, tool_inputs

Runner = Callable[..., subprocess.CompletedProcess[str]]
ABSENT = "absent"


def read_commands(cfg: StackConfig, stack: str) -> dict[str, str]:
    """What each node is asked at every refresh (built once per run)."""
    return {n.name: watch.read_command(cfg, stack, n) for n in cfg.nodes}


def read_all(
    commands: dict[str, str], access: SshAccess, runner: Runner = run_ssh
) -> dict[str, watch.NodeReading]:
    """Every node at once (one ssh each): node name -> its reading."""

    def one(name: str) -> watch.NodeReading:
        started = time.monotonic()
        try:
            done = runner(access.targets[name], commands[name], timeout=20)
        except subprocess.TimeoutExpired:
            return watch.NodeReading(at=started, error="no answer in 20 s")
        if done.returncode != 0 and not done.stdout:
            said = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            return watch.NodeReading(at=started, error=f"ssh failed: {said[:120]}")
        return watch.parse(done.stdout, started)

    with ThreadPoolExecutor(max_workers=min(8, len(commands))) as pool:
        return dict(zip(commands, pool.map(one, commands), strict=True))


def _gib(kb: int | None) -> str:
    return ABSENT if kb is None else f"{kb / 1024 / 1024:.1f} GiB"


def _num(value: float | None, fmt: str = "{:.1f}", unit: str = "") -> str:
    return ABSENT if value is None else fmt.format(value) + unit


def screen(
    cfg: StackConfig,
    stack: str,
    now: dict[str, watch.NodeReading],
    before: dict[str, watch.NodeReading] | None,
) -> Group:
    """The one screen: nodes, models, containers."""
    nodes = Table(title="nodes", title_justify="left", box=box.SIMPLE_HEAD)
    for column in (
        "node",
        "memory used",
        "available",
        "GPU",
        "temp",
        "SM clock",
        "power",
        "containers",
    ):
        nodes.add_column(column)
    for name, r in now.items():
        if r.error:
            nodes.add_row(name, Text(r.error, style="red"), *[""] * 6)
            continue
        used = None
        if r.mem_total_kb is not None and r.mem_available_kb is not None:
            used = r.mem_total_kb - r.mem_available_kb
        g = r.gpu or {}
        running = sum(1 for s in r.containers.values() if s.startswith("running"))
        nodes.add_row(
            name,
            f"{_gib(used).removesuffix(' GiB')}/{_gib(r.mem_total_kb)}",
            _gib(r.mem_available_kb),
            _num(g.get("utilization.gpu"), "{:.0f}", " %"),
            _num(g.get("temperature.gpu"), "{:.0f}", " C"),
            _num(g.get("clocks.sm"), "{:.0f}", " MHz"),
            _num(g.get("power.draw"), "{:.1f}", " W"),
            f"{running}/{len(r.containers)} running",
        )
    models = Table(title="models", title_justify="left", box=box.SIMPLE_HEAD)
    for column in (
        "model",
        "node",
        "tokens/s",
        "prompt/s",
        "running",
        "waiting",
        "KV cache",
        "TTFT",
        "spec. accept",
    ):
        models.add_column(column)
    for name, r in now.items():
        for label, answer in r.servers.items():
            old = before.get(name) if before else None
            prior = old.servers.get(label) if old else None
            f = watch.figures(answer, prior, r.at - old.at if old else 0.0)
            if not f.ok:
                models.add_row(label, name, Text(f.error, style="red"), *[""] * 6)
                continue
            models.add_row(
                label,
                name,
                _num(f.tokens_per_s),
                _num(f.prompt_tokens_per_s),
                _num(f.running, "{:.0f}"),
                _num(f.waiting, "{:.0f}"),
                _num(None if f.kv_cache is None else f.kv_cache * 100, "{:.1f}", " %"),
                _num(None if f.ttft_s is None else f.ttft_s * 1000, "{:.0f}", " ms"),
                _num(
                    None if f.spec_acceptance is None else f.spec_acceptance * 100, "{:.0f}", " %"
                ),
            )
    held = Table(title="containers", title_justify="left", box=box.SIMPLE, show_header=False)
    held.add_column("node")
    held.add_column("container")
    held.add_column("state")
    for name, r in now.items():
        for container, state in sorted(r.containers.items()):
            style = "" if state.startswith("running") else "yellow"
            held.add_row(name, container, Text(state, style=style))
    head = Text(
        f"spark-vllm monitor: stack {stack}, {len(cfg.nodes)} node(s), "
        f"{len(cfg.served)} model(s); {time.strftime('%H:%M:%S')}",
        style="bold",
    )
    return Group(head, nodes, models, held)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sparkvllm.monitor",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--stack", required=True, help="stack name, e.g. spark or sim")
    parser.add_argument(
        "--every",
        type=float,
        default=2.0,
        help="seconds between readings (default 2; at least 0.5)",
    )
    parser.add_argument(
        "--once", action="store_true", help="two readings --every apart, one screen as text, exit"
    )
    add_tool_flags(parser)
    args = parser.parse_args(argv)
    if not 0.5 <= args.every <= 3600:
        parser.error(f"--every {args.every}: out of range; fix: give 0.5 to 3600 seconds")

    def body() -> int:
        cfg, access = tool_inputs(args.stack, args.cwd)
        commands = read_commands(cfg, args.stack)
        before = read_all(commands, access)
        if args.once:
            time.sleep(args.every)
            now = read_all(commands, access)
            Console(width=160).print(screen(cfg, args.stack, now, before))
            return 0
        with Live(screen(cfg, args.stack, before, None), auto_refresh=False, screen=False) as live:
            while True:
                time.sleep(args.every)
                now = read_all(commands, access)
                live.update(screen(cfg, args.stack, now, before), refresh=True)
                before = now

    try:
        return run_tool(parser.prog, args.debug, body)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
