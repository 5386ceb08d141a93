"""Specs: pure functions from config (and facts) to commands and container specs.

Table-driven, pyinfra style: config + fake facts -> exact problems / commands."""

from __future__ import annotations

import copy
import json
import os
import shlex
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sparkvllm import scripts
from sparkvllm.config import StackConfig, load_stack_config
from sparkvllm.probes import ray_members
from sparkvllm.specs import commands, containers, plans
from sparkvllm.specs.environment import NON_CARRY_OVER, node_env
from sparkvllm.specs.facts import check_facts, facts_command, parse_facts, warnings_for
from sparkvllm.specs.health import health_report
from sparkvllm.specs.output import (
    NodesDisagreeError,
    key_values,
    last_json,
    same_on_every_node,
)
from tests.conftest import TEST_PRIVATE_KEY, four_node_raw, hf_snapshot
from tests.pulumi_mocks import healthy_facts


@pytest.fixture
def cfg(spark_raw: dict[str, Any]) -> StackConfig:
    return load_stack_config(spark_raw)


# --- facts ------------------------------------------------------------------------------

FACT_CASES = [
    ("healthy", {}, []),
    (
        "wrong arch",
        {"arch": "x86_64"},
        ["node spark-2: arch is 'x86_64' but the image is built for 'aarch64'"],
    ),
    (
        "no docker",
        {"docker_version": "", "docker_api": ""},
        ["node spark-2: docker is absent or its engine is not running"],
    ),
    ("old docker", {"docker_api": "1.40"}, ["node spark-2: docker API 1.40 is older than 1.41"]),
    ("no gpu", {"gpu_count": "0"}, ["node spark-2: 0 GPU(s) visible to nvidia-smi, config says 1"]),
    (
        "missing netdev",
        {"netdev_present": "0", "netdev_addresses": "", "netdevs": "lo,enP7s7"},
        ["node spark-2: netdev 'enp1s0f1np1' does not exist (present: lo, enP7s7)"],
    ),
    ("netdev down", {"netdev_state": "down"}, ["node spark-2: netdev enp1s0f1np1 is 'down'"]),
    (
        "wrong address",
        {"netdev_addresses": "169.254.3.4"},
        ["node spark-2: netdev enp1s0f1np1 holds 169.254.3.4, not 192.168.100.11"],
    ),
    (
        "missing HCA",
        {"rdma_devices": "rocep1s0f1"},
        ["node spark-2: RoCE HCA(s) roceP2p1s0f1 not found (present: rocep1s0f1)"],
    ),
]


def _facts_text(cfg: StackConfig, node_index: int, changes: dict[str, str]) -> str:
    lines = healthy_facts(cfg, cfg.nodes[node_index]).splitlines()
    kv = dict(line.split("=", 1) for line in lines)
    kv.update(changes)
    return "\n".join(f"{k}={v}" for k, v in kv.items())


@pytest.mark.parametrize(
    ("changes", "expected"), [c[1:] for c in FACT_CASES], ids=[c[0] for c in FACT_CASES]
)
def test_fact_checks(cfg: StackConfig, changes: dict[str, str], expected: list[str]) -> None:
    facts = parse_facts(_facts_text(cfg, 1, changes))
    problems = check_facts(cfg, cfg.nodes[1], facts)
    assert len(problems) == len(expected)
    for problem, start in zip(problems, expected, strict=True):
        assert problem.startswith(start), problem
        assert "; fix: " in problem


def test_simulated_accelerator_needs_no_nvidia_smi(spark_raw: dict[str, Any]) -> None:
    spark_raw["accelerator"] = "simulated"
    cfg = load_stack_config(spark_raw)
    facts = parse_facts(_facts_text(cfg, 0, {"gpu_count": "0", "gpu_name": ""}))
    assert check_facts(cfg, cfg.nodes[0], facts) == []


def test_low_mtu_is_a_warning_not_an_error(cfg: StackConfig) -> None:
    facts = parse_facts(_facts_text(cfg, 0, {"netdev_mtu": "1500"}))
    assert check_facts(cfg, cfg.nodes[0], facts) == []
    assert warnings_for(cfg.nodes[0], facts) == [
        (
            "node spark-1: netdev enp1s0f1np1 MTU is 1500, expected 9000; NCCL bandwidth suffers "
            "without jumbo frames"
        )
    ]


def test_facts_command_runs_here_and_parses(cfg: StackConfig) -> None:
    """The real script on this machine: it must never fail for a missing tool or netdev."""
    out = subprocess.run(
        ["bash", "-c", facts_command(cfg, cfg.nodes[0])], capture_output=True, text=True, check=True
    )
    facts = parse_facts(out.stdout)
    assert (
        facts.arch == subprocess.run(["uname", "-m"], capture_output=True, text=True).stdout.strip()
    )
    assert facts.mem_total_kb > 0
    assert "lo" in facts.netdevs
    assert facts.netdev_present is False  # no enp1s0f1np1 here


# --- environment and containers -----------------------------------------------------------


def test_four_nodes_each_keep_their_own_values(spark_raw: dict[str, Any]) -> None:
    cfg = load_stack_config(four_node_raw(spark_raw))
    envs = [node_env(cfg, n) for n in cfg.nodes]
    assert [e["VLLM_HOST_IP"] for e in envs] == [f"192.168.100.{10 + i}" for i in range(4)]
    assert [e["NCCL_SOCKET_IFNAME"] for e in envs] == [f"enp1s0f{i % 2}np{i}" for i in range(4)]
    workers = [containers.ray_worker(cfg, "s", n) for n in cfg.worker_nodes]
    assert [w.env["GLOO_SOCKET_IFNAME"] for w in workers] == [
        "enp1s0f1np1",
        "enp1s0f0np2",
        "enp1s0f1np3",
    ]
    assert all("--address=192.168.100.10:6379" in w.command for w in workers)
    # Every per-node variable is on vLLM's do-not-copy list.
    per_node = {k for k in envs[0] if envs[0][k] != envs[1][k]}
    assert per_node <= set(NON_CARRY_OVER)


def test_one_table_of_program_variables(cfg: StackConfig) -> None:
    """The refused vllm.env keys, vLLM's non-carry-over list and each node's own variables
    all come from config.PROGRAM_VARIABLES (a name added there reaches all three)."""
    from sparkvllm.config import PROGRAM_VARIABLES, RESERVED_ENV

    assert list(RESERVED_ENV) == [v.name for v in PROGRAM_VARIABLES]
    assert set(NON_CARRY_OVER) == {v.name for v in PROGRAM_VARIABLES if v.per_node}
    with_rdma = node_env(cfg, cfg.nodes[0])
    assert cfg.nodes[0].cluster_link.roce_hcas
    assert set(NON_CARRY_OVER) <= set(with_rdma)
    # Every program variable a node's containers carry is refused in vllm.env.
    assert set(with_rdma) - set(RESERVED_ENV) == {"HF_HOME", "RAY_memory_monitor_refresh_ms"}


def test_serve_args_follow_the_typed_options(cfg: StackConfig) -> None:
    args = containers.vllm_serve_args(cfg)
    assert args[:3] == ["vllm", "serve", "Qwen/Qwen3.5-122B-A10B-FP8"]
    assert '--speculative-config={"method":"mtp","num_speculative_tokens":1}' in args
    assert "--kv-cache-dtype=fp8" in args and "--enable-prefix-caching" in args
    assert not any(a.startswith("--api-key") for a in args)


def test_server_entrypoint_writes_non_carry_list_then_execs_serve(cfg: StackConfig) -> None:
    spec = containers.model_server(cfg, "spark")
    assert spec.entrypoint == ("bash", "-c")
    script = spec.command[0]
    written, _, rest = script.rpartition("\nexec ")
    assert shlex.split(rest) == containers.vllm_serve_args(cfg)
    payload = shlex.split(written.split("printf '%s' ", 1)[1])[0]
    assert json.loads(payload) == list(NON_CARRY_OVER)
    assert spec.env["RAY_ADDRESS"] == "192.168.100.10:6379"
    assert spec.pid_mode == "host"
    assert spec.restart == "unless-stopped" and spec.max_retry_count is None


