"""Access per node: a key of its own (a secret, or a key file), falling back to the stack's,
and a jump host for the whole stack or one node, its host key verified too. Every way the
program reaches a node carries them: pulumi-command's connection (its `proxy`), the docker
provider's ssh options, the NodeSteps, the drift check's ssh, the node-to-node hops."""

from __future__ import annotations

import base64
import copy
import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from localengine.providers.command import CommandProvider
from sparkvllm.config import ConfigError, load_stack_config
from sparkvllm.workstation import prepare_ssh_access
from tests.conftest import ROOT, TEST_PRIVATE_KEY, four_node_raw
from tests.pulumi_mocks import run_program

WORKER_KEY = TEST_PRIVATE_KEY.replace("7f3a", "w2k2")
JUMP_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKHcl9bT/9gFYVZnmw1E3g7xHknRj9LQmHFRS8dGBCb7"
JUMP = {"host": "bastion.lab", "user": "jumper", "port": 2222, "host_key": JUMP_KEY}


@pytest.fixture
def raw(spark_raw: dict[str, Any]) -> dict[str, Any]:
    """The spark stack behind a bastion, spark-2 with a key of its own (a secret)."""
    out = copy.deepcopy(spark_raw)
    out["ssh_jump"] = dict(JUMP)
    out["ssh_private_keys"] = {"spark-2": WORKER_KEY}
    return out


def _plain(value: Any) -> Any:
    from tests.pulumi_mocks import unwrap_secrets

    return unwrap_secrets(value)


def test_every_transport_to_a_node_goes_through_the_jump_host_with_the_nodes_key(
    raw: dict[str, Any],
) -> None:
    cfg = load_stack_config(raw)
    access = prepare_ssh_access(cfg, "test", ROOT)
    run = run_program(cfg, access)
    # pulumi-command: the connection's proxy, with the node's own key and the jump's host key.
    for r in run.of_type("command:remote:Command"):
        conn = r.plain("connection")
        node = "spark-2" if conn["host"] == "10.1.230.181" else "spark-1"
        assert conn["proxy"]["host"] == "bastion.lab" and conn["proxy"]["port"] == 2222
        assert conn["proxy"]["user"] == "jumper" and conn["proxy"]["hostKey"] == JUMP_KEY
        key = WORKER_KEY if node == "spark-2" else TEST_PRIVATE_KEY
        assert conn["privateKey"] == key == conn["proxy"]["privateKey"], r.name
        assert r.secret_input("connection")
    # The docker provider's ssh: a ProxyCommand to the bastion with the same key and a
    # known_hosts file that holds the bastion's key.
    for p in run.of_type("pulumi:providers:docker"):
        opts = json.loads(p.plain("sshOpts"))  # provider config arrives as JSON text
        proxy = next(o for o in opts if o.startswith("ProxyCommand="))
        words = shlex.split(proxy.removeprefix("ProxyCommand="))
        assert words[0] == "ssh"
        assert words[-8:] == ["-W", "%h:%p", "-p", "2222", "-l", "jumper", "--", "bastion.lab"]
        assert "StrictHostKeyChecking=yes" in words
        ident = next(o for o in opts if o.startswith("IdentityFile="))
        assert ident in words  # the jump gets the node's key
    worker_opts = json.loads(run.by_name("spark-2-docker").plain("sshOpts"))
    assert any(o.endswith("/id.spark-2") for o in worker_opts)
    # NodeSteps: the jump, and for a step the head runs to the worker, the worker's key.
    sync = run.by_name("image-sync-spark-2")
    assert sync.plain("jump") == ["bastion.lab", 2222, "jumper", JUMP_KEY]
    assert sync.plain("read_identity_file").endswith("/id.spark-2")
    assert sync.plain("identity_file").endswith("/id")
    # The workstation's files: the worker's key 0600, the bastion in both known_hosts.
    state = Path(access.control_dir_ref).expanduser()
    assert (state / "id.spark-2").read_text() == WORKER_KEY
    assert (state / "id.spark-2").stat().st_mode & 0o777 == 0o600
    for kh in (state / "known_hosts.spark-2", Path(access.known_hosts_file)):
        assert f"[bastion.lab]:2222 {JUMP_KEY}" in kh.read_text().splitlines()
    assert "w2k2" not in json.dumps(run.outputs, default=str)  # no key in any output
    for r in run.of_type("pulumi-python:dynamic:Resource"):  # nor a pickled provider
        assert b"w2k2" not in base64.b64decode(str(r.plain("__provider"))), r.name
    # No key in any input outside the connections (secret) and the pickled providers.
    for r in run.registrations.values():
        if r.type != "command:remote:Command":
            assert "w2k2" not in json.dumps(r.state, default=str), r.name


