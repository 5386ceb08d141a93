"""The monitor (python -m sparkvllm.monitor): what it asks each node (one read-only ssh),
how an answer becomes figures (rates over the interval, absent where a node has no GPU
tool, never invented), and the screen, with stand-in answers (no node contacted). The
sim's suite (tests/test_sim_models.py) watches the deployed sim in tmux."""

from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from sparkvllm import monitor
from sparkvllm.config import load_stack_config
from sparkvllm.config_sources import stack_file_raw
from sparkvllm.specs import watch
from tests.conftest import ROOT


def cfg_of(stack: str) -> Any:
    raw = stack_file_raw(stack, ROOT)
    raw.setdefault("ssh_private_key", "test")
    raw.pop("ssh_private_key_file", None)
    return load_stack_config(raw)


def metrics(generated: float, prompt: float, ttft_sum: float, ttft_n: float) -> str:
    return json.dumps({"ok": True, "metrics": {
        "vllm:generation_tokens_total": generated, "vllm:prompt_tokens_total": prompt,
        "vllm:num_requests_running": 1.0, "vllm:num_requests_waiting": 2.0,
        "vllm:kv_cache_usage_perc": 0.25, "vllm:time_to_first_token_seconds_sum": ttft_sum,
        "vllm:time_to_first_token_seconds_count": ttft_n,
    }})  # fmt: skip


def test_the_read_is_read_only_and_names_each_server_on_its_rank_0() -> None:
    cfg = cfg_of("spark-models")
    by_node = {n.name: watch.read_command(cfg, "spark", n) for n in cfg.nodes}
    # the 122B model's API is on spark-1, the small one's on spark-2
    assert "server.qwen3.5-122b=" in by_node["spark-1"]
    assert "server.small=" in by_node["spark-2"] and "server.qwen3.5-122b" not in by_node["spark-2"]
    assert "http://127.0.0.1:8001" in by_node["spark-2"]
    for command in by_node.values():
        words = command.split()
        assert not {"rm", "stop", "kill", "restart", "run", "start", "create"} & set(words)
        assert "docker ps -a --filter label=ai.sparkvllm.stack=spark" in command


def test_a_reading_and_its_figures() -> None:
    gpu = "96, 61, 2418, 88.50"
    out = (
        "mem.total_kb=125829120\nmem.available_kb=41943040\n"
        f"gpu={gpu}\ncontainer.sparkvllm-spark-model-server=running Up 5 minutes\n"
        f"server.big={metrics(1000, 400, 2.0, 4)}\nserver.small=not json\n"
    )
    before = watch.parse(out, at=10.0)
    now = watch.parse(out.replace(metrics(1000, 400, 2.0, 4), metrics(1500, 500, 3.0, 6)), 12.0)
    assert (now.mem_total_kb, now.mem_available_kb) == (125829120, 41943040)
    assert now.gpu == {"utilization.gpu": 96, "temperature.gpu": 61, "clocks.sm": 2418,
                       "power.draw": 88.5}  # fmt: skip
    assert now.containers == {"sparkvllm-spark-model-server": "running Up 5 minutes"}
    f = watch.figures(now.servers["big"], before.servers["big"], now.at - before.at)
    assert (f.tokens_per_s, f.prompt_tokens_per_s) == (250.0, 50.0)
    assert (f.running, f.waiting, f.kv_cache) == (1.0, 2.0, 0.25)
    assert f.ttft_s == 0.5  # (3.0 - 2.0) s over (6 - 4) requests in the interval
    assert f.spec_acceptance is None  # no speculative decoding: absent, not 0
    first = watch.figures(now.servers["big"], None, 0.0)
    assert first.tokens_per_s is None and first.ttft_s == 0.5  # overall mean: 3.0 / 6
    # A counter that went back (the server restarted) gives no rate, not a negative one.
    assert watch.figures(before.servers["big"], now.servers["big"], 2.0).tokens_per_s is None
    assert watch.figures(now.servers["small"], None, 0).error == "no answer"
    # No nvidia-smi (the sim), or a GB10's [N/A]: absent.
    assert watch.parse("gpu=absent\n", 0).gpu is None
    assert watch.parse("gpu=[N/A], 50, [N/A], [N/A]\n", 0).gpu == {
        "utilization.gpu": None, "temperature.gpu": 50, "clocks.sm": None, "power.draw": None,
    }  # fmt: skip


def test_the_screen_from_stand_in_nodes() -> None:
    cfg = cfg_of("spark-models")
    calls: list[str] = []
    tokens = {"n": 1000.0}

    def runner(target: Any, command: str, timeout: float = 0) -> subprocess.CompletedProcess[str]:
        calls.append(target)
        if target == "spark-2":
            return subprocess.CompletedProcess([], 255, "", "ssh: connect to host: refused\n")
        tokens["n"] += 600
        out = (
            "mem.total_kb=125829120\nmem.available_kb=41943040\ngpu=absent\n"
            "container.sparkvllm-spark-model-server=running Up 5 minutes\n"
            f"server.qwen3.5-122b={metrics(tokens['n'], 10, 1, 2)}\n"
        )
        return subprocess.CompletedProcess([], 0, out, "")

    # read_all reaches a node by its target alone; a stand-in target is the node's name
    access: Any = SimpleNamespace(targets={"spark-1": "spark-1", "spark-2": "spark-2"})
    commands = monitor.read_commands(cfg, "spark")
    before = monitor.read_all(commands, access, runner)
    now = monitor.read_all(commands, access, runner)
    now["spark-1"].at = before["spark-1"].at + 2.0
    console = Console(width=200, record=True)
    console.print(monitor.screen(cfg, "spark", now, before))
    text = console.export_text()
    assert sorted(calls) == ["spark-1", "spark-1", "spark-2", "spark-2"]
    assert "80.0/120.0 GiB" in text and "40.0 GiB" in text
    assert "absent" in text  # the GPU figures of a node without nvidia-smi
    assert "300.0" in text  # tokens/s: 600 generated over 2 s
    assert "ssh failed: ssh: connect to host: refused" in text
    assert "25.0 %" in text and "500 ms" in text


def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        monitor.main(["--stack", "sim", "--every", "0.1"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("--every 0.1: out of range; fix: give 0.5 to 3600 seconds")
    assert monitor.main(["--stack", "nope", "--once"]) == 2
    assert "stack = 'nope'" in capsys.readouterr().err