def _start(script: str, starts: Path, exit_code: int) -> subprocess.CompletedProcess[str]:
    """One container start: the entrypoint with its count file at `starts` and `vllm
    serve` standing in as a process that exits `exit_code` (no server, so /health never
    answers)."""
    body = script.replace("${HOME:-/root}/.sparkvllm/server-starts", str(starts))
    body = body.rpartition("\nexec ")[0] + f"\nexit {exit_code}"
    body = body.replace("mkdir -p /root/.config/vllm", f"mkdir -p {starts.parent}/cfg")
    body = body.replace("/root/.config/vllm/", f"{starts.parent}/cfg/")
    # The watcher that zeroes the count once /health answers never would here.
    body = "\n".join(line for line in body.splitlines() if not line.startswith("( until "))
    proc = subprocess.Popen(["bash", "-c", body], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=6)
        return subprocess.CompletedProcess([], proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # it and the sleep it waits on
        out, err = proc.communicate()
        return subprocess.CompletedProcess([], -1, out, err)


def test_server_starts_are_bounded_per_boot(cfg: StackConfig, tmp_path: Path) -> None:
    """Three starts that never answered; the fourth waits, saying why, instead of
    starting again; a new boot (another boot_id) counts afresh."""
    script = containers.model_server(cfg, "spark").command[0]
    starts = tmp_path / "starts"
    codes = [_start(script, starts, 1).returncode for _ in range(containers.SERVER_STARTS_BOUND)]
    assert codes == [1] * containers.SERVER_STARTS_BOUND
    gave_up = _start(script, starts, 1)
    assert gave_up.returncode == -1, "it waits, doing nothing"
    assert f"{containers.GAVE_UP} {containers.SERVER_STARTS_BOUND} times" in gave_up.stderr
    starts.write_text("another-boot 3\n")
    assert _start(script, starts, 1).returncode == 1, "a reboot starts counting afresh"


def test_command_output_is_read_one_way() -> None:
    """key=value lines (dotted and dashed keys; a log line holding `=` is not one), the
    last JSON line, and the value every node must share."""
    out = "Loaded image: sparkvllm/x=1\npeer.spark-2.tcp=ok\n id = a b \nid=sha256:c\n"
    assert key_values(out) == {"peer.spark-2.tcp": "ok", "id": "sha256:c"}
    assert last_json('{"a": 1}\nwaiting\n{"b": 2}\n{broken\n') == {"b": 2}
    with pytest.raises(NodesDisagreeError, match="spark-2=missing"):
        same_on_every_node({"spark-1": "ab", "spark-2": ""}, "image differs")


def test_api_key_is_a_named_secret_never_a_value(spark_raw: dict[str, Any]) -> None:
    spark_raw["api_key"] = "sk-x-5b9e1c0d"
    spec = containers.model_server(load_stack_config(spark_raw), "spark")
    assert spec.secret_env == ("VLLM_API_KEY",)
    assert "sk-x" not in json.dumps(spec.env) + " ".join(spec.command)


# --- commands -----------------------------------------------------------------------------


def _all_commands(cfg: StackConfig) -> list[commands.CommandSpec]:
    return [
        commands.image_obtain(cfg),
        *(commands.image_sync(cfg, n, n.ssh.host_key) for n in cfg.worker_nodes),
        commands.ray_ready(cfg, "sparkvllm-spark-ray-head"),
        commands.server_ready(cfg, "sparkvllm-spark-model-server"),
    ]


def test_every_command_is_valid_bash(cfg: StackConfig) -> None:
    for spec in [
        *_all_commands(cfg),
        commands.CommandSpec("f", "n", facts_command(cfg, cfg.nodes[0])),
    ]:
        subprocess.run(["bash", "-n", "-c", spec.create], check=True)


@pytest.mark.parametrize(
    ("image", "expect"),
    [
        ({"ref": "r:1", "source": "pull"}, "docker pull r:1"),
        ({"ref": "r:1", "source": "tarball", "tarball": "/dev/null"}, "docker load -i /dev/null"),
        ({"ref": "r:1", "source": "present"}, "is not present on spark-1"),
    ],
)
def test_obtain_only_when_absent(
    spark_raw: dict[str, Any], tmp_path: Path, image: dict[str, Any], expect: str
) -> None:
    """Run with a docker stub that logs its calls: an absent image is obtained (or the
    step says it is not there), a present one is not touched."""
    spark_raw["image"] = image
    create = commands.image_obtain(load_stack_config(spark_raw)).create
    log = tmp_path / "docker.log"
    fake = tmp_path / "docker"
    fake.write_text(
        "#!/bin/bash\n"
        f'echo "docker $*" >> {log}\n'
        'case "$*" in "image inspect"*) [ -e "$HERE" ] || exit 1; echo sha256:i1;; esac\n'
        f'case "$*" in pull*|load*) touch "$HERE";; esac\n'
    )
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "HERE": str(tmp_path / "present")}
    out = subprocess.run(["bash", "-c", create], capture_output=True, text=True, env=env)
    assert expect in log.read_text() + out.stderr
    # A tag (no digest pinned): nothing is tagged or checked for a digest.
    assert "docker tag" not in log.read_text() and "RepoDigests" not in log.read_text()
    if image["source"] != "present":
        assert out.returncode == 0, out.stderr
        assert "fingerprint=" in out.stdout
        log.unlink()
        again = subprocess.run(["bash", "-c", create], capture_output=True, text=True, env=env)
        assert again.returncode == 0 and "pull" not in log.read_text()
        assert "load" not in log.read_text()


def test_sync_streams_over_the_cluster_link_with_verified_host_key(cfg: StackConfig) -> None:
    target = cfg.nodes[1]
    spec = commands.image_sync(cfg, target, target.ssh.host_key)
    assert spec.node == "spark-1" and spec.stdin_secret == "ssh_private_key"
    # The cluster address, not the LAN; the user, port and host key given at run time.
    assert "readonly TARGET_ADDRESS='192.168.100.11'" in spec.create
    assert '-p "$PEER_PORT" -l "$PEER_USER" -- "$TARGET_ADDRESS"' in spec.create
    assert "StrictHostKeyChecking=yes" in spec.create
    assert dict(spec.env) == {"PEER_USER": "aurora", "PEER_PORT": "22",
                              "PEER_HOST_KEY": target.ssh.host_key}  # fmt: skip
    assert "aurora" not in spec.create and "AAAA" not in spec.create
    assert "readonly REF='hellohal2064/vllm-qwen3.5-gb10:latest'" in spec.create
    # The stream over connections of its own (as many as the head's cores, at most
    # MAX_STREAMS), with a cipher fast on the CPU.
    assert 'load_there() { stripe_to_peer "$streams" "$STRIPE" "docker load"; }' in spec.create
    assert 'docker save "$REF" | load_there >&2' in spec.create
    assert f"readonly MAX_STREAMS='{commands.MAX_STREAMS}'" in spec.create
    assert 'if [ "$src" != "$dst" ]; then' in spec.create  # equal fingerprints: no transfer
    assert "PRIVATE KEY" not in spec.create


def test_sync_without_host_key_verification_is_explicit(spark_raw: dict[str, Any]) -> None:
    spark_raw["nodes"][1]["ssh"] = {"host": "10.1.230.181", "user": "aurora",
                                    "verify_host_key": False}  # fmt: skip
    cfg = load_stack_config(spark_raw)
    spec = commands.image_sync(cfg, cfg.nodes[1], None)
    assert "StrictHostKeyChecking=no" in spec.create
    assert "StrictHostKeyChecking=yes" not in spec.create


def test_fingerprint_script_is_storage_independent_and_empty_when_absent() -> None:
    script = commands.fingerprint_script("img:1")
    assert ".RootFS.Layers" in script and ".Id" not in script
    # Absent image (no docker here either): prints nothing, so "absent" never matches.
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert out.stdout == ""


def test_waits_are_bounded_and_expect_every_node(spark_raw: dict[str, Any]) -> None:
    cfg = load_stack_config(four_node_raw(spark_raw))
    spec = commands.ray_ready(cfg, "sparkvllm-spark-ray-head")
    assert "('192.168.100.10,192.168.100.11,192.168.100.12,192.168.100.13' '4' " in spec.create
    assert spec.stdin is not None and "def summarize" in spec.stdin
    assert spec.timeout_s > cfg.timeouts.ray_ready_s


# --- probes and health --------------------------------------------------------------------


