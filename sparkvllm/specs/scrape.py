"""Scrape targets and a dashboard: metrics for the user's own Prometheus and Grafana
(pure: functions of the config).

- `targets`: every model server's vLLM `/metrics` (its rank 0, which serves the API; the
  other ranks serve no HTTP), at the address clients reach it: the `metrics` output;
- `prometheus_config`: a scrape config for them (`prometheus.yml`);
- `dashboard`: a Grafana dashboard of tokens/s, time to first token, the queue, KV cache
  use, speculative acceptance and each node's memory, built with Grafana's own Python SDK
  (grafana-foundation-sdk), so it is Grafana's schema by construction.

`python -m sparkvllm.metrics --stack NAME --out DIR` writes the last two.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sparkvllm.config import StackConfig
from sparkvllm.config.stack import model_label
from sparkvllm.specs.ssh import url_host

# vLLM's series the dashboard draws (vllm/v1/metrics/loggers.py; the counters with the
# `_total` prometheus_client adds). probes/server_metrics.py reads the same ones.
GENERATED = "vllm:generation_tokens_total"
PROMPT = "vllm:prompt_tokens_total"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_CACHE = "vllm:kv_cache_usage_perc"
TTFT_BUCKET = "vllm:time_to_first_token_seconds_bucket"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
SPEC_DRAFT = "vllm:spec_decode_num_draft_tokens_total"
# node_exporter's, where the user runs one on each node (a separate job of theirs).
NODE_AVAILABLE = "node_memory_MemAvailable_bytes"
NODE_TOTAL = "node_memory_MemTotal_bytes"


@dataclass(frozen=True)
class Target:
    model: str  # the model's label (its name, else its served name)
    served_name: str
    node: str  # its rank 0
    address: str  # host:port, as Prometheus scrapes it

    @property
    def url(self) -> str:
        return f"http://{self.address}/metrics"

    def as_output(self) -> dict[str, str]:
        return {
            "model": self.model,
            "served_name": self.served_name,
            "node": self.node,
            "url": self.url,
        }


def targets(cfg: StackConfig) -> list[Target]:
    out = []
    for m in cfg.served:
        view = cfg.for_model(m)
        host = view.endpoint_host or view.head_node.ssh.host
        out.append(
            Target(
                model_label(m), m.name_for_clients, view.head, f"{url_host(host)}:{view.ports.api}"
            )
        )
    return out


def prometheus_config(cfg: StackConfig, stack: str) -> dict[str, Any]:
    """A Prometheus config scraping every model server (`model`, `node` and `stack` as
    labels, which the dashboard's queries group by)."""
    return {
        "global": {"scrape_interval": "15s", "evaluation_interval": "15s"},
        "scrape_configs": [
            {
                "job_name": f"spark-vllm-{stack}",
                "metrics_path": "/metrics",
                "static_configs": [
                    {
                        "targets": [t.address],
                        "labels": {"stack": stack, "model": t.model, "node": t.node},
                    }
                    for t in targets(cfg)
                ],
            }
        ],
    }


def dashboard(stack: str) -> dict[str, Any]:
    """The Grafana dashboard (JSON model), panels by model and node."""
    from grafana_foundation_sdk.builders import prometheus, timeseries
    from grafana_foundation_sdk.builders.dashboard import Dashboard as Board
    from grafana_foundation_sdk.builders.dashboard import DatasourceVariable, Row
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    def panel(title: str, unit: str, *queries: tuple[str, str]) -> timeseries.Panel:
        p = timeseries.Panel().title(title).unit(unit).span(12).height(8)
        p = p.datasource({"type": "prometheus", "uid": "${datasource}"})  # type: ignore[arg-type]
        for ref, (expr, legend) in zip("ABCDEFGH", queries, strict=False):
            p = p.with_target(prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref))
        return p

    by_model = "sum by (model) "
    board = (
        Board(f"spark-vllm: {stack}")
        .uid(f"spark-vllm-{stack}")
        .tags(["spark-vllm", "vllm"])
        .refresh("10s")
        .time("now-1h", "now")
        .with_variable(DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_row(Row("throughput"))
        .with_panel(
            panel(
                "generated tokens/s", "short", (f"{by_model}(rate({GENERATED}[1m]))", "{{model}}")
            )
        )
        .with_panel(
            panel("prompt tokens/s", "short", (f"{by_model}(rate({PROMPT}[1m]))", "{{model}}"))
        )
        .with_panel(
            panel(
                "time to first token",
                "s",
                (
                    f"histogram_quantile(0.5, sum by (model, le) (rate({TTFT_BUCKET}[5m])))",
                    "{{model}} p50",
                ),
                (
                    f"histogram_quantile(0.95, sum by (model, le) (rate({TTFT_BUCKET}[5m])))",
                    "{{model}} p95",
                ),
            )
        )
        .with_row(Row("queue and cache"))
        .with_panel(
            panel(
                "requests",
                "short",
                (f"{by_model}({RUNNING})", "{{model}} running"),
                (f"{by_model}({WAITING})", "{{model}} waiting"),
            )
        )
        .with_panel(
            panel("KV cache used", "percentunit", (f"max by (model) ({KV_CACHE})", "{{model}}"))
        )
        .with_panel(
            panel(
                "speculative decoding: accepted / drafted tokens",
                "percentunit",
                (
                    f"{by_model}(rate({SPEC_ACCEPTED}[5m])) / {by_model}(rate({SPEC_DRAFT}[5m]))",
                    "{{model}}",
                ),
            )
        )
        .with_row(Row("nodes (node_exporter, where you run it)"))
        .with_panel(
            panel(
                "unified memory used",
                "percentunit",
                (f"1 - {NODE_AVAILABLE} / {NODE_TOTAL}", "{{instance}}"),
            )
        )
    )
    encoded: dict[str, Any] = json.loads(
        JSONEncoder(sort_keys=True, indent=2).encode(board.build())
    )
    return encoded
