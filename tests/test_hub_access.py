"""The head's preflight ask of the hub (a gated model without a token fails before anything
changes, with a fix line), run as the head runs it, against the sim's hub stand-in on
loopback (sim/hub.py: the hub's status codes and X-Error-Code headers)."""

from __future__ import annotations

import copy
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sim.hub import Repo, server
from sparkvllm.config import ConfigError, load_stack_config
from sparkvllm.specs import weights
from sparkvllm.specs.plans import node as node_plan
from sparkvllm.specs.ssh import Reach
from tests.conftest import TEST_HF_TOKEN, hf_snapshot

MODEL = "Qwen/Qwen3.5-122B-A10B-FP8"  # the spark stack's
CONFIG = '{"architectures": ["Qwen3_5MoeForConditionalGeneration"]}'


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[tuple[str, Repo]]:
    """The stand-in serving MODEL gated behind TEST_HF_TOKEN, on a free loopback port."""
    files = tmp_path / "files"
    files.mkdir()
    (files / "config.json").write_text(CONFIG)
    (files / "model.safetensors").write_bytes(b"\0" * 64)
    repo = Repo(MODEL, files, token=TEST_HF_TOKEN)
    httpd = server(repo, "127.0.0.1", 0)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", repo
    httpd.shutdown()
    httpd.server_close()


def _cfg(spark_raw: dict[str, Any], endpoint: str, cache: Path, **model: Any) -> Any:
    raw = copy.deepcopy(spark_raw)
    raw["model"].update({"hub_endpoint": endpoint, "hf_cache": str(cache), **model})
    return load_stack_config(raw)


def _ask(cfg: Any, token: str | None) -> subprocess.CompletedProcess[str]:
    """The head's hub check, run here under bash as the node runs it (token on stdin)."""
    spec = weights.hub_access(cfg)
    assert spec is not None
    assert spec.stdin_secret == "hf_token"  # empty when the stack has none
    return subprocess.run(
        ["bash", "-c", spec.create], input=(token or "") + "\n", capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("token", "model", "revision", "verdict", "problem"),
    [
        (None, MODEL, "main", "gated", "is gated: downloading it needs an access token"),
        ("hf_wrongTokenValue9", MODEL, "main", "no-access", "hf_token has no access"),
        (TEST_HF_TOKEN, MODEL, "main", "ok", None),
        (TEST_HF_TOKEN, "Qwen/Nope", "main", "not-found", "is not found (or private)"),
        (TEST_HF_TOKEN, MODEL, "v9", "no-revision", "no such revision"),
    ],
    ids=["gated, no token", "wrong token", "token", "unknown model", "unknown revision"],
)
def test_the_hub_check_fails_on_the_node_naming_the_problem_and_its_fix(
    spark_raw: dict[str, Any], hub: tuple[str, Repo], tmp_path: Path,
    token: str | None, model: str, revision: str, verdict: str, problem: str | None,
) -> None:  # fmt: skip
    endpoint, _ = hub
    extra = {"hf_token": token} if token else {}
    cfg = _cfg({**spark_raw, **extra}, endpoint, tmp_path / "cache", id=model, revision=revision)
    done = _ask(cfg, token)
    assert f'"hub": "{verdict}"' in done.stdout, done
    if verdict == "ok":
        # The memory plan's figure before any download: the revision's files, as listed.
        assert weights.preflight_bytes(done.stdout) == len(CONFIG) + 64
    if problem is None:
        assert done.returncode == 0 and not done.stderr, done
    else:
        # A failed command: pulumi-command records nothing, so the next `up` asks again.
        assert done.returncode == 1, done
        assert problem in done.stderr and "fix:" in done.stderr, done.stderr
        assert "{said}" not in done.stderr and "{status}" not in done.stderr
        assert token is None or token not in done.stdout + done.stderr
    if verdict == "no-access":
        assert "(the hub says: Access to model" in done.stderr


def test_only_the_head_asks_the_hub(spark_raw: dict[str, Any]) -> None:
    cfg = load_stack_config(spark_raw)
    plans = {
        n.name: node_plan(
            cfg,
            n,
            reach=Reach(n.ssh.host, n.ssh.port, n.ssh.user, None, "~/id"),
            known_hosts_ref="~/kh",
            control_dir_ref="~",
        )
        for n in cfg.nodes
    }
    assert [n for n, p in plans.items() if p.hubs] == [cfg.head]
    (head_hub,) = plans[cfg.head].hubs.values()
    assert head_hub.name == f"{cfg.head}-hub-access"