def _ray_node(ip: str, gpus: float, alive: bool = True) -> dict[str, Any]:
    return {
        "Alive": alive,
        "NodeManagerAddress": ip,
        "NodeManagerHostname": ip,
        "Resources": {"GPU": gpus},
    }


@pytest.mark.parametrize(
    ("nodes", "complete", "missing", "unexpected"),
    [
        ([_ray_node("10.0.0.1", 1), _ray_node("10.0.0.2", 1)], True, [], []),
        ([_ray_node("10.0.0.1", 1)], False, ["10.0.0.2"], []),
        (
            [_ray_node("10.0.0.1", 1), _ray_node("10.0.0.2", 1, alive=False)],
            False,
            ["10.0.0.2"],
            [],
        ),
        # The placement-group hang: a node joined under its LAN address.
        (
            [_ray_node("10.0.0.1", 1), _ray_node("172.16.0.9", 1)],
            False,
            ["10.0.0.2"],
            ["172.16.0.9"],
        ),
        ([_ray_node("10.0.0.1", 1), _ray_node("10.0.0.2", 0)], False, [], []),
        # A restarted worker's old raylet is still "alive": not settled yet.
        (
            [_ray_node("10.0.0.1", 1), _ray_node("10.0.0.2", 1), _ray_node("10.0.0.2", 1)],
            False,
            [],
            [],
        ),
    ],
)
def test_ray_membership(
    nodes: list[dict[str, Any]], complete: bool, missing: list[str], unexpected: list[str]
) -> None:
    report = ray_members.summarize(nodes, ["10.0.0.1", "10.0.0.2"], 2)
    assert (report["complete"], report["missing"], report["unexpected"]) == (
        complete,
        missing,
        unexpected,
    )


def test_ray_membership_counts_and_binds_the_stacks_own_nodes_only() -> None:
    """A node that is not the stack's (one just removed from the config) adds no GPU and
    is not among the raylets the server is bound to nor in the nodes the health output
    reports; its ID is there to drain it."""
    nodes = [_ray_node("10.0.0.1", 0), _ray_node("10.0.0.2", 1), _ray_node("10.0.0.3", 1)]
    for i, n in enumerate(nodes):
        n["NodeID"] = f"id{i}"
    report = ray_members.summarize(nodes, ["10.0.0.1", "10.0.0.2"], 2)
    assert report["complete"] is False  # the head's GPU is missing; the third's does not count
    assert (report["alive"], report["gpus"]) == (2, 1)
    assert [n["ip"] for n in report["nodes"]] == ["10.0.0.1", "10.0.0.2"]
    assert report["node_ids"] == ["id0", "id1"]
    assert (report["unexpected"], report["unexpected_ids"]) == (["10.0.0.3"], ["id2"])


def test_a_raylet_whose_port_refuses_is_dead_at_once() -> None:
    """A worker's container was replaced: the GCS still lists its old raylet as alive
    (until it misses its health checks), and the new one has registered. The old one's
    node manager port refuses (on loopback here: a closed port), so the wait takes the new
    one only; a raylet that listens stays."""
    import socket

    with socket.socket() as live, socket.socket() as gone:
        live.bind(("127.0.0.1", 0))
        live.listen()
        gone.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        head = {**_ray_node("10.0.0.1", 1), "NodeID": "head"}  # no port known: not probed
        new = {**_ray_node("127.0.0.1", 1), "NodeID": "new",
               "NodeManagerPort": live.getsockname()[1]}  # fmt: skip
        old = {**new, "NodeID": "old", "NodeManagerPort": gone.getsockname()[1]}
        nodes = [head, old, new]
        assert ray_members.summarize(nodes, ["10.0.0.1", "127.0.0.1"], 2)["complete"] is False
        dead = ray_members.refused(nodes)
    assert dead == ["old"]
    report = ray_members.summarize(ray_members.without(nodes, dead), ["10.0.0.1", "127.0.0.1"], 2)
    assert report["complete"] is True and report["node_ids"] == ["head", "new"]


@pytest.mark.parametrize(
    ("mode", "rc", "drained", "not_drained"),
    [
        (["drain"], 0, ["id2"], []),
        ([], 0, [], []),  # the read-back: only reads
        (["drain"], 1, ["id2"], ["id2"]),  # a Ray without drain-node: said, not blocking
    ],
)
def test_the_wait_drains_the_nodes_that_are_not_the_stacks_and_a_read_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    mode: list[str], rc: int, drained: list[str], not_drained: list[str],
) -> None:  # fmt: skip
    """The probe's main on a stand-in `ray` module (three alive nodes, the third not the
    stack's) and a stand-in `ray` CLI that logs its arguments."""
    import sys
    import types

    nodes = [_ray_node("10.0.0.1", 1), _ray_node("10.0.0.2", 1), _ray_node("10.0.0.3", 1)]
    for i, n in enumerate(nodes):
        n["NodeID"] = f"id{i}"
    fake = types.SimpleNamespace(init=lambda **_k: None, shutdown=lambda: None,
                                 nodes=lambda: nodes, __version__="2.60.0")  # fmt: skip
    monkeypatch.setitem(sys.modules, "ray", fake)
    log = tmp_path / "ray.log"
    cli = tmp_path / "ray"
    cli.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexit {rc}\n')
    cli.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert ray_members.main(["-", "10.0.0.1,10.0.0.2", "2", *mode]) == 0
    report = json.loads(capsys.readouterr().out)
    calls = log.read_text().splitlines() if log.exists() else []
    assert [c.split()[2] for c in calls] == drained
    for c in calls:
        assert c.startswith("drain-node --node-id ") and "DRAIN_NODE_REASON_PREEMPTION" in c
    assert report["complete"] is True and report["unexpected"] == ["10.0.0.3"]
    assert report.get("not_drained", []) == not_drained


def test_health_report_needs_the_served_model_and_a_smoke_answer() -> None:
    ray_out = "progress line\n" + json.dumps(
        {"alive": 2, "gpus": 2.0, "nodes": [{"ip": "b"}, {"ip": "a"}]}
    )
    good: dict[str, Any] = {
        "ready": True,
        "models": ["m"],
        "vllm_version": "0.17.1",
        "smoke": {"ok": True, "text": "hi"},
    }
    assert health_report(ray_out, json.dumps(good), "m")["ready"] is True
    assert health_report(ray_out, json.dumps(good), "other")["ready"] is False
    bad_smoke = copy.deepcopy(good)
    bad_smoke["smoke"]["ok"] = False
    assert health_report(ray_out, json.dumps(bad_smoke), "m")["ready"] is False
    report = health_report(ray_out, "", "m")
    assert report["ready"] is False and report["ray"] == {
        "nodes": 2,
        "gpus": 2.0,
        "node_ips": ["a", "b"],
        "ray_version": "",
    }


def test_last_json_skips_progress_lines() -> None:
    assert last_json('waiting\n{"a": 1}\nnot json {\n') == {"a": 1}
    assert last_json("") == {}


# --- model support and weights ------------------------------------------------------------

SUPPORT_CASES = [
    ("supported", {"support": {"A": {"module": "qwen3_5", "module_file": True}}}, []),
    (
        "too old",
        {"vllm_version": "0.16.0", "architectures": ["Qwen3_5MoeForConditionalGeneration"]},
        [
            (
                "image hellohal2064/vllm-qwen3.5-gb10:latest has vLLM 0.16.0, which does not "
                "implement Qwen3_5MoeForConditionalGeneration (supported from 0.17.0); fix: use an "
                "image with vLLM >= 0.17.0"
            )
        ],
    ),
    (
        "module file missing",
        {"support": {"A": {"module": "qwen3_5", "module_file": False}}},
        ["image hellohal2064/vllm-qwen3.5-gb10:latest (vLLM 0.17.1) registers A in module qwen3_5"],
    ),
    (
        "no vllm",
        {"vllm_found": False},
        ["image hellohal2064/vllm-qwen3.5-gb10:latest contains no vLLM"],
    ),
    (
        "no config",
        {"error": "config.json of x is not in the HF cache"},
        ["cannot read the architectures"],
    ),
]


@pytest.mark.parametrize(
    ("change", "expected"), [c[1:] for c in SUPPORT_CASES], ids=[c[0] for c in SUPPORT_CASES]
)
def test_model_support_check(cfg: StackConfig, change: dict[str, Any], expected: list[str]) -> None:
    from sparkvllm.specs.model_support import check_model_support

    report = {"vllm_found": True, "vllm_version": "0.17.1", "architectures": ["A"], "support": {}}
    report.update(change)
    problems = check_model_support(cfg, "log line\n" + json.dumps(report))
    assert len(problems) == len(expected)
    for problem, start in zip(problems, expected, strict=True):
        assert problem.startswith(start), problem


