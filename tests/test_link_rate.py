"""The cluster link's measurement: the probe over loopback, the parser, the rules that turn
figures into warnings and drift findings (sparkvllm/specs/link_checks.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from types import SimpleNamespace
from typing import Any

from sparkvllm import drift
from sparkvllm.config import StackConfig, load_stack_config
from sparkvllm.probes import script
from sparkvllm.specs import link_checks
from sparkvllm.specs.link_checks import LinkRate, parse_rate, rate_drift, rate_warnings
from tests.conftest import TEST_PRIVATE_KEY, stack_file

PROBE = script("link_rate")


def three_nodes(**link: Any) -> StackConfig:
    """The spark stack over three Sparks (192.168.100.1-3 on the link), `link` set on each."""
    raw = stack_file("spark")
    raw["ssh_private_key"] = TEST_PRIVATE_KEY
    base = raw["nodes"][0]
    raw["nodes"] = [
        {**base, "name": f"spark-{i}", "ssh": {**base["ssh"], "host": f"10.0.0.{i}"},
         "cluster_link": {"address": f"192.168.100.{i}", "netdev": "enp1s0f1np1", **link}}
        for i in (1, 2, 3)
    ]  # fmt: skip
    raw["parallelism"] = {"tensor": 3, "pipeline": 1}
    return load_stack_config(raw)


def rate(worker: str, out: float, back: float, **kw: Any) -> LinkRate:
    return LinkRate("spark-1", worker, out, back, **kw)


def test_the_probe_measures_a_transfer_over_loopback_from_its_peer_only() -> None:
    rx = subprocess.Popen(
        [sys.executable, "-c", PROBE, "receive", "127.0.0.1", "127.0.0.1", "2", "1"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert rx.stdout is not None
    port = int(rx.stdout.readline().strip().removeprefix("port="))
    # A stranger (another source address) is closed unread and does not count.
    stranger = socket.socket()
    stranger.bind(("127.0.0.2", 0))
    stranger.connect(("127.0.0.1", port))
    stray = threading.Thread(target=lambda: stranger.sendall(bytes(1 << 16)), daemon=True)
    stray.start()
    sent = subprocess.run(
        [sys.executable, "-c", PROBE, "send", "127.0.0.1", str(port), "2", "1", str(64 << 20)],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    got = dict(line.split("=", 1) for line in rx.communicate(timeout=60)[0].splitlines())
    stranger.close()
    assert sent.stdout.strip() == f"sent={64 << 20}"
    assert int(got["bytes"]) == 64 << 20  # the stranger's bytes are not among them
    assert float(got["gbit"]) > 0
    assert rx.returncode == 0


def test_the_probe_refuses_bad_arguments() -> None:
    bad = subprocess.run([sys.executable, "-c", PROBE, "send", "x"], capture_output=True)
    assert bad.returncode == 2


def test_parse_rate_reads_each_figure_and_leaves_the_unmeasured_empty() -> None:
    got = parse_rate(
        "spark-1", "spark-2",
        "head.speed_mbit=200000\npeer.speed_mbit=-1\ntcp.streams=4\ntcp.out.gbit=61.250\n"
        "tcp.in.gbit=\nrdma.gbit=\nrdma.hcas=0\n",
    )  # fmt: skip
    assert got == LinkRate("spark-1", "spark-2", 61.25, None, None, 200000, None, 4)
    assert got.paths() == [("spark-1 -> spark-2", "tcp", 61.25)]
    assert got.as_output()["speed_mbit"] == {"spark-1": 200000, "spark-2": None}


def test_a_link_at_a_tenth_of_the_others_is_named_with_the_rate_expected_and_a_cause() -> None:
    cfg = three_nodes(expected_mtu=1500)
    rates = {"spark-2": rate("spark-2", 28.0, 27.0), "spark-3": rate("spark-3", 27.5, 2.8)}
    warnings = rate_warnings(cfg, rates)
    assert len(warnings) == 1
    (w,) = warnings
    assert w.startswith("link spark-3 -> spark-1 carries 2.8 Gb/s over tcp, expected at least")
    assert "14.0 Gb/s (half the fastest path measured, spark-1 -> spark-2: 28.0 Gb/s)" in w
    assert "`ethtool -S enp1s0f1np1` on spark-3" in w  # unknown cause: what to look at
    assert rate_warnings(cfg, {"spark-2": rate("spark-2", 28.0, 26.0)}) == []


def test_a_link_far_below_its_negotiated_speed_names_the_end_that_came_up_slow() -> None:
    cfg = three_nodes(expected_mtu=1500)
    # One link, both ways alike (nothing to compare with): 13 Gb/s on a 200 Gb/s port.
    fine = rate("spark-2", 12.9, 13.1, head_speed_mbit=200000, worker_speed_mbit=200000)
    warnings = rate_warnings(cfg, {"spark-2": fine})
    assert len(warnings) == 2, warnings
    assert "expected at least 20.0 Gb/s (0.1 of the 200 Gb/s negotiated)" in warnings[0]
    assert "unknown from the facts" in warnings[0]
    # One end negotiated less: the cause names it, its netdev and the fix.
    slow = rate("spark-2", 0.9, 13.1, head_speed_mbit=200000, worker_speed_mbit=10000)
    (w,) = rate_warnings(cfg, {"spark-2": slow})
    assert w.startswith("link spark-1 -> spark-2 carries 0.9 Gb/s over tcp, expected at least")
    assert "the link speed after boot: spark-2's enp1s0f1np1 negotiated 10000 Mb/s" in w
    assert "ip link set enp1s0f1np1 down" in w
    # The ends disagree, though what passes fits the slower one: said all the same.
    (w,) = rate_warnings(
        cfg, {"spark-2": rate("spark-2", 9.0, 9.1, head_speed_mbit=200000, worker_speed_mbit=10000)}
    )
    assert w.startswith("link spark-1 <-> spark-2: the link speed after boot: spark-2's")


def test_the_likely_cause_is_the_mtu_when_the_facts_show_a_small_one() -> None:
    cfg = three_nodes()  # expected_mtu 9000
    rates = {"spark-2": rate("spark-2", 28.0, 27.0), "spark-3": rate("spark-3", 2.5, 2.8)}
    facts = {"spark-3": {"netdev": {"mtu": 1500}}, "spark-1": {"netdev": {"mtu": 9000}}}
    warnings = rate_warnings(cfg, rates, facts)
    assert len(warnings) == 2
    assert all("the MTU: spark-3's enp1s0f1np1 has 1500, expected 9000" in w for w in warnings)
    assert not any("unknown from the facts" in w for w in warnings)


def test_slow_rdma_points_at_the_hca_twin() -> None:
    cfg = three_nodes(expected_mtu=1500)
    rates = {
        "spark-2": rate("spark-2", 80.0, 80.0, rdma_gbit=90.0,
                        head_speed_mbit=200000, worker_speed_mbit=200000),
    }  # fmt: skip
    (w,) = rate_warnings(cfg, rates)
    assert w.startswith("link spark-1 -> spark-2 carries 90.0 Gb/s over rdma")
    assert "0.5 of the 200 Gb/s negotiated" in w
    assert "both PCIe halves" in w


def test_the_drift_check_names_a_path_slower_than_when_deployed() -> None:
    cfg = three_nodes(expected_mtu=1500)
    deployed = {"spark-2": rate("spark-2", 28.0, 27.0).as_output(),
                "spark-3": rate("spark-3", 27.0, 27.0).as_output()}  # fmt: skip
    now = {"spark-2": rate("spark-2", 27.0, 2.7), "spark-3": rate("spark-3", 20.0, 27.0)}
    (found,) = rate_drift(cfg, now, deployed)
    assert found[0] == "spark-2"
    assert found[1].startswith(
        "link spark-2 -> spark-1 carries 2.7 Gb/s over tcp, 27.0 Gb/s when deployed (10%)"
    )
    assert rate_drift(cfg, now, {}) == []  # nothing deployed to compare with


def test_the_probe_drift_check_measures_from_the_head_with_the_workers_key() -> None:
    cfg = three_nodes(expected_mtu=1500)
    calls: list[tuple[str, str | None]] = []

    def runner(target: Any, command: str, stdin: str | None = None, **_: Any) -> Any:
        calls.append((target.host, stdin))
        worker = "spark-3" if "192.168.100.3" in command else "spark-2"
        out = "tcp.out.gbit=27\ntcp.in.gbit=" + ("2.5" if worker == "spark-3" else "26") + "\n"
        if worker == "spark-2" and len(calls) > 2:
            return subprocess.CompletedProcess([], 1, "", "spark-1 cannot ssh to spark-2")
        return subprocess.CompletedProcess([], 0, out, "")

    class Access:
        def __init__(self) -> None:
            self.targets = {n.name: SimpleNamespace(host=n.ssh.host) for n in cfg.nodes}
            self.host_keys: dict[str, str | None] = {}

        def key_of(self, node: str) -> str:
            return f"KEY-{node}"

    measured = drift.read_links(cfg, Access(), runner)  # type: ignore[arg-type]
    assert calls == [("10.0.0.1", "KEY-spark-2"), ("10.0.0.1", "KEY-spark-3")]
    found = drift.link_drift(cfg, measured, {})
    assert [(d.node, d.what) for d in found] == [("spark-3", "link slow")]
    failed = drift.read_links(cfg, Access(), runner)  # type: ignore[arg-type]
    (lost,) = [d for d in drift.link_drift(cfg, failed, {}) if d.what == "link not measured"]
    assert lost.node == "spark-2" and "cannot ssh" in lost.detail and "fix:" in lost.detail


def test_the_measurement_step_runs_on_the_head_and_is_never_read_back() -> None:
    cfg = three_nodes()
    spec = link_checks.link_rate_step(cfg, cfg.nodes[2], "ssh-ed25519 AAAA")
    assert (spec.name, spec.node, spec.read) == ("link-rate-spark-3", "spark-1", None)
    assert spec.stdin_secret == "ssh_private_key"
    assert ("PEER_HOST_KEY", "ssh-ed25519 AAAA") in spec.env
    assert "readonly TARGET_ADDRESS='192.168.100.3'" in spec.create


def test_no_two_modules_of_the_package_share_a_name() -> None:
    """The probe (sparkvllm/probes/link_rate.py, whose name is part of a step's identity)
    and the rules (sparkvllm/specs/link_checks.py) were both `link_rate`: a reader, a
    traceback and `import` could confuse them."""
    from collections import Counter

    from tests.conftest import ROOT

    names = Counter(
        p.stem
        for folder in ("sparkvllm", "components")
        for p in (ROOT / folder).rglob("*.py")
        if p.stem != "__init__"
    )
    assert [n for n, count in names.items() if count > 1] == []
