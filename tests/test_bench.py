"""bench/'s bookkeeping (the measurements themselves run on the sim: `python -m bench`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.figures import Figures
from bench.measure import phase_of
from sparkvllm.config import load_stack_config
from sparkvllm.specs import plans
from tests.conftest import four_node_raw, stack_file


def test_results_json_has_value_unit_how_and_goal(tmp_path: Path) -> None:
    figures = Figures(run={"nodes": 2})
    figures.add("noop_up_s", 3.14159, "s", "a second up", "< 5")
    figures.add("image_sync_vs_raw_pipe", 0.95, "ratio", "raw / sync")
    figures.write(tmp_path / "results.json")
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["run"] == {"nodes": 2}
    assert data["noop_up_s"] == {"value": 3.142, "unit": "s", "how": "a second up", "goal": "< 5"}
    table = figures.table().splitlines()
    assert table[0].split() == ["figure", "value", "unit", "goal"]
    assert table[1].split()[:3] == ["noop_up_s", "3.142", "s"]


@pytest.mark.parametrize("stack", ["sim", "spark", "spark4"])
def test_every_step_of_a_deploy_has_a_phase(stack: str) -> None:
    """A step the phase table does not know would vanish into "other" in the cold figures."""
    raw = stack_file(stack.rstrip("4"))
    raw["ssh_private_key_file"] = "x"
    if stack == "spark4":
        raw = four_node_raw(raw)
    cfg = load_stack_config(raw)
    names = [cfg.head + "-facts", cfg.head + "-links", cfg.head + "-hub-access"]
    image = plans.image(cfg, {})
    assert image.support is not None
    names += [image.obtain.name, image.support.name, *([image.relay.name] if image.relay else [])]
    names += [s.name for s in image.streams.values()] + [s.name for s in image.versions.values()]
    weights = plans.model_weights(cfg, {})
    names += [s.name for s in [*weights.downloads.values(), *weights.copies.values()]]
    names += [plans.ray_head(cfg, stack).container.resource_name]
    names += [plans.ray_worker(cfg, stack, n).container.resource_name for n in cfg.worker_nodes]
    names += ["model-server-ray-ready", plans.model_server(cfg, stack).container.resource_name]
    unknown = [n for n in names if phase_of(n) == "other"]
    assert not unknown, unknown


def test_the_chart_draws_each_figure_with_a_numeric_goal(tmp_path: Path) -> None:
    from bench.chart import bars, chart, main

    results = {
        "run": {"commit": "abc1234", "nodes": 2},
        "noop_up_s": {"value": 2.6, "unit": "s", "how": "", "goal": "< 3"},
        "sync_vs_raw": {"value": 0.95, "unit": "ratio", "how": "", "goal": ">= 1.0"},
        "drift_growth": {"value": 0.2, "unit": "s", "how": "", "goal": "grows < 0.3 s per node"},
        "calls": {"value": 0, "unit": "calls", "how": "", "goal": "0"},
        "image_bytes": {"value": 4e9, "unit": "bytes", "how": "", "goal": ""},
    }
    drawn = bars(results)
    assert [(b.name, b.met, round(b.ratio, 3)) for b in drawn] == [
        ("noop_up_s", True, 0.867), ("sync_vs_raw", False, 0.95),
    ]  # fmt: skip
    path = tmp_path / "results.png"
    assert chart(results, path) == drawn
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    source = tmp_path / "r.json"
    source.write_text(json.dumps(results))
    assert main([str(source)]) == 0 and (tmp_path / "r.png").stat().st_size > 1000
    assert main([str(tmp_path / "missing.json")]) == 2


def test_the_percentile_is_the_nearest_rank() -> None:
    from bench.models import _pct

    times = [float(n) for n in range(50, 0, -1)]
    assert (_pct(times, 50), _pct(times, 99), _pct(times, 100)) == (25.0, 50.0, 50.0)
    assert _pct([7.0], 50) == 7.0


def test_a_changed_models_time_without_service_spans_its_failures() -> None:
    """From the last answer before the first failure to the first answer after the last."""
    from bench.models import Asked

    asked = Asked("http://127.0.0.1:9/v1", "m")
    asked.answered = [1.0, 2.0, 9.0, 10.0]
    assert asked.without_service_s() == 0.0
    asked.failed = [(3.0, "refused"), (5.0, "502"), (8.0, "refused")]
    assert asked.without_service_s() == 7.0