def test_support_probe_finds_the_module_without_importing_vllm(tmp_path: Any) -> None:
    """The probe against a fake vllm package on disk whose __init__ would crash if run."""
    import sys

    pkg = tmp_path / "vllm"
    (pkg / "model_executor" / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise SystemExit('imported vllm')\n")
    (pkg / "model_executor" / "models" / "registry.py").write_text(
        '_MODELS = {\n    "Qwen3_5MoeForConditionalGeneration": ("qwen3_5", "Qwen3_5Moe"),\n}\n'
    )
    (pkg / "model_executor" / "models" / "qwen3_5.py").write_text("")
    snap = tmp_path / "hf" / "hub" / "models--Qwen--Q" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text('{"architectures": ["Qwen3_5MoeForConditionalGeneration"]}')
    (tmp_path / "hf" / "hub" / "models--Qwen--Q" / "refs").mkdir()
    (tmp_path / "hf" / "hub" / "models--Qwen--Q" / "refs" / "main").write_text("abc")
    from sparkvllm.probes import script

    out = subprocess.run(
        [sys.executable, "-", "Qwen/Q", "main", str(tmp_path / "hf"), "1"],
        input=script("vllm_support"),
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    report = json.loads(out.stdout)
    assert report["architectures"] == ["Qwen3_5MoeForConditionalGeneration"]
    assert report["support"] == {
        "Qwen3_5MoeForConditionalGeneration": {"module": "qwen3_5", "module_file": True}
    }


def test_weights_commands(cfg: StackConfig) -> None:
    from sparkvllm.specs import model_support, weights

    download = weights.weights_download(cfg, cfg.nodes[0])
    sync = weights.weights_sync(cfg, cfg.nodes[1], cfg.nodes[1].ssh.host_key)
    for spec in (download, sync, model_support.model_support(cfg)):
        subprocess.run(["bash", "-n", "-c", spec.create], check=True)
    assert "snapshot_download" in download.create
    assert sync.node == "spark-1" and sync.stdin_secret == "ssh_private_key"
    # Blob by blob, several at once, each over connections of its own (several per blob
    # when there are fewer blobs than streams, a small one over the shared connection;
    # tests/test_weights_copy.py runs it), then the layout by tar.
    assert 'via=(stripe_to_peer "$4" "$STRIPE" "$call" joins)' in sync.create
    assert 'tail -c +$((off + 1)) "$blobs/$b" | "${via[@]}"' in sync.create
    assert 'send_blob "$b" "$s" "$off" "$per" &' in sync.create
    # A small one: over the shared connection under SMALL bytes, else one of its own.
    assert 'send_blob "$b" "$s" "$off" 0 || failed=$?' in sync.create
    assert 'send_blob "$b" "$s" "$off" 1 &' in sync.create
    assert 'via=(remote "$call -")' in sync.create
    assert "readonly MAX_STREAMS='4'" in sync.create
    assert 'tar -C "$HUB_DIR" -cf - "${layout[@]}" | on_peer unpack "$HUB_DIR"' in sync.create
    assert "readonly HUB_DIR='/home/aurora/.cache/huggingface/hub'" in sync.create
    assert "readonly TARGET_ADDRESS='192.168.100.11'" in sync.create
    assert ("PEER_USER", "aurora") in sync.env


def test_manifest_follows_symlinks_and_sees_a_missing_blob(tmp_path: Any) -> None:
    """The real manifest function on an HF-style layout: a deleted blob changes it."""
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "abc"
    blobs.mkdir()
    snap.mkdir(parents=True)
    (blobs / "b1").write_bytes(b"x" * 1000)
    (blobs / "b2").write_bytes(b"y" * 10)
    (snap / "model.safetensors").symlink_to(blobs / "b1")
    (snap / "config.json").symlink_to(blobs / "b2")

    def manifest() -> str:
        return subprocess.run(
            ["bash", "-c", f'{scripts.load("lib/weights").body}\nmanifest "{snap}"'],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    before = manifest()
    assert len(before) == 64
    (blobs / "b1").unlink()
    assert manifest() not in (before, "")


# --- cluster link between nodes -------------------------------------------------------------

LINK_CASES = [
    ("healthy", {}, 0, 0),
    (
        "routed via the LAN",
        {"peer.spark-2.route": "192.168.100.11 via 10.1.230.1 dev enP7s7 src 10.1.230.180"},
        1,
        0,
    ),
    ("peer unreachable", {"peer.spark-2.tcp": "fail"}, 1, 0),
    ("no jumbo frames", {"peer.spark-2.mtu": "fail"}, 0, 1),
]


@pytest.mark.parametrize(
    ("changes", "n_problems", "n_warnings"),
    [c[1:] for c in LINK_CASES],
    ids=[c[0] for c in LINK_CASES],
)
def test_link_checks(
    cfg: StackConfig, changes: dict[str, str], n_problems: int, n_warnings: int
) -> None:
    from sparkvllm.specs.facts import check_links
    from tests.pulumi_mocks import healthy_links

    kv = dict(line.split("=", 1) for line in healthy_links(cfg, cfg.nodes[0]).splitlines())
    kv.update(changes)
    problems, warns = check_links(cfg, cfg.nodes[0], "\n".join(f"{k}={v}" for k, v in kv.items()))
    assert (len(problems), len(warns)) == (n_problems, n_warnings)
    for p in problems:
        assert p.startswith("node spark-1: ") and "; fix: " in p
    if changes.get("peer.spark-2.route"):
        assert (
            "leaves via enP7s7 from 10.1.230.180, not enp1s0f1np1 from 192.168.100.10"
            in problems[0]
        )


def test_links_command_runs_and_reports_each_peer(spark_raw: dict[str, Any]) -> None:
    """Runs here for real, with every peer on loopback (no traffic leaves this machine)."""
    from sparkvllm.specs.facts import links_script

    raw = four_node_raw(spark_raw)
    for i, n in enumerate(raw["nodes"]):
        n["cluster_link"]["address"] = f"127.0.0.{i + 1}"
        n["ssh"]["port"] = 9  # nothing listens: tcp=fail, quickly
    cfg = load_stack_config(raw)
    out = subprocess.run(
        ["bash", "-c", links_script(cfg, cfg.nodes[0]).text],
        capture_output=True,
        text=True,
        check=True,
    )
    keys = {line.split("=", 1)[0] for line in out.stdout.splitlines()}
    for peer in ("spark-2", "spark-3", "spark-4"):
        assert {f"peer.{peer}.route", f"peer.{peer}.tcp", f"peer.{peer}.mtu"} <= keys
    assert "peer.spark-2.tcp=fail" in out.stdout
    assert "peer.spark-1.route" not in keys


@pytest.mark.parametrize(
    ("log", "transport"),
    [
        ("NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0", "ib"),
        ("NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0", "socket"),
        ("NCCL INFO NET/IB : No device found.", "socket"),
        ("INFO Started server process", "unknown"),
    ],
)
def test_nccl_transport_is_read_from_the_server_logs(
    tmp_path: Any, log: str, transport: str
) -> None:
    from sparkvllm import scripts

    fake_docker = tmp_path / "docker"
    # `docker exec` (reading /proc): no process mapped a libnccl.
    fake_docker.write_text(f'#!/bin/sh\n[ "$1" = exec ] && exit 0\necho {shlex.quote(log)} >&2\n')
    fake_docker.chmod(0o755)
    out = subprocess.run(
        [
            "bash",
            "-c",
            scripts.load("lib/nccl_report").body + "\nnccl_transport srv; nccl_loaded srv",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
    )
    assert out.stdout.splitlines() == [f"nccl_transport={transport}", "nccl_loaded="]
    report = health_report("", '{"ready": true}\n' + out.stdout, "m")
    assert report["nccl_transport"] == transport and report["nccl_loaded"] == []


PIP_NCCL = "/opt/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"
HOST_NCCL = "/opt/sparkvllm/host-nccl/libnccl.so.2"


@pytest.mark.parametrize(
    ("mapped", "library"),
    [([], "none"), ([PIP_NCCL], "image"), ([HOST_NCCL], "host"), ([HOST_NCCL, PIP_NCCL], "both")],
)
def test_the_nccl_the_server_loaded_is_read_from_its_processes(
    tmp_path: Path, mapped: list[str], library: str
) -> None:
    """`docker exec` stands in for the server container: it prints its processes' maps
    (two processes mapping each library, and other libraries); the script names each
    libnccl file once, and the report says which library that is, with a warning when
    nccl.library host is not what runs."""
    from sparkvllm import scripts
    from sparkvllm.specs.versions import nccl_report

    lines = [f"7f00-7f10 r-xp 00000000 08:01 42 {p}" for p in mapped * 2]
    lines += [
        "7f20-7f30 r-xp 00000000 08:01 43 /usr/lib/x86_64-linux-gnu/libc.so.6",
        "7f40-7f50 rw-p 0 0 0",
    ]
    maps = tmp_path / "maps"
    maps.write_text("\n".join(lines) + "\n")
    fake = tmp_path / "docker"
    # The reading shell must not preload the host's library itself.
    fake.write_text(f'#!/bin/sh\n[ "$3" = LD_PRELOAD= ] || exit 9\ncat {maps}\n')
    fake.chmod(0o755)
    out = subprocess.run(
        ["bash", "-c", scripts.load("lib/nccl_report").body + "\nnccl_loaded srv"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
    )
    loaded = health_report("", '{"ready": true}\n' + out.stdout, "m")["nccl_loaded"]
    assert loaded == sorted(mapped)
    report = nccl_report("2.27.3+cuda12.9+pip:nvidia-nccl-cu12", {}, "ib", loaded, "host")
    assert report["library"] == library and report["loaded"] == loaded
    assert bool(report["warnings"]) == (library in ("image", "both")), report["warnings"]


def _download(
    cfg_raw: dict[str, Any], hf: Any, offline: bool = True
) -> subprocess.CompletedProcess[str]:
    """The download step's command here; `docker` is a stub that fails (nothing is pulled
    or run)."""
    from sparkvllm.specs.weights import weights_download

    raw = copy.deepcopy(cfg_raw)
    raw["model"].update(hf_cache=str(hf), offline=offline)
    c = load_stack_config(raw)
    stubs = Path(hf) / "stub-bin"
    stubs.mkdir(exist_ok=True)
    (stubs / "docker").write_text("#!/bin/sh\necho 'docker stub: not run' >&2\nexit 1\n")
    (stubs / "docker").chmod(0o755)
    return subprocess.run(
        ["bash", "-c", weights_download(c, c.nodes[0]).create],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}"},
    )


WEIGHT_GAP_CASES = [
    ("complete", [], None, ""),
    (
        "blob of a shard missing",
        ["model-00002-of-00002.safetensors"],
        None,
        "Missing: model-00002-of-00002.safetensors",
    ),
    ("config.json missing", ["config.json"], None, "Missing: config.json"),
    (
        "shard named by the index absent",
        [],
        ["model-00003-of-00003.safetensors"],
        "Missing: model-00003-of-00003.safetensors",
    ),
]


@pytest.mark.parametrize(
    ("remove_blobs", "extra_index", "expected"),
    [c[1:] for c in WEIGHT_GAP_CASES],
    ids=[c[0] for c in WEIGHT_GAP_CASES],
)
def test_weights_download_finds_what_an_offline_snapshot_lacks(
    spark_raw: dict[str, Any],
    tmp_path: Any,
    remove_blobs: list[str],
    extra_index: list[str] | None,
    expected: str,
) -> None:
    """The real command on a real HF layout (offline: it never starts a container)."""
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    files = {"config.json": b"{}", **{s: b"w" * 100 for s in shards}}
    snap = hf_snapshot(tmp_path / "hf", files, index=shards + (extra_index or []))
    for name in remove_blobs:
        (snap / name).resolve().unlink()
    out = _download(spark_raw, tmp_path / "hf")
    if not expected:
        assert out.returncode == 0, out.stderr
        kv = key_values(out.stdout)
        assert kv["files"] == "4" and len(kv["manifest"]) == 64
    else:
        assert out.returncode == 1
        assert "model Qwen/Qwen3.5-122B-A10B-FP8@main in" in out.stderr
        assert "on spark-1 is incomplete and model.offline is true" in out.stderr
        assert expected in out.stderr


# --- versions across nodes and the workstation ---------------------------------------------

GOOD = {"python": "3.12.3", "ray": "2.60.0", "torch": "2.9.0", "vllm": "0.17.1", "nccl": "2.27.3"}


def test_versions_agree(cfg: StackConfig) -> None:
    from sparkvllm.specs.versions import agreed_versions

    out = {"spark-1": "noise\n" + json.dumps(GOOD), "spark-2": json.dumps(GOOD)}
    assert agreed_versions(cfg, out) == GOOD


@pytest.mark.parametrize(
    ("spark2", "message"),
    [
        (
            {"ray": "2.54.0"},
            "versions differ across nodes: ray: spark-1=2.60.0, spark-2=2.54.0; fix:",
        ),
        (
            {"vllm": "0.16.0", "python": "3.11.9"},
            "python: spark-1=3.12.3, spark-2=3.11.9; vllm: spark-1=0.17.1, spark-2=0.16.0",
        ),
        # Under launcher auto an image without Ray is fine, but not on one node only.
        ({"ray": ""}, "versions differ across nodes: ray: spark-1=2.60.0, spark-2=none"),
        (
            {"ray": "", "launcher": "ray"},
            "image versions: spark-2: image hellohal2064/vllm-qwen3.5-gb10:latest has no ray",
        ),
    ],
)
def test_versions_that_differ_name_each_node(
    spark_raw: dict[str, Any], spark2: dict[str, str], message: str
) -> None:
    from sparkvllm.specs.versions import agreed_versions

    spark2 = dict(spark2)
    if launcher := spark2.pop("launcher", None):
        spark_raw["parallelism"] = {**spark_raw["parallelism"], "launcher": launcher}
    cfg = load_stack_config(spark_raw)
    out = {"spark-1": json.dumps(GOOD), "spark-2": json.dumps({**GOOD, **spark2})}
    with pytest.raises(NodesDisagreeError) as err:
        agreed_versions(cfg, out)
    assert message in str(err.value)


def test_versions_probe_reads_metadata_here() -> None:
    """The probe itself, run by this interpreter: reports Python, and Ray (a dependency)."""
    import platform
    import sys
    from importlib.metadata import version

    from sparkvllm.probes import script

    out = subprocess.run(
        [sys.executable, "-"], input=script("image_versions"), capture_output=True, text=True
    )
    report = json.loads(out.stdout)
    assert report["python"] == platform.python_version()
    assert report["ray"] == version("ray")
    assert set(report) == {"python", "ray", "torch", "vllm", "nccl"}


def test_nccl_of_an_image_reads_the_pip_wheel_or_the_newest_system_library(
    tmp_path: Path,
) -> None:
    """Without importing anything: a libnccl.so.X.Y.Z file name gives the release."""
    from sparkvllm.probes import image_versions

    lib = tmp_path / "usr" / "lib" / "aarch64-linux-gnu"
    lib.mkdir(parents=True)
    for name in ("libnccl.so.2", "libnccl.so.2.9.9", "libnccl.so.2.21.5"):
        (lib / name).touch()
    assert image_versions.system_nccl((str(lib / "libnccl.so.*"),)) == "2.21.5"
    assert image_versions.system_nccl((str(tmp_path / "none" / "libnccl.so.*"),)) == ""


@pytest.mark.parametrize(
    ("here", "problem"),
    [
        ({"python": "3.12.8", "ray": "2.60.0"}, ""),
        ({"python": "3.11.7", "ray": "2.60.0"}, "python 3.11.7 here, 3.12.3 on the cluster"),
        ({"python": "3.12.3", "ray": "2.54.0"}, "ray 2.54.0 here, 2.60.0 on the cluster"),
        ({"python": "3.12.3", "ray": ""}, "no ray installed on the workstation"),
    ],
)
def test_ray_client_compatibility(here: dict[str, str], problem: str) -> None:
    from sparkvllm.specs.versions import ray_client_compatibility

    found = ray_client_compatibility(GOOD, here)
    assert (found == "") == (problem == "")
    assert problem in found


def test_ray_dashboard_binds_to_the_cluster_link_unless_exposed(spark_raw: dict[str, Any]) -> None:
    cfg = load_stack_config(spark_raw)
    assert "--dashboard-host=192.168.100.10" in containers.ray_head(cfg, "s").command
    assert [w for w in containers.exposure_warnings(cfg) if "Ray dashboard" in w] == []
    spark_raw["expose_ray_dashboard"] = True
    exposed = load_stack_config(spark_raw)
    assert "--dashboard-host=0.0.0.0" in containers.ray_head(exposed, "s").command
    url, tunnel = containers.dashboard_access(exposed)
    assert url == "http://10.1.230.180:8265"
    assert tunnel == "ssh -N -L 8265:127.0.0.1:8265 -p 22 -l aurora -- 10.1.230.180"
    assert any("Jobs API runs any code" in w for w in containers.exposure_warnings(exposed))
    spark_raw["parallelism"]["launcher"] = "native"  # no Ray, no dashboard: nothing said
    native = containers.exposure_warnings(load_stack_config(spark_raw))
    assert [w for w in native if "Ray dashboard" in w] == []


def test_the_dashboard_warning_names_the_ray_models_head(spark_raw: dict[str, Any]) -> None:
    """In a set, Ray's head is the Ray model's rank 0, not the stack's head."""
    from tests.test_models_config import two_models

    raw = two_models(spark_raw)
    raw["expose_ray_dashboard"] = True
    raw["models"][0]["nodes"] = ["spark-2", "spark-1"]
    raw["models"][0]["parallelism"]["launcher"] = "ray"
    raw["models"][1]["nodes"] = ["spark-1"]
    raw["models"][0]["vllm"]["gpu_memory_utilization"] = 0.5
    (said,) = [w for w in containers.exposure_warnings(load_stack_config(raw)) if "Ray" in w]
    assert "0.0.0.0:8265 of spark-2" in said, said


def test_an_api_without_a_key_warns_and_with_one_does_not(spark_raw: dict[str, Any]) -> None:
    warned = containers.exposure_warnings(load_stack_config(spark_raw))
    assert any("0.0.0.0:8000 of spark-1 with no api_key" in w for w in warned)
    spark_raw["api_key"] = "k" * 32
    assert containers.exposure_warnings(load_stack_config(spark_raw)) == []


# --- pinned images ------------------------------------------------------------------------

DIGEST = "sha256:" + "ab" * 32

FAKE_DOCKER = """#!/bin/bash
# A stand-in docker for image_obtain: images live as files under $IMAGES.
echo "$*" >> "$IMAGES/calls"
key() { printf '%s' "$1" | tr '/:@' '___'; }
case "$1 $2" in
  "image inspect")
    ref="${@: -1}"
    [ -f "$IMAGES/$(key "$ref")" ] || exit 1
    case "$*" in
      *RepoDigests*) cat "$IMAGES/$(key "$ref")";;
      *) echo "sha256:1111";;
    esac;;
  "pull "*) printf '%s\\n' "$REPO_DIGEST" > "$IMAGES/$(key "$2")";;
  "tag "*) cp "$IMAGES/$(key "$2")" "$IMAGES/$(key "$3")";;
esac
"""


def _obtain(spec: commands.CommandSpec, tmp_path: Path, repo_digest: str) -> Any:
    bin_dir, images = tmp_path / "bin", tmp_path / "images"
    bin_dir.mkdir(parents=True, exist_ok=True)
    images.mkdir(parents=True, exist_ok=True)
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "IMAGES": str(images), "REPO_DIGEST": repo_digest}
    return subprocess.run(["bash", "-c", spec.create], env=env, capture_output=True, text=True)


@pytest.mark.parametrize(
    ("ref", "digest", "local", "moving"),
    [
        ("a/b:latest", None, "a/b:latest", True),
        ("a/b", None, "a/b", True),
        ("reg:5000/a/b:v1", None, "reg:5000/a/b:v1", False),
        (f"a/b:v1@{DIGEST}", DIGEST, f"a/b:sha256-{'ab' * 32}", False),
        (f"reg:5000/a/b@{DIGEST}", DIGEST, f"reg:5000/a/b:sha256-{'ab' * 32}", False),
    ],
)
def test_image_reference_parts(ref: str, digest: str | None, local: str, moving: bool) -> None:
    from sparkvllm.config import ImageConfig

    img = ImageConfig(ref=ref)
    assert (img.digest, img.local_ref, img.moving) == (digest, local, moving)


def test_a_pinned_image_is_pulled_by_digest_tagged_and_checked(
    spark_raw: dict[str, Any], tmp_path: Path
) -> None:
    """Pulled by its digest, tagged `repo:sha256-<hex>` (what every node runs: docker load
    carries tags, not digests), and refused when the tag holds another digest."""
    spark_raw["image"]["ref"] = f"hellohal2064/vllm-qwen3.5-gb10@{DIGEST}"
    cfg = load_stack_config(spark_raw)
    spec = commands.image_obtain(cfg)
    ok = _obtain(spec, tmp_path / "ok", f"hellohal2064/vllm-qwen3.5-gb10@{DIGEST}")
    assert ok.returncode == 0, ok.stderr
    calls = (tmp_path / "ok" / "images" / "calls").read_text()
    assert f"pull hellohal2064/vllm-qwen3.5-gb10@{DIGEST}" in calls
    assert f"tag hellohal2064/vllm-qwen3.5-gb10@{DIGEST} {cfg.image.local_ref}" in calls
    assert "fingerprint=" in ok.stdout
    bad = _obtain(spec, tmp_path / "bad", "hellohal2064/vllm-qwen3.5-gb10@sha256:" + "cd" * 32)
    assert bad.returncode == 1
    assert f"is not hellohal2064/vllm-qwen3.5-gb10@{DIGEST}; fix:" in bad.stderr
    # Every other step and container uses the local tag.
    plan = plans.image(cfg, {})
    assert plan.support is not None
    for step in [*plan.streams.values(), *plan.versions.values(), plan.support]:
        assert cfg.image.local_ref in step.create and DIGEST not in step.create.replace(
            cfg.image.local_ref, ""
        )
    assert plan.ref == cfg.image.local_ref


@pytest.mark.parametrize(
    ("ref", "source", "warned"),
    [
        ("a/b:latest", "pull", True),
        ("a/b", "pull", True),
        ("a/b:v1", "pull", False),
        (f"a/b@{DIGEST}", "pull", False),
        ("a/b:latest", "present", False),
    ],
)
def test_a_moving_tag_warns(spark_raw: dict[str, Any], ref: str, source: str, warned: bool) -> None:
    spark_raw["image"]["ref"], spark_raw["image"]["source"] = ref, source
    spark_raw["api_key"] = "sk-quiet-12345"
    said = plans.warnings(load_stack_config(spark_raw))
    assert any("moving tag" in w and "@sha256:" in w for w in said) == warned, said


def test_nccl_build_is_read_from_the_librarys_own_version_string(tmp_path: Path) -> None:
    """The release and the CUDA it was built for, from the string compiled into the .so
    (image side: the probe; host side: the facts' bash), else the file name's release."""
    import subprocess

    from sparkvllm.probes import image_versions
    from sparkvllm.specs.versions import nccl_report

    lib = tmp_path / "lib"
    lib.mkdir()
    # The string straddles a 1 MiB read boundary: found all the same.
    (lib / "libnccl.so.2.27.3").write_bytes(
        b"\x7fELF" + b"\0" * ((1 << 20) - 10) + b"NCCL version 2.27.3+cuda12.9\0" + b"\1" * 99
    )
    (lib / "libnccl.so.2.21.5").write_bytes(b"\x7fELF no version string here")
    assert image_versions.nccl_build(str(lib / "libnccl.so.2.27.3")) == "2.27.3+cuda12.9"
    assert image_versions.system_nccl((str(lib / "libnccl.so.*"),)) == "2.27.3+cuda12.9"

    library = scripts.load("lib/nccl_library").body

    def host(globs: tuple[str, ...]) -> str:
        done = subprocess.run(
            ["bash", "-c", f'set -euo pipefail\n{library}\nnccl_host "$@"', "_", *globs],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return done.stdout.strip()

    assert host((str(lib / "libnccl.so.*"),)) == "nccl_host=2.27.3+cuda12.9"
    (lib / "libnccl.so.2.27.3").unlink()
    assert host((str(lib / "libnccl.so.*"),)) == "nccl_host=2.21.5"  # no string: the name's
    assert host((str(tmp_path / "none" / "libnccl.so.*"),)) == "nccl_host="
    image = "2.27.3+cuda12.9+pip:nvidia-nccl-cu12"
    assert nccl_report(image, {"a": "2.27.3+cuda12.9"}, "ib")["warnings"] == []
    (warning,) = nccl_report(image, {"a": "2.21.5+cuda12.2"}, "ib")["warnings"]
    assert "the host's NCCL is 2.21.5+cuda12.2, the image's 2.27.3" in warning


@pytest.mark.parametrize("offline", [True, False])
def test_weights_download_checks_every_blob_by_its_checksum(
    spark_raw: dict[str, Any], tmp_path: Any, offline: bool
) -> None:
    """A blob named by its sha256 whose bytes changed: offline, an error naming it (the
    file is kept); online, it is removed so that the download fetches it again (here the
    download itself cannot run: no docker, so the step fails after removing it)."""
    import hashlib

    data = b"w" * 100
    snap = hf_snapshot(tmp_path / "hf", {"config.json": b"{}", "model.safetensors": data})
    good = snap.parent.parent / "blobs" / hashlib.sha256(data).hexdigest()
    (snap / "model.safetensors").resolve().rename(good)
    (snap / "model.safetensors").unlink()
    (snap / "model.safetensors").symlink_to(good)
    good.write_bytes(b"x" * 100)  # same size, other bytes

    out = _download(spark_raw, tmp_path / "hf", offline=offline)

    assert out.returncode != 0
    if offline:
        assert "blobs do not match their names (checksums) and model.offline is true" in (
            out.stderr
        )
        assert good.name in out.stderr and good.exists()
    else:
        assert f"removing blobs that do not match their checksums: {good.name}" in out.stderr
        assert not good.exists()


# ssh as far as the image sync needs it: options up to `--`, the host, then the command
# words run the way sshd runs them (joined, under a shell), marked as on the target.
_SSH_STUB = (
    '#!/bin/bash\nwhile [ "$1" != -- ]; do shift; done; shift 2\nON_TARGET=1 exec bash -c "$*"\n'
)
# docker as far as the sizes go: the image is on the head only, SIZE bytes; the target's
# data root is ROOT. Anything else (save, load) fails.
_DOCKER_STUB = """#!/bin/bash
case "$*" in
  "image inspect --format "*) [ -z "${ON_TARGET:-}" ] && echo '["sha256:aa"]';;
  "image inspect -f {{.Size}} "*) [ -z "${ON_TARGET:-}" ] && echo "$SIZE";;
  "info -f {{.DockerRootDir}}") [ -n "$ROOT" ] || exit 1; echo "$ROOT";;
  "image inspect -f {{json .RootFS.Layers}} "*) echo '["sha256:aa"]';;
  "image ls -q") ;;
  *) exit 1;;
esac
"""


@pytest.mark.parametrize(
    ("size", "root_known", "refused"),
    [(10**15, True, True), (1000, True, False), (10**15, False, False)],
    ids=["too big", "fits", "free space unknown"],
)
def test_image_sync_checks_the_targets_disk_before_it_streams(
    cfg: StackConfig, tmp_path: Path, size: int, root_known: bool, refused: bool
) -> None:
    """The real script with ssh and docker stubbed: an image bigger than the target's free
    space stops before `docker save` with node, need and have; a small one goes on; so
    does any image where the target's docker cannot say its data root (not refused as a
    full disk: the load then fails or not on its own)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name, text in (("ssh", _SSH_STUB), ("docker", _DOCKER_STUB)):
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    spec = commands.image_sync(cfg, cfg.nodes[1], cfg.nodes[1].ssh.host_key)
    out = subprocess.run(
        ["bash", "-c", spec.create],
        input=TEST_PRIVATE_KEY,
        capture_output=True,
        text=True,
        env={**os.environ, **dict(spec.env), "PATH": f"{bin_}:{os.environ['PATH']}",
             "SIZE": str(size), "ROOT": str(tmp_path / "docker-root") if root_known else ""},
    )  # fmt: skip
    assert out.returncode != 0  # the stub cannot save: the small image fails there
    last = out.stderr.strip().splitlines()[-1]
    if refused:
        assert last.startswith(
            f"not enough disk on spark-2 for the image {cfg.image.local_ref}: docker's data "
            "root needs 2.0 PB, has "
        )
        assert last.endswith("; fix: free space there (docker image prune; or move docker's "
                             "data-root to a bigger disk)")  # fmt: skip
    else:
        assert "not enough disk" not in out.stderr and "streaming" in out.stderr


def test_a_readiness_try_that_hangs_in_docker_exec_is_cut_off(
    tmp_path: Path, spark_raw: dict[str, Any]
) -> None:
    """A `docker exec` into a container restarted under it can hang for good (seen on the
    sim, in a crash loop): the try is watched, ended as soon as the container is no longer
    the one it entered, the loop reads the container again, and it ends saying it is not
    running. Here docker is a stub: the exec never returns, the container starts again
    (a new StartedAt) while it hangs, then has stopped; the try's own bound (600 s) is far
    beyond the test's timeout, so only the watch can end it."""
    fake = tmp_path / "docker"
    fake.write_text(
        "\n".join(
            [
                "#!/bin/bash",
                f"count={tmp_path}/count",
                'n=$(cat "$count" 2>/dev/null || echo 0); echo $((n + 1)) > "$count"',
                'case "$1" in',
                "  inspect)",
                '    case "$*" in',
                '      *StartedAt*) [ "$n" -lt 3 ] && echo "running T1" || echo "running T2";;',
                '      *) [ "$n" -lt 3 ] && echo running || echo exited;;',
                "    esac;;",
                "  exec) cat >/dev/null; exec sleep 600;;",
                "  logs) echo 'last line of the server';;",
                "esac",
            ]
        )
        + "\n"
    )
    fake.chmod(0o755)
    loop = scripts.render(
        "server_ready", CONTAINER="srv", PROBE_ARGS=[], BUDGET=900, TRY_S=600,
        GAVE_UP_MARK="gave up starting",
    ).text  # fmt: skip
    out = subprocess.run(
        ["bash", "-c", loop],
        input="print('probe')\n",
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
    )
    assert out.returncode == 1, out
    assert "srv is not running (exited)" in out.stderr and "last line" in out.stderr
    # The model server's wait is watched, within the probe's own bounds.
    create = commands.server_ready(load_stack_config(spark_raw), "srv").create
    assert "readonly CONTAINER='srv'" in create and "watched_try" in create
    assert f"readonly TRY_S='{commands.PROBE_TRY_S}'" in create


def test_the_image_name_step_prints_the_name_the_id_and_each_registry_digest(
    tmp_path: Path, spark_raw: dict[str, Any]
) -> None:
    """Run under bash with a docker stub: one `digest=` line a registry digest (none for
    an image built or loaded here), and the line a pin of one of them keeps it for."""
    raw = copy.deepcopy(spark_raw)
    cfg = load_stack_config(raw)
    repo = cfg.image.repository
    fake = tmp_path / "docker"
    fake.write_text(
        "#!/bin/bash\n"
        'case "$*" in\n'
        "  *RepoDigests*) printf '%s\\n' "
        f"{repo}@sha256:{'d' * 64} other/mirror@sha256:{'e' * 64} ''; echo;;\n"
        "  *) echo sha256:i1;;\n"
        "esac\n"
    )
    fake.chmod(0o755)
    spec = commands.image_name(cfg)
    out = subprocess.run(
        ["bash", "-c", spec.create],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
    ).stdout.splitlines()
    assert out == [
        f"name={cfg.image.local_ref}",
        "id=sha256:i1",
        f"digest={repo}@sha256:{'d' * 64}",
        f"digest=other/mirror@sha256:{'e' * 64}",
    ]
    assert commands.name_kept_for(cfg) is None  # a tag keeps nothing
    raw["image"]["ref"] = f"{repo}@sha256:{'d' * 64}"
    assert commands.name_kept_for(load_stack_config(raw)) in out


def _host_nccl(spark_raw: dict[str, Any], path: str | None = None) -> StackConfig:
    raw = copy.deepcopy(spark_raw)
    raw["nccl"] = {"library": "host", **({"host_path": path} if path else {})}
    return load_stack_config(raw)


def test_the_hosts_nccl_is_found_and_its_version_read_at_preflight(
    tmp_path: Path, spark_raw: dict[str, Any]
) -> None:
    """Under bash, on files of this test: the configured path (a symlink, as Debian's
    libnccl.so.2) resolves to its file and the version compiled into it; a missing one
    stops the node, naming node and path, before anything is deployed."""
    lib = tmp_path / "libnccl.so.2.21.5"
    lib.write_bytes(b"\x7fELF...NCCL version 2.21.5+cuda12.4\x00...")
    (tmp_path / "libnccl.so.2").symlink_to(lib.name)
    cfg = _host_nccl(spark_raw, str(tmp_path / "libnccl.so.2"))
    assert cfg.host_nccl == str(tmp_path / "libnccl.so.2")
    assert f"readonly NCCL_PATH='{cfg.host_nccl}'" in facts_command(cfg, cfg.nodes[1])
    library = scripts.load("lib/nccl_library").body

    def facts(path: str) -> Any:
        out = subprocess.run(
            ["bash", "-c", f'{library}\nnccl_library "$1"', "_", path],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return parse_facts(healthy_facts(cfg, cfg.nodes[1]) + "\n" + out.stdout)

    found = facts(str(tmp_path / "libnccl.so.2"))
    assert (found.nccl_lib, found.nccl_lib_version) == (str(lib), "2.21.5+cuda12.4")
    assert not check_facts(cfg, cfg.nodes[1], found)
    assert found.as_output()["nccl_library"] == {"path": str(lib), "version": "2.21.5+cuda12.4"}
    missing = facts(str(tmp_path / "absent" / "libnccl.so.2"))
    assert missing.nccl_lib == ""
    assert check_facts(cfg, cfg.nodes[1], missing) == [
        (
            f"node spark-2: nccl.library is host, but there is no NCCL library at "
            f"{cfg.host_nccl}; fix: install it there (DGX OS, Debian: libnccl2), set "
            "nccl.host_path to where it is, or set nccl.library: image"
        )
    ]
    # The image's NCCL (the default): the facts command reads no library path.
    image = load_stack_config(spark_raw)
    assert image.host_nccl is None
    assert "readonly NCCL_PATH=''" in facts_command(image, image.nodes[1])


def test_the_hosts_nccl_is_mounted_and_preloaded_in_every_ray_and_rank_container(
    spark_raw: dict[str, Any],
) -> None:
    """Every container that runs NCCL (Ray head and workers, the server, each rank) gets
    the node's library read-only and loads it first; with the image's library (the
    default) the containers are as they were (the same spec digest)."""
    from sparkvllm.config import HOST_NCCL_IN_CONTAINER

    host = _host_nccl(spark_raw)
    image = load_stack_config(spark_raw)
    assert host.host_nccl == "/usr/lib/aarch64-linux-gnu/libnccl.so.2"  # image.arch's

    def every(cfg: StackConfig) -> list[containers.ContainerSpec]:
        return [
            containers.ray_head(cfg, "spark"),
            *(containers.ray_worker(cfg, "spark", n) for n in cfg.worker_nodes),
            containers.model_server(cfg, "spark", containers.RAY),
            containers.model_server(cfg, "spark", containers.NATIVE),
            *(containers.vllm_rank(cfg, "spark", n) for n in cfg.worker_nodes),
        ]

    mount = containers.Mount(host.host_nccl, HOST_NCCL_IN_CONTAINER, read_only=True)
    for with_host, plain in zip(every(host), every(image), strict=True):
        assert mount in with_host.mounts and mount not in plain.mounts, with_host.name
        assert with_host.env["LD_PRELOAD"] == HOST_NCCL_IN_CONTAINER
        assert with_host.env["VLLM_NCCL_SO_PATH"] == HOST_NCCL_IN_CONTAINER
        assert "LD_PRELOAD" not in plain.env
        assert with_host.labels[containers.SPEC_LABEL] != plain.labels[containers.SPEC_LABEL]
    # The image's library: the spark stack's containers are those of before this option
    # (their digests at 08e410e): an upgrade replaces none of them.
    assert [s.labels[containers.SPEC_LABEL] for s in every(image)] == [
        "63b8c640ba1e80c8", "7a7aa116f22fc8bf", "c061a469d198de58", "7a97f07b266be36d",
        "a030bacc221dc2d1",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("hcas", "warned"),
    [
        (["rocep1s0f1", "roceP2p1s0f1"], None),
        (["rocep1s0f1"], "names rocep1s0f1 but not roceP2p1s0f1"),
        (["roceP2p1s0f1"], "names roceP2p1s0f1 but not rocep1s0f1"),
    ],
)
def test_a_port_named_by_one_pcie_half_only_is_a_warning(
    spark_raw: dict[str, Any], hcas: list[str], warned: str | None
) -> None:
    """A GB10's ConnectX-7 port is two PCIe functions in two PCI domains; NCCL_IB_HCA must
    name both (the other port's halves, and an unrelated HCA, are not twins)."""
    raw = copy.deepcopy(spark_raw)
    raw["nodes"][1]["cluster_link"]["roce_hcas"] = hcas
    cfg = load_stack_config(raw)
    pci = (
        "rocep1s0f0@0000:01:00.0,rocep1s0f1@0000:01:00.1,"
        "roceP2p1s0f0@0002:01:00.0,roceP2p1s0f1@0002:01:00.1,mlx5_9@0000:05:00.0"
    )
    lines = healthy_facts(cfg, cfg.nodes[1]).splitlines()
    facts = parse_facts("\n".join([*lines, f"rdma_pci={pci}"]))
    said = [w for w in warnings_for(cfg.nodes[1], facts) if "PCIe half" in w]
    if warned is None:
        assert said == []
    else:
        assert len(said) == 1 and warned in said[0] and "node spark-2" in said[0], said
        assert "fix: add" in said[0]
    # Without the PCI addresses (an older node's facts): nothing is guessed.
    bare = parse_facts("\n".join(lines))
    assert not [w for w in warnings_for(cfg.nodes[1], bare) if "PCIe half" in w]


def test_the_ray_read_back_takes_the_gcs_node_table_shaped_as_ray_nodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The read-back's `gcs` path: the GCS client's table (ray._raylet.GcsClient) turned into
    ray.nodes()'s shape, so summarize() gives the same answer; None (ray.init's way) when
    the client is missing or fails."""
    import ray._raylet

    class Info:
        def __init__(self, ip: str, state: int) -> None:
            self.node_manager_address, self.node_manager_hostname = ip, f"h-{ip}"
            self.node_manager_port = 40001
            self.state, self.resources_total = state, {"GPU": 1.0}

    class NodeID(bytes):  # ray's NodeID: hashable, hex()
        pass

    asked: list[str] = []

    class Client:
        def __init__(self, address: str) -> None:
            asked.append(address)

        def get_all_node_info(self, timeout: int) -> dict[Any, Info]:
            return {
                NodeID(b"\xaa"): Info("10.0.0.1", 0),
                NodeID(b"\xbb"): Info("10.0.0.2", 1),  # dead
            }

    monkeypatch.setattr(ray._raylet, "GcsClient", Client, raising=False)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    nodes = ray_members.gcs_nodes()
    assert asked == ["10.0.0.1:6379"]
    assert nodes == [
        {"NodeID": "aa", "Alive": True, "NodeManagerAddress": "10.0.0.1",
         "NodeManagerHostname": "h-10.0.0.1", "NodeManagerPort": 40001,
         "Resources": {"GPU": 1.0}},
        {"NodeID": "bb", "Alive": False, "NodeManagerAddress": "10.0.0.2",
         "NodeManagerHostname": "h-10.0.0.2", "NodeManagerPort": 40001,
         "Resources": {"GPU": 1.0}},
    ]  # fmt: skip
    report = ray_members.summarize(nodes, ["10.0.0.1", "10.0.0.2"], 2)
    assert report["node_ids"] == ["aa"] and report["missing"] == ["10.0.0.2"]

    def broken(address: str) -> None:
        raise RuntimeError("no GCS")

    monkeypatch.setattr(ray._raylet, "GcsClient", broken, raising=False)
    assert ray_members.gcs_nodes() is None