def test_the_drift_checks_ssh_and_the_sandboxed_step_go_through_the_jump(
    raw: dict[str, Any],
) -> None:
    cfg = load_stack_config(raw)
    access = prepare_ssh_access(cfg, "test", ROOT)
    argv = access.targets["spark-2"].argv("true")
    proxy = next(w for w in argv if w.startswith("ProxyCommand="))
    assert "bastion.lab" in proxy and "%h:%p" in proxy
    assert f"IdentityFile={access.node_identity_files['spark-2']}" in argv
    assert argv[-6:] == ["-p", "22", "-l", "aurora", "--", "10.1.230.181", "true"][-6:]


def test_a_node_can_name_its_own_jump_and_key_file(
    spark_raw: dict[str, Any], tmp_path: Path
) -> None:
    raw = copy.deepcopy(spark_raw)
    key = tmp_path / "worker_key"
    key.write_text(WORKER_KEY)
    raw["nodes"][1]["ssh"]["private_key_file"] = str(key)
    raw["nodes"][1]["ssh"]["jump"] = dict(JUMP)
    cfg = load_stack_config(raw)
    assert cfg.jump_for(cfg.nodes[0]) is None
    access = prepare_ssh_access(cfg, "test", ROOT)
    assert access.key_of("spark-2") == WORKER_KEY and access.key_of("spark-1") == TEST_PRIVATE_KEY
    assert not any(w.startswith("ProxyCommand=") for w in access.targets["spark-1"].argv())
    assert any(w.startswith("ProxyCommand=") for w in access.targets["spark-2"].argv())


def test_every_node_with_its_own_key_needs_no_stack_key(spark_raw: dict[str, Any]) -> None:
    raw = copy.deepcopy(spark_raw)
    raw.pop("ssh_private_key")
    raw["ssh_private_keys"] = {"spark-1": TEST_PRIVATE_KEY, "spark-2": WORKER_KEY}
    cfg = load_stack_config(raw)
    access = prepare_ssh_access(cfg, "test", ROOT)
    assert access.key_of("spark-1") == TEST_PRIVATE_KEY and access.key_of("spark-2") == WORKER_KEY


def test_the_relay_takes_the_workers_shared_key_and_is_left_out_when_one_has_its_own(
    spark_raw: dict[str, Any],
) -> None:
    """Four nodes: the relay's hops all use one key (forwarded by the head's agent), so
    its stdin is the workers' key, the head's own key notwithstanding; a worker with a key
    of its own means no relay (each worker's stream step sends its own key)."""
    from tests.conftest import four_node_raw

    raw = four_node_raw(spark_raw)
    raw["ssh_private_keys"] = {"spark-1": WORKER_KEY}  # the head's own; workers: stack key
    cfg = load_stack_config(raw)
    access = prepare_ssh_access(cfg, "test", ROOT)
    relay = run_program(cfg, access).by_name("image-relay")
    assert relay.plain("stdin_identity") is True
    assert Path(relay.plain("read_identity_file")).read_text() == TEST_PRIVATE_KEY
    assert Path(relay.plain("identity_file")).read_text() == WORKER_KEY  # reaching the head

    raw["ssh_private_keys"] = {"spark-3": WORKER_KEY}
    cfg = load_stack_config(raw)
    run = run_program(cfg, prepare_ssh_access(cfg, "test", ROOT))
    assert [r for r in run.registrations.values() if r.name == "image-relay"] == []


@pytest.mark.parametrize(
    ("change", "field", "problem"),
    [
        ({"ssh_private_keys": {"spark-9": WORKER_KEY}}, "ssh_private_keys.spark-9",
         "no node has this name"),
        ({"ssh_private_key": None, "ssh_private_keys": {"spark-2": WORKER_KEY}},
         "ssh_private_key", "nodes without a key of their own: spark-1"),
        ({"ssh_jump": {"host": "bastion.lab", "user": "j"}}, "ssh_jump",
         "give exactly one of host_key or host_key_file"),
        ({"ssh_jump": {**JUMP, "host": "-oProxyCommand=x"}}, "ssh_jump.host",
         "not an IP address or DNS name"),
        ({"ssh_jump": {**JUMP, "user": "-x"}}, "ssh_jump.user", "not a login name"),
    ],
    ids=["unknown node", "a node without a key", "jump without a host key", "jump host",
         "jump user"],
)  # fmt: skip
def test_bad_access_values_name_the_field_and_the_fix(
    spark_raw: dict[str, Any], change: dict[str, Any], field: str, problem: str
) -> None:
    raw = {**copy.deepcopy(spark_raw), **change}
    raw = {k: v for k, v in raw.items() if v is not None}
    with pytest.raises(ConfigError) as e:
        load_stack_config(raw)
    text = str(e.value)
    assert field in text and problem in text and "fix:" in text.lower(), text
    assert "w2k2" not in text  # a key is never echoed


