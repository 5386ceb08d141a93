"""What the monitor reads on each node, and how a reading becomes figures (pure: the
command is text, the parse and the rates are functions of text and time).

One ssh per node per refresh runs `read_command`: the node's unified memory
(/proc/meminfo), its GPU where `nvidia-smi` answers (utilisation, temperature, SM clock,
power; on a node without one they are absent, never invented), the deployment's containers
on it (by the stack's label), and the `/metrics` of each model server whose rank 0 it is
(probes/server_metrics.py, inside that server's container). Read-only: docker inspect/ps and
an HTTP GET; nothing is started, stopped or written.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from sparkvllm.config import NodeConfig, StackConfig
from sparkvllm.config.stack import model_label
from sparkvllm.probes import script
from sparkvllm.specs import containers

GPU_FIELDS = ("utilization.gpu", "temperature.gpu", "clocks.sm", "power.draw")


@dataclass(frozen=True)
class Server:
    """A model server the monitor reads on its rank-0 node."""

    label: str
    container: str
    url: str


def servers_on(cfg: StackConfig, stack: str, node: NodeConfig) -> list[Server]:
    """The model servers whose rank 0 (the API) runs on `node`."""
    out = []
    for m in cfg.served:
        view = cfg.for_model(m)
        if view.head == node.name:
            name = containers.model_server(view, stack).name
            out.append(Server(model_label(m), name, f"http://127.0.0.1:{view.ports.api}"))
    return out


def read_command(cfg: StackConfig, stack: str, node: NodeConfig) -> str:
    """Bash printing `key=value` lines: mem.total_kb, mem.available_kb, gpu (nvidia-smi's
    CSV line, or `absent`), container.NAME=STATE STATUS..., server.LABEL=JSON."""
    label = shlex.quote(f"label={containers.LABEL_PREFIX}.stack={stack}")
    query = ",".join(GPU_FIELDS)
    memory = (
        'awk \'/^MemTotal:/{print "mem.total_kb=" $2} '
        '/^MemAvailable:/{print "mem.available_kb=" $2}\' /proc/meminfo'
    )
    gpu = (
        "if command -v nvidia-smi >/dev/null 2>&1; then "
        f"echo gpu=$(nvidia-smi --query-gpu={query} --format=csv,noheader,nounits "
        "2>/dev/null | head -n1); else echo gpu=absent; fi"
    )
    held = (
        f"docker ps -a --filter {label} --format "
        "'container.{{.Names}}={{.State}} {{.Status}}' 2>/dev/null"
    )
    lines = [memory, gpu, held]
    probe = shlex.quote(script("server_metrics"))
    for s in servers_on(cfg, stack, node):
        lines.append(
            f"echo server.{s.label}=$(docker exec {s.container} python3 -c {probe} "
            f'{s.url} 2>/dev/null || echo \'{{"ok": false, "error": "not running"}}\')'
        )
    return "\n".join(lines)


@dataclass
class NodeReading:
    """One node's answer at one moment (`at`: the workstation's monotonic clock)."""

    at: float
    error: str = ""
    mem_total_kb: int | None = None
    mem_available_kb: int | None = None
    gpu: dict[str, float | None] | None = None  # None: the node has no nvidia-smi
    containers: dict[str, str] = field(default_factory=dict)
    servers: dict[str, dict[str, Any]] = field(default_factory=dict)


def parse(stdout: str, at: float) -> NodeReading:
    reading = NodeReading(at=at)
    for line in stdout.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key in ("mem.total_kb", "mem.available_kb") and value.strip().isdigit():
            setattr(reading, key.replace(".", "_"), int(value))
        elif key == "gpu":
            reading.gpu = None if value.strip() in ("absent", "") else _gpu(value)
        elif key.startswith("container."):
            reading.containers[key.removeprefix("container.")] = value.strip()
        elif key.startswith("server."):
            try:
                answer = json.loads(value)
            except json.JSONDecodeError:
                answer = {"ok": False, "error": "no answer"}
            reading.servers[key.removeprefix("server.")] = answer
    return reading


def _gpu(csv: str) -> dict[str, float | None]:
    """nvidia-smi's `--format=csv,noheader,nounits` line; `[N/A]` (a GB10 has no separate
    memory or reports no power) stays absent."""
    parts = [p.strip() for p in csv.split(",")]
    out: dict[str, float | None] = {}
    for name, text in zip(GPU_FIELDS, parts + [""] * len(GPU_FIELDS), strict=False):
        try:
            out[name] = float(text)
        except ValueError:
            out[name] = None
    return out


@dataclass(frozen=True)
class ModelFigures:
    """A model server's figures at a reading; the rates over the time since the one before
    (None on the first reading, or after a counter went back: the server restarted)."""

    ok: bool
    error: str = ""
    tokens_per_s: float | None = None
    prompt_tokens_per_s: float | None = None
    running: float | None = None
    waiting: float | None = None
    kv_cache: float | None = None  # 0..1
    ttft_s: float | None = None  # mean time to first token over the interval (or overall)
    spec_acceptance: float | None = None  # accepted / draft tokens over the interval


def figures(now: dict[str, Any], before: dict[str, Any] | None, seconds: float) -> ModelFigures:
    if not now.get("ok"):
        return ModelFigures(False, str(now.get("error") or "no answer"))
    m = now.get("metrics") or {}
    b = (before or {}).get("metrics") if before and before.get("ok") else None

    def rate(name: str) -> float | None:
        if b is None or seconds <= 0 or name not in m or name not in b or m[name] < b[name]:
            return None
        return (m[name] - b[name]) / seconds

    def over(num: str, den: str) -> float | None:
        n, d = m.get(num), m.get(den)
        if n is None or d is None:
            return None
        if b is not None and b.get(den) is not None and d > b[den] and n >= b.get(num, 0):
            return (n - b.get(num, 0)) / (d - b[den])
        return n / d if d else None

    return ModelFigures(
        ok=True,
        tokens_per_s=rate("vllm:generation_tokens_total"),
        prompt_tokens_per_s=rate("vllm:prompt_tokens_total"),
        running=m.get("vllm:num_requests_running"),
        waiting=m.get("vllm:num_requests_waiting"),
        kv_cache=m.get("vllm:kv_cache_usage_perc"),
        ttft_s=over(
            "vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count"
        ),
        spec_acceptance=over(
            "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total"
        ),
    )
