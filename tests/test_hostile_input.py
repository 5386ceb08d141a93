"""No config value runs a command: hostile values in every string field of the spark and
sim stacks are either refused (one line naming field, value and fix, nothing registered)
or reach their program as one literal argument, when every remote command the program
registers runs under bash with a PATH of logging stubs (tests/sandbox.py).

What runs in the sandbox is what the program registered (Pulumi's mock runtime), through
the same code that carries it out for real: NodeSteps' create and read, the local
engine's pulumi-command model, the docker provider's ssh line, and each container's
entrypoint and command. The ssh stub runs the remote words under bash as sshd would.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import random
import re
import runpy
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulumi
import pytest
from pulumi.runtime import config as runtime_config

import components.node_step as node_step
from localengine.providers import docker as docker_provider
from localengine.providers.command import CommandProvider
from sparkvllm.config import ConfigError, StackConfig, load_stack_config
from sparkvllm.specs.ssh import SshOptions, SshTarget
from tests import sandbox
from tests.conftest import ROOT, TEST_HF_TOKEN, TEST_PRIVATE_KEY, stack_file
from tests.pulumi_mocks import NodeAnswers, RecordingMonitor, Registration, apply_program
from tests.test_models_config import ROUTER

pytestmark = pytest.mark.skipif(bool(sandbox.available()), reason=sandbox.available() or "")

CANARY = "pwned"
# Each runs the canary if it is ever executed by a shell, pasted into a command line, or
# read as an ssh option.
PAYLOADS = (
    f"x'; {CANARY}; '",
    f'x"; {CANARY}; "',
    f"$({CANARY})",
    f"`{CANARY}`",
    f"x\n{CANARY}",
    f"-oProxyCommand={CANARY}",
    f"x|{CANARY}",
    f"x && {CANARY} #",
    f"${{IFS}}{CANARY}",
    f"--x=$({CANARY})",
    "a" * 5000 + f"$({CANARY})",
)
SIM_HOST_KEYS = {  # generated for these tests; they belong to no machine
    "spark-1": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMoUk0RJGGipAS0sr8Iv+4XPTm8k2IJ1DYNaioBvxSDZ",
    "spark-2": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOBVSB264uOsfy8jRB985DNYLFLNZJZSlpnhUh5XHLy7",
}
# Optional string fields the stack files leave out, with their parents present.
OPTIONAL = (
    "endpoint_host",
    "model.hub_endpoint",
    "model.served_name",
    "vllm.reasoning_parser",
    "vllm.tool_call_parser",
    "vllm.speculative_config.method",
    "vllm.extra_args[0]",
    "vllm.env.EXTRA",
    "nccl.host_path",
)
# The same, for a set of models (Pulumi.spark-models.yaml) behind a router.
OPTIONAL_SET = (
    "endpoint_host",
    "models[1].hub_endpoint",
    "models[1].vllm.reasoning_parser",
    "models[1].vllm.tool_call_parser",
    "models[1].vllm.extra_args[0]",
    "models[1].vllm.env.EXTRA",
    "router.image.tarball",
)


def stack_raw(stack: str) -> dict[str, Any]:
    """The stack file's config with the SSH key (and, for sim, the host keys) inline."""
    raw = stack_file(stack)
    raw.pop("ssh_private_key_file", None)
    raw["ssh_private_key"] = TEST_PRIVATE_KEY
    for node in raw["nodes"]:
        if "host_key_file" in node["ssh"]:
            node["ssh"]["host_key"] = SIM_HOST_KEYS[node["name"]]
            del node["ssh"]["host_key_file"]
    return raw


_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _parts(path: str) -> list[str | int]:
    return [int(i) if i else k for k, i in _STEP.findall(path)]


