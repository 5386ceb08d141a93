"""Metrics for the user's own Prometheus and Grafana (sparkvllm/specs/scrape.py,
python -m sparkvllm.metrics): the targets (every model server's /metrics at the address
clients use), the scrape config, and the dashboard (built with Grafana's SDK) drawing the
series vLLM exposes. The sim's suite scrapes the deployed sim's target
(tests/test_sim_cluster.py)."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path

import pytest
import yaml

from sparkvllm import metrics as cli
from sparkvllm.config import load_stack_config
from sparkvllm.config_sources import stack_without_secrets
from sparkvllm.probes import server_metrics
from sparkvllm.specs import scrape as metrics
from tests.conftest import ROOT


def test_targets_are_each_models_rank_0_at_the_clients_address() -> None:
    cfg = load_stack_config(stack_without_secrets("spark-models", ROOT))
    assert [t.as_output() for t in metrics.targets(cfg)] == [
        {"model": "qwen3.5-122b", "served_name": "qwen3.5-122b", "node": "spark-1",
         "url": "http://10.1.230.180:8000/metrics"},
        {"model": "small", "served_name": "qwen3-4b", "node": "spark-2",
         "url": "http://10.1.230.181:8001/metrics"},
    ]  # fmt: skip
    config = metrics.prometheus_config(cfg, "spark-models")
    (job,) = config["scrape_configs"]
    assert job["static_configs"][1] == {
        "targets": ["10.1.230.181:8001"],
        "labels": {"stack": "spark-models", "model": "small", "node": "spark-2"},
    }


def test_the_dashboard_draws_what_vllm_exposes() -> None:
    board = metrics.dashboard("sim")
    assert board["uid"] == "spark-vllm-sim" and board["schemaVersion"] >= 39
    panels = [p for p in board["panels"] if p["type"] == "timeseries"]
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    used = set(re.findall(r"vllm:[a-z_]+", " ".join(exprs)))
    # the monitor's probe reads the same series (the _bucket of its TTFT _sum/_count)
    read = {n.removesuffix("_sum").removesuffix("_count") for n in server_metrics.WANTED}
    assert {n.removesuffix("_bucket") for n in used} <= read
    assert {p["title"] for p in panels} >= {
        "generated tokens/s", "time to first token", "requests", "KV cache used",
        "speculative decoding: accepted / drafted tokens", "unified memory used",
    }  # fmt: skip
    for p in panels:  # every panel on the one data source variable, each query its refId
        assert p["datasource"]["uid"] == "${datasource}"
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"])
    assert board["templating"]["list"][0]["type"] == "datasource"


def test_the_command_writes_both_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--stack", "spark-models", "--out", str(tmp_path)]) == 0
    said = capsys.readouterr().out
    assert "metrics: small on spark-2: http://10.1.230.181:8001/metrics" in said
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ["grafana-dashboard.json", "prometheus.yml"]  # no temporary file left
    for name in written:
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644
    config = yaml.safe_load((tmp_path / "prometheus.yml").read_text())
    assert config["scrape_configs"][0]["job_name"] == "spark-vllm-spark-models"
    assert json.loads((tmp_path / "grafana-dashboard.json").read_text())["title"]
    with pytest.raises(SystemExit) as e:
        cli.main(["--stack", "spark", "--out", str(tmp_path / "missing")])
    assert e.value.code == 2 and "--out" in capsys.readouterr().err
    assert cli.main(["--stack", "nope", "--out", str(tmp_path)]) == 2