def test_the_local_engine_dials_the_proxy_as_pulumi_command_does() -> None:
    """connection.proxy gets pulumi-command's defaults and becomes a ProxyCommand with the
    proxy's own key and host key (proxyConnection.go Annotate; connection.go Dial)."""
    provider = CommandProvider(lambda *a, **k: None)
    checked = provider.check(
        "command:remote:Command", {},
        {"connection": {"host": "10.0.0.2", "privateKey": TEST_PRIVATE_KEY, "hostKey": JUMP_KEY,
                        "proxy": {"host": "10.0.0.1", "privateKey": WORKER_KEY}}},
    )  # fmt: skip
    conn = checked["connection"]
    assert conn["proxy"]["user"] == "root" and conn["proxy"]["port"] == 22
    assert conn["proxy"]["dialErrorLimit"] == 10 and conn["proxy"]["perDialTimeout"] == 15
    target = provider._target(conn)
    argv = target.argv("true")
    proxy = shlex.split(next(w for w in argv if w.startswith("ProxyCommand=")).split("=", 1)[1])
    assert proxy[-6:] == ["-p", "22", "-l", "root", "--", "10.0.0.1"] and "%h:%p" in proxy
    # The proxy: no hostKey, so not verified (as the Go client); its own key file.
    assert "StrictHostKeyChecking=no" in proxy
    proxy_key = next(w for w in proxy if w.startswith("IdentityFile=")).split("=", 1)[1]
    assert Path(proxy_key).read_text() == WORKER_KEY
    # The host itself: verified against its hostKey.
    assert "StrictHostKeyChecking=yes" in argv
    # The key copies live as long as the provider (a run): closed, they are gone.
    directory = Path(proxy_key).parent
    assert {p.read_text() for p in directory.glob("key-*")} == {TEST_PRIVATE_KEY, WORKER_KEY}
    provider.close()
    assert not directory.exists()


@pytest.mark.parametrize("field", ["host", "user"])
def test_no_jump_host_value_reaches_the_proxy_command_unchecked(
    spark_raw: dict[str, Any], field: str
) -> None:
    """ssh runs a ProxyCommand with the user's shell: every hostile value is refused."""
    from tests.test_hostile_input import PAYLOADS

    for payload in PAYLOADS:
        raw = {**copy.deepcopy(spark_raw), "ssh_jump": {**JUMP, field: payload}}
        with pytest.raises(ConfigError) as e:
            load_stack_config(raw)
        assert f"ssh_jump.{field}" in str(e.value), (payload[:30], str(e.value))


def test_two_projects_with_a_stack_of_the_same_name_keep_their_keys_apart(
    spark_raw: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workstation's files are under <state>/<project>/<stack>; the folder of before,
    <state>/<stack>, is left as it is (a stack deployed then names its files there until
    its next `up` records the new ones)."""
    monkeypatch.setenv("SPARKVLLM_STATE_DIR", str(tmp_path))
    before = tmp_path / "dev"
    before.mkdir()
    (before / "known_hosts.spark-9").write_text("a node no longer in the config\n")
    keys = {"one": TEST_PRIVATE_KEY, "two": WORKER_KEY}
    for project, key in keys.items():
        cfg = load_stack_config({**spark_raw, "ssh_private_key": key})
        access = prepare_ssh_access(cfg, "dev", ROOT, project)
        assert access.control_dir_ref == f"{tmp_path}/{project}/dev"
        assert access.reaches["spark-1"].identity_file == f"{tmp_path}/{project}/dev/id"
    for project, key in keys.items():
        assert (tmp_path / project / "dev" / "id").read_text() == key
    assert [p.name for p in before.iterdir()] == ["known_hosts.spark-9"]
    # Without a project named, the one Pulumi.yaml names (the program's, pulumi.get_project()).
    cfg = load_stack_config(spark_raw)
    assert prepare_ssh_access(cfg, "dev", ROOT).control_dir_ref == f"{tmp_path}/spark-vllm/dev"


def test_the_docker_providers_control_sockets_fit_a_unix_socket_path(
    spark_raw: dict[str, Any],
) -> None:
    """ssh makes a control socket under its path and a 17-character suffix first, and a
    Unix socket's path is under 108 bytes: with ssh's own `cm-%C` (43 characters) under
    ~/.cache/spark-vllm/<project>/<stack>, the README's /home/aurora with the spark stack
    was one byte too long. Each node its own socket."""
    from sparkvllm.specs.ssh import Reach

    cfg = load_stack_config(four_node_raw(spark_raw))
    home, folder = "/home/" + "u" * 14, "~/.cache/spark-vllm/spark-vllm/mysparks"
    names = set()
    for node in cfg.nodes:
        reach = Reach(host=node.ssh.host, port=22, user="aurora", host_key=None,
                      identity_file=f"{folder}/id")  # fmt: skip
        (path,) = [o.removeprefix("ControlPath=") for o in reach.docker_ssh_opts("kh", folder)
                   if o.startswith("ControlPath=")]  # fmt: skip
        assert len(path.replace("~", home, 1)) + 17 < 108, path
        names.add(path)
    assert len(names) == len(cfg.nodes)