def set_path(raw: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(raw)
    parts = _parts(path)
    node: Any = out
    for here, nxt in itertools.pairwise(parts):
        if isinstance(node, dict) and here not in node:
            node[here] = [] if isinstance(nxt, int) else {}
        node = node[here]
    last = parts[-1]
    if isinstance(node, list) and isinstance(last, int) and last == len(node):
        node.append(value)
    else:
        node[last] = value
    return out


def tree(raw: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(path, value) of every place in the raw config: containers and leaves (list items by
    index, dict values by key); the SSH key is never touched."""
    if isinstance(raw, dict):
        for k, v in raw.items():
            yield from tree(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(raw, list):
        for i, v in enumerate(raw):
            yield from tree(v, f"{prefix}[{i}]")
    if prefix and prefix != "ssh_private_key":
        yield prefix, raw


def string_paths(raw: dict[str, Any]) -> Iterator[str]:
    return (path for path, v in tree(raw) if isinstance(v, str) and path != "api_key")


# --- running what the program registered -------------------------------------------------


class Runner:
    """Carries out every registration of a mock run inside one sandbox."""

    def __init__(self, box: sandbox.Sandbox, monkeypatch: pytest.MonkeyPatch):
        self.box = box
        self.mode = "ok"
        self.stdins: list[str] = []  # what each remote run was fed
        monkeypatch.setattr(node_step, "run_ssh", self.transport)

    def transport(self, target: SshTarget, command: str, **kw: Any) -> Any:
        """`sparkvllm.remote.run_ssh`, into the sandbox."""
        self.stdins.append(kw.get("stdin") or "")
        return self.box.run(target.argv(command), stdin=kw.get("stdin") or "", mode=self.mode)

    def run_all(self, registrations: dict[str, Registration], *, mode: str) -> None:
        self.mode = mode
        commands = CommandProvider(self.transport)
        steps = node_step.NodeStepProvider()
        for reg in registrations.values():
            state = {k: reg.plain(k) for k in reg.state}
            if reg.type == "command:remote:Command":
                for key in ("create", "delete"):
                    if state.get(key):
                        _tolerate(commands._run, reg.name, state, state[key], None)
            elif reg.type == "pulumi-python:dynamic:Resource":
                _tolerate(steps.create, state)
                _tolerate(steps.read, "id", state)
                _tolerate(steps.delete, "id", state)
            elif reg.type == "pulumi:providers:docker":
                target = docker_provider._target(state)
                self.box.run(target.argv("docker system dial-stdio"), mode=mode)
            elif reg.type == "docker:index/container:Container":
                argv = [*(state.get("entrypoints") or []), *state["command"]]
                # Each run as a new container's: its own home (the server counts its
                # starts there).
                home = Path(tempfile.mkdtemp(dir=self.box.root))
                self.box.run([str(a) for a in argv], mode=mode, home=home)


def _tolerate(fn: Any, *args: Any) -> None:
    """Commands fail against stubs; only what they ran matters here."""
    with contextlib.suppress(Exception):
        fn(*args)


def run_main(raw: dict[str, Any], stack: str) -> RecordingMonitor:
    """Run __main__.py under the mock runtime with `raw` as the stack's Pulumi config; the
    monitor holds what it registered (also when it raised: see `error`)."""
    values = {f"spark-vllm:{k}": v if isinstance(v, str) else json.dumps(v) for k, v in raw.items()}
    secret = [
        f"spark-vllm:{k}"
        for k in ("ssh_private_key", "ssh_private_keys", "api_key", "hf_token")
        if k in raw
    ]
    runtime_config.set_all_config(values, secret)
    answers = NodeAnswers(_lenient(raw))
    monitor = RecordingMonitor(answers)
    monitor.error = None  # type: ignore[attr-defined]
    try:
        apply_program(_main, answers, stack=stack, monitor=monitor)
    except Exception as e:
        monitor.error = e  # type: ignore[attr-defined]
    finally:
        runtime_config.set_all_config({}, [])
    return monitor


def _main() -> dict[str, Any]:
    runpy.run_path(str(ROOT / "__main__.py"), run_name="__pulumi_main__")
    return {}


def _lenient(raw: dict[str, Any]) -> StackConfig:
    """A config for the mocks' node answers (the program validates `raw` itself)."""
    try:
        return load_stack_config(raw)
    except ConfigError:
        return load_stack_config(stack_raw("spark"))


def _plain(reg: Registration) -> dict[str, Any]:
    return {k: reg.plain(k) for k in reg.state}


def inputs_of(regs: dict[str, Registration]) -> dict[str, dict[str, Any]]:
    return {urn: _plain(reg) for urn, reg in regs.items()}


def changed_by(
    regs: dict[str, Registration], own: dict[str, dict[str, Any]]
) -> dict[str, Registration]:
    """The registrations whose inputs differ from the stack's own (`own`, inputs_of the
    same program on the unchanged config, which registers the same inputs run after run):
    only they can carry a value set in the config."""
    return {urn: reg for urn, reg in regs.items() if own.get(urn) != _plain(reg)}


def words_of(box: sandbox.Sandbox) -> list[str]:
    return [w for call in box.all_calls() for w in call[1:]]


# --- the tests ---------------------------------------------------------------------------


@pytest.mark.parametrize("stack", ["spark", "sim", "spark-models"])
def test_hostile_values_are_refused_or_stay_one_literal_argument(
    stack: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every string of the stack file (spark-models: a set of two models, given a router),
    and the optional ones it leaves out."""
    # With the host's NCCL: its path reaches the preflight script and every container.
    base = {**stack_raw(stack), "nccl": {"library": "host"}}
    optional: tuple[str, ...] = OPTIONAL
    if stack == "spark-models":
        base["router"], optional = ROUTER, OPTIONAL_SET
    paths = [*string_paths(base), *optional]
    problems: list[str] = []
    accepted: list[tuple[str, str]] = []
    for path in paths:
        for payload in PAYLOADS:
            raw = set_path(base, path, payload)
            try:
                load_stack_config(raw)
            except ConfigError as e:
                lines = [i.render() for i in e.issues]
                if not any(_names(line, path) and ". Fix: " in line for line in lines):
                    problems.append(f"{path}={payload[:40]!r}: refused without naming it: {lines}")
                continue
            accepted.append((path, payload))
    # Accepted values: every registered command the value changed runs in the sandbox (the
    # others are the stack's own, byte for byte, and run as they would without it); the
    # canary never runs and each value is one argument (or inside one) of the program it
    # reaches.
    runner = Runner(sandbox.Sandbox(tmp_path / "box"), monkeypatch)
    own = inputs_of(run_main(base, stack).registrations)
    for path, payload in accepted:
        runner.box.log.unlink(missing_ok=True)
        monitor = run_main(set_path(base, path, payload), stack)
        assert monitor.error is None, (path, payload[:40], monitor.error)  # type: ignore[attr-defined]
        regs = monitor.registrations
        changed = changed_by(regs, own)
        assert changed, f"{path}={payload[:40]!r}: accepted, but changed no registration"
        for mode in ("ok", "absent", "fail"):
            runner.run_all(changed, mode=mode)
        if runner.box.calls(CANARY):
            problems.append(f"{path}={payload[:40]!r}: RAN {runner.box.calls(CANARY)}")
        if not any(payload in w for w in words_of(runner.box)) and not _in_env(regs, payload):
            problems.append(f"{path}={payload[:40]!r}: accepted, but reached no program whole")
    assert not problems, "\n".join(problems)
    # The sweep must have exercised both outcomes.
    assert accepted and len(accepted) < len(paths) * len(PAYLOADS)


def test_the_hf_token_reaches_the_nodes_on_stdin_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every registered command run in the sandbox: the token is fed to the hub check and
    the weights download, and is no word of any program they start (docker gets
    `-e HF_TOKEN` by name)."""
    raw = {**stack_raw("spark"), "hf_token": TEST_HF_TOKEN}
    monitor = run_main(raw, "spark")
    assert monitor.error is None, monitor.error  # type: ignore[attr-defined]
    runner = Runner(sandbox.Sandbox(tmp_path / "box"), monkeypatch)
    runner.run_all(monitor.registrations, mode="ok")
    fed = [s for s in runner.stdins if TEST_HF_TOKEN in s]
    assert len(fed) == 2, f"the hub check and the download get it: {len(fed)}"
    assert not [w for w in words_of(runner.box) if TEST_HF_TOKEN in w]
    assert ["-e", "HF_TOKEN"] in [
        call[i : i + 2] for call in runner.box.calls("docker") for i in range(len(call))
    ]


def _names(line: str, path: str) -> bool:
    """The issue line names the field (pydantic reports a list or dict at its own path)."""
    field = line.split(" = ", 1)[0]
    return path.startswith(field) or field.startswith(path)


def _in_env(regs: dict[str, Registration], payload: str) -> bool:
    """The value is one whole `KEY=VALUE` item of a container's env (docker API, no shell)."""
    for reg in regs.values():
        envs = reg.plain("envs") or [] if reg.type.endswith("container:Container") else []
        if any(str(e).endswith(f"={payload}") for e in envs):
            return True
    return False


def test_the_sandbox_catches_a_payload_pasted_into_a_command(tmp_path: Path) -> None:
    """The checks above can fail: a value pasted inside quotes by hand runs the canary, and
    an ssh line that puts the user before the host reads a hostile user as an option."""
    box = sandbox.Sandbox(tmp_path)
    box.run(["bash", "-c", f"echo 'image {PAYLOADS[0]} is missing' >&2"])
    assert box.calls(CANARY)
    box.run(["ssh", f"-oProxyCommand={CANARY}@h", "true"])
    assert box.calls("ssh")[-1][1] == f"-oProxyCommand={CANARY}@h"  # an option, not a host
    box.log.unlink()
    box.run(SshTarget(f"-oProxyCommand={CANARY}", "h", 22, SshOptions()).argv("true"))
    assert box.calls("ssh")[-1][-3:] == ["--", "h", "true"]  # the user is -l's value
    assert not box.calls(CANARY)


# --- the seeded fuzz ---------------------------------------------------------------------

FUZZ_CASES = 300


def _mutations(base: dict[str, Any], rng: random.Random) -> Iterator[dict[str, Any]]:
    values: list[Any] = [
        *PAYLOADS, "", " ", "-", "..", "/", "~/x", "a" * 300, 0, -1, 2**63, 1.5, float("nan"),
        True, None, [], {}, ["x"], {"k": "v"}, "spark-1", "10.0.0.1", "ssh-ed25519 AAAA",
    ]  # fmt: skip
    for _ in range(FUZZ_CASES):
        raw = copy.deepcopy(base)
        for _ in range(rng.choice((1, 1, 2, 3))):
            kind = rng.random()
            path = rng.choice([path for path, _ in tree(raw)] or ["head"])
            try:
                if kind < 0.75:
                    raw = set_path(raw, path, rng.choice(values))
                elif kind < 0.85:
                    raw = _delete(raw, path)
                elif kind < 0.95:
                    raw = set_path(raw, rng.choice(OPTIONAL), rng.choice(values))
                else:
                    raw = set_path(raw, path.rsplit(".", 1)[0] + ".unknown_key", "x")
            except (KeyError, IndexError, TypeError, AttributeError):
                continue  # an earlier mutation removed the way there
        yield raw


def _delete(raw: dict[str, Any], path: str) -> dict[str, Any]:
    out = copy.deepcopy(raw)
    parts = _parts(path)
    node: Any = out
    for p in parts[:-1]:
        node = node[p]
    del node[parts[-1]]
    return out


def test_seeded_fuzz_of_the_spark_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(20261203)
    runner = Runner(sandbox.Sandbox(tmp_path / "box"), monkeypatch)
    refused = accepted = 0
    for i, raw in enumerate(_mutations(stack_raw("spark"), rng)):
        runner.box.log.unlink(missing_ok=True)
        monitor = run_main(raw, "spark")
        error = monitor.error  # type: ignore[attr-defined]
        shown = json.dumps(raw, default=str)[:1500]
        if isinstance(error, pulumi.RunError):
            refused += 1
            text = str(error)
            assert "nothing was deployed" in text and ". Fix: " in text, (i, text[:500], shown)
            assert monitor.registrations == {}, (i, text[:300])
            continue
        assert error is None, f"mutation {i}: {type(error).__name__}: {error}\n{shown}"
        accepted += 1
        runner.run_all(monitor.registrations, mode="absent")
        assert not runner.box.calls(CANARY), (i, runner.box.calls(CANARY), shown)
    print(f"fuzz: {refused} refused, {accepted} accepted")
    assert refused > 0 and accepted > 0, (refused, accepted)


# --- found tried as a new user would (each refused at preview with field, value and fix) --

SHELL_STARTUP = ["BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND", "IFS"]
LATE_FAILURES: list[tuple[str, Any, str]] = [
    # vLLM's argparse reads no option in it and stops, after the deploy.
    ("vllm.extra_args", ["-tp4"], "it means -tp"),
    ("vllm.extra_args", ["--max-num-seqs", "8", "-pp2"], "it means -pp"),
    # docker refuses an upper-case digest at the pull ("invalid reference format").
    ("image.ref", "hellohal2064/vllm-qwen3.5-gb10@sha256:" + "AB" * 32, "lower-case hex"),
    # an empty key file quietly meant "unset" (the stack's key used instead).
    ("nodes[1].ssh.private_key_file", "", "is empty"),
    ("ssh_private_key_file", " ", "is empty"),
]


@pytest.mark.parametrize(
    ("path", "value", "said"),
    [(f"vllm.env.{n}", f"$({CANARY})", f"{n} is read by the shell") for n in SHELL_STARTUP]
    + LATE_FAILURES,
    ids=[*SHELL_STARTUP, "-tp4", "-pp2", "upper-case digest", "empty key file", "blank key file"],
)
def test_values_that_would_run_a_command_or_fail_late_are_refused_at_preview(
    path: str, value: Any, said: str
) -> None:
    raw = stack_raw("spark")
    if path == "ssh_private_key_file":
        raw.pop("ssh_private_key")
    monitor = run_main(set_path(raw, path, value), "spark")
    error = monitor.error  # type: ignore[attr-defined]
    assert isinstance(error, pulumi.RunError), error
    text = str(error)
    line = next(line for line in text.splitlines() if said in line).strip().removeprefix("- ")
    assert _names(line, path), (path, line)
    assert ". Fix: " in line and "nothing was deployed" in text
    assert monitor.registrations == {}


def test_a_shell_startup_variable_would_have_run_in_the_server_container(tmp_path: Path) -> None:
    """Why BASH_ENV is refused: the model server's entrypoint is `bash -c SCRIPT`, and a
    non-interactive bash expands BASH_ENV (running its `$(...)`) before the script."""
    mark = tmp_path / "ran"
    subprocess.run(
        ["bash", "-c", "true"], env={"PATH": "/usr/bin:/bin", "BASH_ENV": f"$(touch {mark})"},
        check=True, timeout=30,
    )  # fmt: skip
    assert mark.exists(), "bash ran the command in BASH_ENV"


def test_per_node_secret_keys_set_with_config_set_secret_path(tmp_path: Path) -> None:
    """`pulumi config set --secret --path 'ssh_private_keys.spark-2' < key` stores a map;
    the program receives it as secret JSON text, and it works; the local engine reads a
    stack's map the same way (and refuses an encrypted `secure:` one, as it must)."""
    from localengine.program import StackConfigError, stack_config
    from sparkvllm.config import parse_pulumi_config

    own = TEST_PRIVATE_KEY.replace("7f3a", "2b2b")
    raw = {**stack_raw("spark"), "ssh_private_keys": {"spark-2": own}}
    monitor = run_main(raw, "spark")
    assert monitor.error is None, monitor.error  # type: ignore[attr-defined]
    values, secret = stack_config(ROOT, "spark", raw, ["ssh_private_key", "ssh_private_keys"])
    assert values["spark-vllm:ssh_private_keys"] == json.dumps({"spark-2": own})
    cfg = load_stack_config(parse_pulumi_config(values, secret))
    assert cfg.ssh_private_keys is not None
    assert cfg.ssh_private_keys["spark-2"].get_secret_value().strip() == own.strip()
    encrypted = {**raw, "ssh_private_keys": {"spark-2": {"secure": "v1:abc:def"}}}
    with pytest.raises(StackConfigError, match="ssh_private_keys is an encrypted `secure:`"):
        stack_config(ROOT, "spark", encrypted, ["ssh_private_keys"])


def test_urls_bracket_ipv6_and_the_dashboard_tunnel_goes_through_the_jump_host() -> None:
    from sparkvllm.specs import containers, plans

    raw = stack_raw("spark")
    raw["endpoint_host"] = "fd00::1"
    raw["ssh_jump"] = {"host": "fd00::9", "port": 2222, "user": "bastion",
                       "host_key": SIM_HOST_KEYS["spark-1"]}  # fmt: skip
    cfg = load_stack_config(raw)
    assert plans.model_server(cfg, "spark").endpoint == "http://[fd00::1]:8000/v1"
    _url, tunnel = containers.dashboard_access(cfg)
    assert " -J 'bastion@[fd00::9]:2222' " in f" {tunnel} ", tunnel
    assert tunnel.endswith("-p 22 -l aurora -- 10.1.230.180")
    without = load_stack_config(stack_raw("spark"))
    assert "-J" not in containers.dashboard_access(without)[1]
