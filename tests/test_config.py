"""Stack config: every rule with its bad input, and the exact message shape
`<field path> = <value>: <problem>. Fix: <fix>.`"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import pytest

from sparkvllm.config import (
    ConfigError,
    StackConfig,
    load_stack_config,
    parse_pulumi_config,
)
from tests.conftest import TEST_PRIVATE_KEY

Raw = dict[str, Any]


def _both(*changes: Callable[[Raw], None]) -> Callable[[Raw], None]:
    def apply(raw: Raw) -> None:
        for change in changes:
            change(raw)

    return apply


def _set(path: str, value: Any) -> Callable[[Raw], None]:
    def apply(raw: Raw) -> None:
        target: Any = raw
        parts = re.findall(r"[^.\[\]]+", path)
        for p in parts[:-1]:
            target = target[int(p)] if p.isdigit() else target.setdefault(p, {})
        last = parts[-1]
        if value is _DELETE:
            del target[int(last) if last.isdigit() else last]
        elif last.isdigit():
            target[int(last)] = value
        else:
            target[last] = value

    return apply


_DELETE = object()
# A real ed25519 public key's data (generated for the examples; it belongs to no machine).
ED2 = "AAAAC3NzaC1lZDI1NTE5AAAAIOBVSB264uOsfy8jRB985DNYLFLNZJZSlpnhUh5XHLy7"

# (case id, mutation, field path in the message, words of the problem)
BAD_INPUTS: list[tuple[str, Callable[[Raw], None], str, str]] = [
    ("unknown top-level key", _set("nodez", []), "nodez", "Extra inputs are not permitted"),
    (
        "unknown node key",
        _set("nodes[0].gpu", 1),
        "nodes[0].gpu",
        "Extra inputs are not permitted",
    ),
    ("missing nodes", _set("nodes", _DELETE), "nodes", "Field required"),
    ("no nodes", _set("nodes", []), "nodes", "at least 1 item"),
    ("bad node name", _set("nodes[0].name", "Spark_1"), "nodes[0].name", "lowercase"),
    ("port out of range", _set("nodes[0].ssh.port", 70000), "nodes[0].ssh.port", "less than"),
    ("port not a number", _set("nodes[1].ssh.port", "ssh"), "nodes[1].ssh.port", "integer"),
    (
        "host key garbage",
        _set("nodes[0].ssh.host_key", "not a key"),
        "nodes[0].ssh.host_key",
        "not a usable SSH public host key",
    ),
    (
        "host key missing while verifying",
        _set("nodes[0].ssh.host_key", _DELETE),
        "nodes[0].ssh",
        "exactly one of host_key or host_key_file",
    ),
    (
        "host key given but verification off",
        _set("nodes[0].ssh.verify_host_key", False),
        "nodes[0].ssh",
        "verify_host_key is false but a host key is given",
    ),
    (
        "cluster address not IPv4",
        _set("nodes[1].cluster_link.address", "192.168.100"),
        "nodes[1].cluster_link.address",
        "IPv4",
    ),
    (
        "netdev with a slash",
        _set("nodes[0].cluster_link.netdev", "enp1/s0"),
        "nodes[0].cluster_link.netdev",
        "not a Linux interface name",
    ),
    (
        "duplicate HCA",
        _set("nodes[0].cluster_link.roce_hcas", ["rocep1s0f1", "rocep1s0f1"]),
        "nodes[0].cluster_link.roce_hcas",
        "listed twice",
    ),
    ("zero GPUs", _set("nodes[0].gpus", 0), "nodes[0].gpus", "greater than or equal to 1"),
    (
        "duplicate node name",
        _set("nodes[1].name", "spark-1"),
        "nodes[1].name",
        "duplicate node name",
    ),
    (
        "duplicate cluster address",
        _set("nodes[1].cluster_link.address", "192.168.100.10"),
        "nodes[1].cluster_link.address",
        "already used by node 'spark-1'",
    ),
    (
        "duplicate ssh endpoint",
        _set("nodes[1].ssh.host", "10.1.230.180"),
        "nodes[1].ssh.host",
        "already node 'spark-1'",
    ),
    ("head not a node", _set("head", "spark-9"), "head", "not a node name"),
    (
        "TP x PP != GPUs",
        _set("parallelism.tensor", 4),
        "parallelism",
        "tensor x pipeline = 4, but the nodes declare 2 GPU(s)",
    ),
    (
        "memory utilization above unified-memory bound",
        _set("vllm.gpu_memory_utilization", 0.95),
        "vllm.gpu_memory_utilization",
        "above 0.9",
    ),
    (
        "memory utilization zero",
        _set("vllm.gpu_memory_utilization", 0),
        "vllm.gpu_memory_utilization",
        "greater than 0",
    ),
    (
        "extra arg repeats an owned flag",
        _set("vllm.extra_args", ["--tensor-parallel-size=4"]),
        "vllm.extra_args",
        "--tensor-parallel-size, which parallelism.tensor owns",
    ),
    (
        "auto tool choice without parser",
        _set("vllm.tool_call_parser", _DELETE),
        "vllm",
        "enable_auto_tool_choice needs tool_call_parser",
    ),
    (
        "bad kv cache dtype",
        _set("vllm.kv_cache_dtype", "fp4"),
        "vllm.kv_cache_dtype",
        "Input should be",
    ),
    (
        "per-node env overridden",
        _set("vllm.env.NCCL_SOCKET_IFNAME", "eth0"),
        "vllm.env.NCCL_SOCKET_IFNAME",
        "set per node",
    ),
    ("ports collide", _set("ports.api", 6379), "ports", "ports must differ"),
    (
        "tarball without path",
        _set("image.source", "tarball"),
        "image",
        "tarball is not an absolute path",
    ),
    (
        "tarball path with pull",
        _set("image.tarball", "/x.tar"),
        "image",
        "tarball is set but source is 'pull'",
    ),
    ("unknown image source", _set("image.source", "scp"), "image.source", "Input should be"),
    ("relative HF cache", _set("model.hf_cache", "~/.cache/hf"), "model.hf_cache", "absolute"),
    ("bad model id", _set("model.id", "qwen"), "model.id", "should match pattern"),
    ("no ssh key", _set("ssh_private_key", _DELETE), "ssh_private_key", "exactly one of"),
    (
        "two ssh keys",
        _set("ssh_private_key_file", "~/.ssh/id"),
        "ssh_private_key",
        "exactly one of",
    ),
    (
        "ready timeout too short",
        _set("timeouts.server_ready_s", 5),
        "timeouts.server_ready_s",
        "30",
    ),
    # Values that reach a shell, ssh or vLLM: refused unless they are what they claim.
    (
        "user that is an ssh option",
        _set("nodes[0].ssh.user", "-oProxyCommand=x"),
        "nodes[0].ssh.user",
        "not a login name",
    ),
    (
        "host that is an ssh option",
        _set("nodes[1].ssh.host", "-oProxyCommand=x"),
        "nodes[1].ssh.host",
        "not an IP address or DNS name",
    ),
    (
        "host with a space",
        _set("nodes[1].ssh.host", "spark 2"),
        "nodes[1].ssh.host",
        "not an IP address or DNS name",
    ),
    (
        "host key of one byte",
        _set("nodes[0].ssh.host_key", "ssh-ed25519 AAAA"),
        "nodes[0].ssh.host_key",
        "not a usable SSH public host key",
    ),
    (
        "host key type that is not its blob",
        _set("nodes[0].ssh.host_key", "ssh-rsa " + ED2),
        "nodes[0].ssh.host_key",
        "the text says ssh-rsa but the key data is a ssh-ed25519 key",
    ),
    (
        "host key not base64",
        _set("nodes[0].ssh.host_key", "ssh-ed25519 AAAA*AAA"),
        "nodes[0].ssh.host_key",
        "not valid base64",
    ),
    (
        "netdev that is an option",
        _set("nodes[0].cluster_link.netdev", "-x"),
        "nodes[0].cluster_link.netdev",
        "not a Linux interface name",
    ),
    (
        "a digest-pinned image from a tarball",
        lambda raw: raw["image"].update(
            ref="a/b@sha256:" + "ab" * 32, source="tarball", tarball="/srv/img.tar"
        ),
        "image",
        "does not record",
    ),
    (
        "a digest that is not sha256",
        _set("image.ref", "a/b@sha512:" + "ab" * 64),
        "image",
        "only sha256 digests",
    ),
    (
        "image ref with a quote",
        _set("image.ref", "x'; touch /tmp/p; '"),
        "image.ref",
        "not a Docker image reference",
    ),
    (
        "image ref with a substitution",
        _set("image.ref", "x$(touch /tmp/p)"),
        "image.ref",
        "not a Docker image reference",
    ),
    (
        "tarball with a substitution",
        _set("image.tarball", "/x$(id).tar"),
        "image.tarball",
        "paths on the nodes may hold",
    ),
    (
        "HF cache with '..'",
        _set("model.hf_cache", "/home/../etc"),
        "model.hf_cache",
        "no spaces, quotes, ':' or '..'",
    ),
    (
        "HF cache with a colon (docker -v syntax)",
        _set("model.hf_cache", "/a:/b"),
        "model.hf_cache",
        "paths on the nodes may hold",
    ),
    (
        "revision leaving the cache",
        _set("model.revision", "../../etc"),
        "model.revision",
        "should match pattern",
    ),
    (
        "revision with '..' inside",
        _set("model.revision", "main/../../x"),
        "model.revision",
        "no '..' segment",
    ),
    (
        "served name with a space",
        _set("model.served_name", "my model"),
        "model.served_name",
        "should match pattern",
    ),
    (
        "reasoning parser with a semicolon",
        _set("vllm.reasoning_parser", "qwen3;id"),
        "vllm.reasoning_parser",
        "should match pattern",
    ),
    (
        "tool parser with a substitution",
        _set("vllm.tool_call_parser", "$(id)"),
        "vllm.tool_call_parser",
        "should match pattern",
    ),
    (
        "speculative method with a quote",
        _set("vllm.speculative_config.method", "mtp'"),
        "vllm.speculative_config",
        "is not a plain value",
    ),
    (
        "max_model_len 2^63",
        _set("vllm.max_model_len", 2**63),
        "vllm.max_model_len",
        "less than or equal to 16777216",
    ),
    ("env name with a space", _set("vllm.env", {"A B": "1"}), "vllm.env", "not a variable name"),
    (
        "env value with a newline",
        _set("vllm.env", {"A": "1\nB=2"}),
        "vllm.env",
        "control character",
    ),
    ("HF token in env", _set("vllm.env", {"HF_TOKEN": "hf_x"}), "vllm.env", "names a secret"),
    (
        "endpoint host with a slash",
        _set("endpoint_host", "a/b"),
        "endpoint_host",
        "not an IP address or DNS name",
    ),
    ("API port on Ray Client's", _set("ports.api", 10001), "ports", "Ray Client server"),
    (
        "dashboard port in Ray's worker range",
        _set("ports.ray_dashboard", 12000),
        "ports",
        "worker port range",
    ),
    (
        "extra arg with an underscore spelling",
        _set("vllm.extra_args", ["--tensor_parallel_size", "4"]),
        "vllm.extra_args",
        "parallelism.tensor",
    ),
    (
        "extra arg that is a prefix",
        _set("vllm.extra_args", ["--hos", "1.2.3.4"]),
        "vllm.extra_args",
        "the program sets (always 0.0.0.0)",
    ),
    (
        "extra arg with the API key",
        _set("vllm.extra_args", ["--api_key", "sk-abc"]),
        "vllm.extra_args",
        "api_key",
    ),
    ("an NCCL library of no kind", _set("nccl.library", "system"), "nccl.library", "'image'"),
    (
        "host NCCL path relative",
        _set("nccl.host_path", "lib/libnccl.so.2"),
        "nccl.host_path",
        "absolute path",
    ),
    (
        "host NCCL path with a quote",
        _set("nccl.host_path", "/usr/lib/nccl'.so"),
        "nccl.host_path",
        "paths on the nodes",
    ),
    (
        "host NCCL path without host",
        _set("nccl", {"host_path": "/opt/nccl/libnccl.so.2"}),
        "nccl.host_path",
        "only used with nccl.library host",
    ),
    (
        "LD_PRELOAD in env with the host's NCCL",
        _both(_set("nccl", {"library": "host"}), _set("vllm.env", {"LD_PRELOAD": "/x.so"})),
        "vllm.env.LD_PRELOAD",
        "sets it to the host's NCCL library",
    ),
]


def test_the_spark_stack_file_is_valid(spark_raw: Raw) -> None:
    cfg = load_stack_config(spark_raw)
    assert cfg.head_node.name == "spark-1"
    assert [n.name for n in cfg.worker_nodes] == ["spark-2"]
    assert cfg.total_gpus == 2


@pytest.mark.parametrize(
    ("mutate", "path", "problem"), [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS]
)
def test_bad_input_names_field_value_and_fix(
    spark_raw: Raw, mutate: Callable[[Raw], None], path: str, problem: str
) -> None:
    raw = copy.deepcopy(spark_raw)
    mutate(raw)
    with pytest.raises(ConfigError) as info:
        load_stack_config(raw)
    text = str(info.value)
    assert text.startswith("stack config is invalid (")
    assert "nothing was deployed" in text
    lines = [line for line in text.splitlines() if line.startswith(f"  - {path} = ")]
    assert lines, f"no line for {path!r} in:\n{text}"
    line = lines[0]
    assert problem in line
    # Every line has the shape: path = value: problem. Fix: fix.
    assert re.match(rf"  - {re.escape(path)} = .+: .+\. Fix: .+\.$", line), line


# A fix made from the field's description reads as a sentence: the field, then what it
# is (it read `Fix: add it: The GB10 nodes.` and `Fix: give SECRET. The SSH ...`).
GENERATED_FIXES = [
    ("a missing field", "nodes", None, "Fix: add nodes (the GB10 nodes)."),
    ("a wrong type", "image", 5, "Fix: give image (the vLLM image)."),
    ("a secret of the wrong type", "ssh_private_key", 5,
     "Fix: give ssh_private_key (the SSH private key for every node: `pulumi config set"),
    ("a nested field", "timeouts", {"ray_ready_s": "soon"},
     "Fix: give ray_ready_s (seconds to wait for Ray"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("field", "value", "fix"), [c[1:] for c in GENERATED_FIXES], ids=[c[0] for c in GENERATED_FIXES]
)
def test_a_generated_fix_names_the_field_then_what_it_is(
    spark_raw: Raw, field: str, value: Any, fix: str
) -> None:
    raw = copy.deepcopy(spark_raw)
    if value is None:
        del raw[field]
    else:
        raw[field] = value
    with pytest.raises(ConfigError) as info:
        load_stack_config(raw)
    assert fix in str(info.value), str(info.value)
    assert "SECRET" not in str(info.value)


def test_several_problems_are_reported_together(spark_raw: Raw) -> None:
    raw = copy.deepcopy(spark_raw)
    raw["head"] = "nope"
    raw["nodes"][1]["cluster_link"]["address"] = "192.168.100.10"
    with pytest.raises(ConfigError) as info:
        load_stack_config(raw)
    assert {i.path for i in info.value.issues} == {"head", "nodes[1].cluster_link.address"}
    assert "(2 problems)" in str(info.value)


def test_secrets_never_appear_in_errors(spark_raw: Raw) -> None:
    raw = copy.deepcopy(spark_raw)
    raw["api_key"] = "sk-very-secret"
    raw["parallelism"] = {"tensor": 3}
    raw["bogus"] = 1
    with pytest.raises(ConfigError) as info:
        load_stack_config(raw)
    assert "sk-very-secret" not in str(info.value)
    assert "TEST-ONLY-NOT-A-KEY" not in str(info.value)


def test_a_secret_set_in_plain_text_is_refused() -> None:
    values = {"spark-vllm:ssh_private_key": TEST_PRIVATE_KEY, "spark-vllm:head": "spark-1"}
    with pytest.raises(ConfigError) as info:
        parse_pulumi_config(values, secret_keys=[])
    assert "ssh_private_key = '[secret]': set in plain text" in str(info.value)
    assert "TEST-ONLY" not in str(info.value)


def test_pulumi_config_strings_become_structured_values(spark_raw: Raw) -> None:
    import json

    values = {
        f"spark-vllm:{k}": v if isinstance(v, str) else json.dumps(v) for k, v in spark_raw.items()
    }
    values["other-project:thing"] = "ignored"
    raw = parse_pulumi_config(values, secret_keys=["spark-vllm:ssh_private_key"])
    assert raw["head"] == "spark-1"
    assert raw["nodes"][0]["cluster_link"]["netdev"] == "enp1s0f1np1"
    assert "thing" not in raw
    assert isinstance(load_stack_config(raw), StackConfig)


def test_verification_opt_out_is_explicit(spark_raw: Raw) -> None:
    raw = copy.deepcopy(spark_raw)
    ssh = raw["nodes"][1]["ssh"]
    del ssh["host_key"]
    ssh["verify_host_key"] = False
    cfg = load_stack_config(raw)
    assert cfg.nodes[1].ssh.verify_host_key is False