def test_complete_weights_on_the_head_need_no_hub(
    spark_raw: dict[str, Any], hub: tuple[str, Repo], tmp_path: Path
) -> None:
    endpoint, _ = hub
    hf_snapshot(tmp_path / "cache", {"config.json": b"{}", "model.safetensors": b"w"})
    cfg = _cfg(spark_raw, endpoint, tmp_path / "cache", revision="main")
    done = _ask(cfg, None)
    assert done.returncode == 0 and '"hub": "not-needed"' in done.stdout, done
    # Downloaded by each node: the head's cache says nothing of theirs, so it asks.
    each = _cfg(spark_raw, endpoint, tmp_path / "cache", distribution="download_on_each_node")
    done = _ask(each, None)
    assert done.returncode == 1 and '"hub": "gated"' in done.stdout, done


def test_an_unreachable_hub_and_an_offline_model(spark_raw: dict[str, Any], tmp_path: Path) -> None:
    # A loopback port nothing listens on.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = _cfg(spark_raw, f"http://127.0.0.1:{port}", tmp_path / "cache")
    done = _ask(cfg, None)
    assert done.returncode == 1 and '"hub": "unreachable"' in done.stdout, done
    assert "cannot reach" in done.stderr and "model.offline: true" in done.stderr


def test_an_offline_model_only_has_its_size_read_on_the_head(
    spark_raw: dict[str, Any], tmp_path: Path
) -> None:
    """Offline the hub is never asked (its endpoint here is a port nothing listens on):
    the step reads the snapshot's size in the head's cache, or says it is not known."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{s.getsockname()[1]}"
    offline = _cfg(spark_raw, nobody, tmp_path / "cache", offline=True)
    assert weights.hub_access(offline).name == f"{offline.head}-weights-size"
    done = _ask(offline, None)
    assert done.returncode == 0, done
    assert weights.preflight_bytes(done.stdout) == 0 and '"hub": "offline"' in done.stdout
    hf_snapshot(tmp_path / "cache", {"config.json": b"{}", "model.safetensors": b"w" * 1000})
    done = _ask(offline, None)
    assert done.returncode == 0 and '"hub": "not-needed"' in done.stdout, done
    assert weights.preflight_bytes(done.stdout) == 1002


def test_the_download_takes_the_token_from_stdin_only(spark_raw: dict[str, Any]) -> None:
    """The token is read from stdin whether or not the stack has one (empty then), so
    adding or removing the secret never changes the step's text (nothing re-runs for it);
    it is on no command line."""
    plain = load_stack_config(spark_raw)
    without = weights.weights_download(plain, plain.head_node)
    # The default hub: no endpoint handed to the download.
    assert "readonly HUB_ENDPOINT=''" in without.create
    with_token = load_stack_config({**spark_raw, "hf_token": TEST_HF_TOKEN})
    spec = weights.weights_download(with_token, with_token.head_node)
    assert spec == without and spec.stdin_secret == "hf_token"
    assert "readonly TOKEN='1'" in spec.create and "IFS= read -r HF_TOKEN" in spec.create
    assert TEST_HF_TOKEN not in spec.create
    raw = {**spark_raw, "hf_token": TEST_HF_TOKEN}
    raw["model"] = {**spark_raw["model"], "hub_endpoint": "http://10.0.0.5:8080/"}
    cfg = load_stack_config(raw)
    spec = weights.weights_download(cfg, cfg.head_node)
    assert "readonly HUB_ENDPOINT='http://10.0.0.5:8080'" in spec.create
    offline = load_stack_config({**raw, "model": {**raw["model"], "offline": True}})
    spec = weights.weights_download(offline, offline.head_node)
    # Never downloads: no token read, none asked for.
    assert spec.stdin_secret is None and "readonly TOKEN='0'" in spec.create


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("hf_token", "short", "8-512 printable"),
        ("hf_token", "hf_has a space", "8-512 printable"),
        ("model.hub_endpoint", "ftp://hub.lab", "needs http:// or https://"),
        ("model.hub_endpoint", "https://user:pw@hub.lab", "no user, password"),
        ("model.hub_endpoint", "https://hub.lab/?token=x", "no user, password, query"),
        ("model.hub_endpoint", "https://hub lab", "not valid"),
        ("model.hub_endpoint", "https://hub.lab/$(id)", "the path may hold"),
    ],
)
def test_bad_hub_values_name_the_field_and_the_fix(
    spark_raw: dict[str, Any], field: str, value: str, problem: str
) -> None:
    raw = copy.deepcopy(spark_raw)
    if field == "hf_token":
        raw["hf_token"] = value
    else:
        raw["model"]["hub_endpoint"] = value
    with pytest.raises(ConfigError) as e:
        load_stack_config(raw)
    text = str(e.value)
    assert field in text and problem in text and "fix:" in text.lower(), text
    if field == "hf_token":
        assert value not in text  # a secret's value is never echoed
