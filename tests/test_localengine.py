"""The local engine's rules, scenario by scenario (after pulumi's pkg/engine/lifecycletest):
a small Pulumi program in a temp project, run through `localengine.operations.run` with the
provider models' node side effects replaced by an in-memory node. The decisions (check,
diff, same/update/replace, order, state) are the real ones."""

from __future__ import annotations

import copy
import json
import os
import re
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from localengine import __main__ as cli
from localengine.operations import Result, run
from localengine.providers.base import Provider, ProviderError
from localengine.providers.command import CommandProvider
from localengine.providers.docker import DockerProvider, _target
from localengine.state import StateFile
from tests.conftest import project_yaml, write_project

PROGRAM = textwrap.dedent(
    """
    import pulumi
    import pulumi_command as command
    import pulumi_docker as docker
    from pulumi.dynamic import CreateResult, DiffResult, ReadResult, Resource, ResourceProvider

    cfg = pulumi.Config()
    conn = command.remote.ConnectionArgs(
        host="127.0.0.1", user="root", private_key=pulumi.Output.secret("TEST-KEY-9f1"))
    a = command.remote.Command(
        "a", connection=conn, create=cfg.get("a") or "echo a", delete="echo undo-a",
        triggers=[cfg.get("trigger") or "1"])
    if not cfg.get_bool("drop_b"):
        b = command.remote.Command(
            "b", connection=conn, create=a.stdout.apply(lambda s: f"echo b-{s}"),
            delete="echo undo-b", opts=pulumi.ResourceOptions(depends_on=[a]))
        pulumi.export("b", b.stdout)

    class Box(pulumi.ComponentResource):
        def __init__(self, name, opts=None):
            super().__init__("test:index:Box", name, None, opts)
            self.cmd = command.remote.Command(
                f"{name}-cmd", connection=conn, create="echo box",
                opts=pulumi.ResourceOptions(parent=self))
            self.register_outputs({})

    box_name = cfg.get("box") or "box"
    Box(box_name, pulumi.ResourceOptions(
        aliases=[pulumi.Alias(name="box")] if box_name != "box" else None))

    p = docker.Provider("node", host="ssh://root@127.0.0.1:22",
                        ssh_opts=[cfg.get("ssh_opt") or "-oBatchMode=yes"])
    img = docker.RemoteImage("img", name=cfg.get("image") or "repo:1", keep_locally=True,
                             opts=pulumi.ResourceOptions(provider=p))
    c = docker.Container(
        "web", name="web", image=img.image_id, command=[cfg.get("cmd") or "serve"],
        network_mode="host",
        restart=cfg.get("restart") or "unless-stopped",
        envs=[f"MODE={cfg.get('mode') or 'x'}"],
        opts=pulumi.ResourceOptions(
            provider=p, depends_on=[a],
            ignore_changes=["envs"] if cfg.get_bool("ignore_env") else None))

    class Mark(ResourceProvider):
        def create(self, props):
            return CreateResult("mark-1", {"label": props["label"], "ok": True})
        def read(self, id_, props):
            ok = not (cfg_gone := props.get("label") == "vanish")
            return ReadResult(id_ if ok else "", {**props, "ok": ok})
        def diff(self, id_, olds, news):
            return DiffResult(changes=olds.get("label") != news["label"], replaces=["label"])

    class MarkRes(Resource):
        def __init__(self, name, label):
            super().__init__(Mark(), name, {"label": label, "ok": None})

    MarkRes("mark", cfg.get("label") or "one")
    """
)


@dataclass
class Node:
    """One in-memory node: commands run, containers, images, and a record of every call."""

    calls: list[str] = field(default_factory=list)
    fail: set[str] = field(default_factory=set)
    containers: dict[str, dict[str, Any]] = field(default_factory=dict)
    images: dict[str, str] = field(default_factory=lambda: {"repo:1": "sha256:aaa"})
    counter: int = 0
    started: set[str] = field(default_factory=set)
    daemon_down: bool = False


def _no_transport(*_a: Any, **_kw: Any) -> Any:
    raise AssertionError("the in-memory node never reaches a transport")


class FakeCommand(CommandProvider):
    def __init__(self, node: Node):
        super().__init__(transport=_no_transport)
        self.node = node

    def _run(
        self, name: str, inputs: dict[str, Any], command: str, previous: Any
    ) -> dict[str, Any]:
        self.node.calls.append(f"run {command}")
        if command in self.node.fail:
            raise ProviderError(f"{name}: command failed (exit 1): boom")
        return {**inputs, "stdout": command.replace("echo ", ""), "stderr": ""}


class FakeDocker(DockerProvider):
    def __init__(self, node: Node, inputs: dict[str, Any]):
        self._transport = _no_transport
        self._target = _target(inputs)
        self.node = node

    def _create_container(self, name: str, inputs: dict[str, Any]) -> str:
        self.node.counter += 1
        cid = f"c{self.node.counter}"
        self.node.calls.append(f"docker run {inputs['name']} {inputs['image']}")
        self.node.containers[cid] = {
            "Id": cid, "Name": f"/{inputs['name']}", "Image": inputs["image"],
            "Config": {"Cmd": inputs.get("command") or [], "Image": inputs["image"],
                       "Entrypoint": inputs.get("entrypoints")},
            "HostConfig": {"NetworkMode": inputs.get("networkMode", "bridge"),
                           "IpcMode": inputs.get("ipcMode", "private"),
                           "PidMode": inputs.get("pidMode", ""),
                           "RestartPolicy": {"Name": inputs.get("restart"),
                                             "MaximumRetryCount": inputs.get("maxRetryCount", 0)}},
            "State": {"Running": False, "ExitCode": 0},
        }  # fmt: skip
        return cid

    def _inspect_container(self, id_or_name: str) -> dict[str, Any] | None:
        if self.node.daemon_down:
            raise ProviderError("docker on 127.0.0.1 failed: Cannot connect to the Docker daemon")
        found = self.node.containers.get(id_or_name)
        return copy.deepcopy(found) if found else None

    def _start(self, name: str, id_: str) -> None:
        if self.node.containers[id_]["Config"]["Cmd"] == ["crash"]:
            raise ProviderError(f"{name}: start failed: exec format error")
        if id_ in self.node.started:  # the first start is part of the create
            self.node.calls.append(f"docker start {id_}")
        self.node.started.add(id_)
        self.node.containers[id_]["State"] = {"Running": True, "ExitCode": 0}

    def _update_restart(self, name: str, id_: str, restart: str) -> None:
        self.node.calls.append(f"docker update {id_} {restart}")
        self.node.containers[id_]["HostConfig"]["RestartPolicy"]["Name"] = restart

    def _remove_container(self, id_: str, grace: int, volumes: bool) -> None:
        self.node.calls.append(f"docker rm {id_}")
        self.node.containers.pop(id_, None)

    def _image_id(self, ref: str) -> str | None:
        return self.node.images.get(ref)

    def _pull(self, name: str, ref: str) -> None:
        self.node.calls.append(f"docker pull {ref}")
        self.node.images[ref] = "sha256:pulled"

    def _remove_image(self, name: str, ref: str, force: bool) -> None:
        self.node.calls.append(f"docker image rm {ref}")
        self.node.images.pop(ref, None)


@dataclass
class Project:
    dir: Path
    node: Node

    def config(self, **values: Any) -> None:
        cfg = {f"spark-vllm:{k}": v for k, v in values.items()}
        (self.dir / "Pulumi.test.yaml").write_text(yaml.safe_dump({"config": cfg}))

    def factory(self, pkg: str, inputs: dict[str, Any]) -> Provider | None:
        """Node side effects in memory; dynamic providers the engine's own (the SDK's
        provider host, started in the project's folder)."""
        if pkg == "command":
            return FakeCommand(self.node)
        if pkg == "docker":
            return FakeDocker(self.node, inputs)
        return None

    def run(self, operation: str = "up", **kw: Any) -> Result:
        self.node.calls.clear()
        return run(
            operation, "test", self.dir, provider_factory=self.factory, log=lambda _m: None, **kw
        )

    def state(self) -> dict[str, Any]:
        path = self.dir / ".localengine" / "stacks" / "spark-vllm" / "test.json"
        return json.loads(path.read_text())["checkpoint"]["latest"]

    def web(self) -> dict[str, Any]:
        return next(iter(self.node.containers.values()))


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Project:
    return make_project(tmp_path, monkeypatch)


def make_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Project:
    """PROGRAM in a temp project with an in-memory node; no backend or passphrase set."""
    monkeypatch.delenv("LOCALENGINE_BACKEND_URL", raising=False)
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE", raising=False)
    (tmp_path / "Pulumi.yaml").write_text(project_yaml("spark-vllm"))
    (tmp_path / "__main__.py").write_text(PROGRAM)
    p = Project(tmp_path, Node())
    p.config()
    return p


def ops(result: Result) -> dict[str, str]:
    """name -> op, for every step that is not `same`."""
    assert not result.error, result.error
    return {s.name: s.op for s in result.steps if s.op != "same"}


def test_first_up_creates_everything_and_a_second_up_is_a_no_op(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = project.run()
    assert set(ops(first).values()) == {"create"}
    assert {"a", "b", "box", "box-cmd", "node", "img", "web", "mark"} <= set(ops(first))
    assert first.outputs["b"] == "b-a"
    saves: list[int] = []
    real_save = StateFile.save

    def counted(self: StateFile, *args: Any, **kwargs: Any) -> None:
        saves.append(len(args[0]))
        real_save(self, *args, **kwargs)

    monkeypatch.setattr(StateFile, "save", counted)
    again = project.run()
    assert ops(again) == {}
    assert again.provider_writes == 0 and project.node.calls == []
    assert again.outputs["b"] == "b-a"
    # Nothing changed: every step's write is elided (snapshot.go mustWrite; a refresh's
    # reads too) and the run writes once, at its end (the elided writes flushed at Close).
    assert len(saves) == 1
    saves.clear()
    project.config(a="echo A2")
    assert ops(project.run()) == {"a": "update", "b": "update"}
    assert len(saves) > 1  # a change is written as it happens (and its pending operation)


def test_preview_runs_nothing_and_shows_what_up_does(project: Project) -> None:
    project.run()
    project.config(a="echo A2")
    plan = project.run("preview")
    assert project.node.calls == [] and plan.provider_writes == 0
    # a's stdout is unknown in the preview of its update, so b's create input is unknown.
    assert ops(plan) == {"a": "update", "b": "update"}
    done = project.run()
    assert ops(done) == {"a": "update", "b": "update"}
    assert project.node.calls == ["run echo A2", "run echo b-A2"]


def test_unchanged_stdout_after_an_update_leaves_the_dependent_same(project: Project) -> None:
    project.run()
    project.config(a="echo  a".replace("  ", " "), trigger="1")
    assert ops(project.run()) == {}


def test_triggers_replace_create_first_and_delete_the_old_after_the_program(
    project: Project,
) -> None:
    project.run()
    project.config(trigger="2")
    assert ops(project.run("preview"))["a"] == "replace"
    result = project.run()
    assert ops(result)["a"] == "replace"
    calls = project.node.calls
    assert calls.index("run echo a") < calls.index("run echo undo-a")  # create before delete
    assert calls[-1] == "run echo undo-a"  # the old one goes after everything else ran


def test_container_force_new_deletes_before_it_creates(project: Project) -> None:
    project.run()
    project.node.images["repo:2"] = "sha256:bbb"
    project.config(image="repo:2")
    assert ops(project.run("preview")) == {"img": "replace", "web": "replace"}
    result = project.run()
    assert ops(result) == {"img": "replace", "web": "replace"}
    calls = project.node.calls
    assert calls.index("docker rm c1") < calls.index("docker run web sha256:bbb")
    assert "docker image rm repo:1" not in calls  # keepLocally


def test_in_place_container_update_changes_the_restart_policy_only(project: Project) -> None:
    project.run()
    project.config(restart="always")
    result = project.run()
    assert ops(result) == {"web": "update"}
    assert project.node.calls == ["docker update c1 always"]


def test_env_change_replaces_unless_ignored(project: Project) -> None:
    project.run()
    project.config(mode="y")
    assert ops(project.run("preview")) == {"web": "replace"}
    project.config(mode="y", ignore_env=True)
    assert ops(project.run("preview")) == {}


def test_provider_config_change_updates_the_provider_and_replaces_nothing(project: Project) -> None:
    project.run()
    project.config(ssh_opt="-oConnectTimeout=5")
    assert ops(project.run()) == {"node": "update"}


def test_unregistered_resources_are_deleted_dependents_first(project: Project) -> None:
    project.run()
    project.config(drop_b=True)
    result = project.run()
    assert ops(result) == {"b": "delete"}
    assert project.node.calls == ["run echo undo-b"]
    assert all(not r["urn"].endswith("::b") for r in project.state()["resources"])


def test_destroy_deletes_in_reverse_dependency_order(project: Project) -> None:
    project.run()
    result = project.run("destroy")
    assert not result.error
    calls = project.node.calls
    assert calls.index("run echo undo-b") < calls.index("run echo undo-a")
    assert calls.index("docker rm c1") < calls.index("run echo undo-a")  # web depends on a
    assert project.state()["resources"] == []


def test_renamed_component_keeps_its_resources_through_aliases(project: Project) -> None:
    project.run()
    project.config(box="crate")
    result = project.run()
    assert ops(result) == {}, "the component and its child are found under their old URNs"
    urns = [r["urn"] for r in project.state()["resources"]]
    assert any(u.endswith("test:index:Box$command:remote:Command::crate-cmd") for u in urns)
    assert not any(u.endswith("::box-cmd") for u in urns)


def test_refresh_drops_a_removed_container_and_up_recreates_it(project: Project) -> None:
    project.run()
    project.node.containers.clear()
    plan = project.run("preview", refresh=True)
    assert [s.op for s in plan.refresh_steps if s.name == "web"] == ["delete"]
    assert ops(plan) == {"web": "create"}
    assert project.node.containers == {}, "a preview changes nothing"
    assert ops(project.run(refresh=True)) == {"web": "create"}
    assert ops(project.run(refresh=True)) == {}


def test_refresh_of_a_stopped_container_records_must_run_false_and_up_starts_it(
    project: Project,
) -> None:
    project.run()
    project.web()["State"] = {"Running": False, "ExitCode": 137}
    plan = project.run("preview", refresh=True)
    assert ops(plan) == {"web": "update"}
    assert project.node.containers, "the read does not delete the stopped container"
    project.run(refresh=True)
    assert project.node.calls[-1] == "docker start c1"
    assert ops(project.run(refresh=True)) == {}


def test_a_command_is_never_read_back(project: Project) -> None:
    project.run()
    result = project.run("refresh")
    assert {s.op for s in result.refresh_steps} == {"same"}
    assert not result.changed


def test_dynamic_read_that_finds_the_resource_gone_makes_up_create_it(project: Project) -> None:
    project.run()
    project.config(label="vanish")
    plan = project.run("preview")
    assert ops(plan) == {"mark": "replace"}  # the provider's diff replaces on label
    project.run()
    refreshed = project.run("refresh")
    assert [s.op for s in refreshed.refresh_steps if s.name == "mark"] == ["delete"]


def test_failure_stops_new_steps_keeps_what_was_done_and_the_next_up_continues(
    project: Project,
) -> None:
    project.node.fail.add("echo a")
    failed = project.run()
    assert "a: create failed" in failed.error and "boom" in failed.error
    names = {r["urn"].rsplit("::", 1)[-1] for r in project.state()["resources"]}
    assert "a" not in names and "b" not in names and "web" not in names
    project.node.fail.clear()
    resumed = project.run()
    assert {"a", "b", "web"} <= set(ops(resumed))
    assert "box-cmd" not in ops(resumed) or ops(resumed)["box-cmd"] == "create"


def test_a_failed_step_ends_the_program_quietly_and_its_error_is_shown_once(
    project: Project,
) -> None:
    """source_eval.go: once a step failed, the monitor answers Unavailable; the SDK ends
    the program without a traceback (RunError) and only the step's error is shown."""
    project.node.fail.add("echo a")
    shown: list[str] = []
    failed = run("up", "test", project.dir, provider_factory=project.factory, log=shown.append)
    assert failed.error == "a: create failed: a: command failed (exit 1): boom"
    assert not [line for line in shown if "Traceback" in line or "boom" in line], shown
    assert not [line for line in shown if "Program failed" in line or "monitor" in line], shown


def test_a_secret_is_never_shown_even_when_a_failing_command_echoes_it(project: Project) -> None:
    """The CLI hides its secret config in all it shows (logging.FilterString); the local
    engine hides every secret of the run: here the key a command's error echoes."""

    class Echoing(FakeCommand):
        def _run(self, name: str, inputs: dict[str, Any], command: str, previous: Any) -> Any:
            key = inputs["connection"]["value"]["privateKey"]
            raise ProviderError(f'{name}: command failed (exit 1): echo {key} "{key}"')

    shown: list[str] = []
    factory = project.factory

    def echoing(pkg: str, inputs: dict[str, Any]) -> Provider | None:
        return Echoing(project.node) if pkg == "command" else factory(pkg, inputs)

    result = run("up", "test", project.dir, log=shown.append, provider_factory=echoing)
    assert "command failed" in result.error and "[secret]" in result.error
    assert not [line for line in [result.error, *shown] if "TEST-KEY-9f1" in line]


def test_the_secret_filter_follows_the_clis_rules() -> None:
    from localengine import wire

    shown = wire.SecretFilter()
    shown.add({"a": wire.secret({"k": 'p"w1', "short": "ab", "b": "true"}), "plain": "visible"})
    assert (
        shown('got p"w1 and p\\"w1, ab, true, visible')
        == "got [secret] and [secret], ab, true, visible"
    )
    # A connection: where and who stay readable, the key does not (connection.go).
    shown.add(wire.secret({"host": "10.0.0.5", "user": "root", "privateKey": "KEY-LINE-1"}))
    assert shown("ssh root@10.0.0.5 -i KEY-LINE-1") == "ssh root@10.0.0.5 -i [secret]"


def test_a_plain_output_that_echoes_a_secret_is_sealed_at_rest_and_stays_plain(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`a` prints the connection's key (its stdout is not secret: pulumi-command marks it
    only through additionalSecretOutputs) and `b`'s command is built from it: neither is in
    the file in clear, both come back as the plain values they were, and an export seals
    them as secrets."""
    from localengine.export import untyped_deployment
    from localengine.state import StateFile

    project.config(a="echo TEST-KEY-9f1")
    assert not project.run().error
    path = project.dir / ".localengine" / "stacks" / "spark-vllm" / "test.json"
    assert (
        "TEST-KEY-9f1" not in path.read_text() and "localengine:echoes-a-secret" in path.read_text()
    )
    loaded = {r.name: r for r in StateFile(project.dir, "test").load()}
    assert loaded["a"].outputs["stdout"] == "TEST-KEY-9f1"
    assert loaded["b"].inputs["create"] == "echo b-TEST-KEY-9f1"
    again = project.run()
    assert not again.error and all(s.op == "same" for s in again.steps)
    exported = json.dumps(untyped_deployment(list(loaded.values()), "pw"))
    assert "TEST-KEY-9f1" not in exported


def test_secrets_are_encrypted_in_the_state_file(project: Project) -> None:
    project.run()
    text = (project.dir / ".localengine" / "stacks" / "spark-vllm" / "test.json").read_text()
    assert "TEST-KEY-9f1" not in text and "ciphertext" in text
    assert ops(project.run()) == {}, "decrypted inputs diff as equal"


def test_cli_expect_no_changes_exits_7_when_something_changes(
    project: Project, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "run", lambda *a, **kw: project.run(*a[:1], **{
        k: v for k, v in kw.items() if k in ("refresh", "replace_urns")}))  # fmt: skip
    here = ["--cwd", str(project.dir)]
    assert cli.main(["up", "--stack", "test", "--json", *here]) == 0
    assert cli.main(["preview", "--stack", "test", "--expect-no-changes", "--json", *here]) == 0
    project.config(restart="always")
    assert cli.main(["preview", "--stack", "test", "--expect-no-changes", "--json", *here]) == 7
    out = json.loads(capsys.readouterr().out.strip().split("\n}\n")[-1] or "{}")
    assert out["counts"]["update"] == 1


def test_replace_flag_forces_a_replacement(project: Project) -> None:
    project.run()
    urn = next(r["urn"] for r in project.state()["resources"] if r["urn"].endswith("::a"))
    result = project.run(replace_urns=frozenset({urn}))
    assert ops(result)["a"] == "replace"


def test_a_replaced_resource_whose_delete_failed_stays_pending_and_is_deleted_next_up(
    project: Project,
) -> None:
    project.run()
    project.node.fail.add("echo undo-a")
    project.config(trigger="2")
    failed = project.run()
    assert "undo-a" in failed.error or "delete failed" in failed.error
    records = [r for r in project.state()["resources"] if r["urn"].endswith("::a")]
    assert sorted(r["delete"] for r in records) == [False, True], "new one and pending old one"
    project.node.fail.clear()
    project.run()
    assert project.node.calls == ["run echo undo-a"]
    assert [r["delete"] for r in project.state()["resources"] if r["urn"].endswith("::a")] == [
        False
    ]


def test_a_container_that_fails_to_start_is_recorded_and_the_next_up_updates_it(
    project: Project,
) -> None:
    project.config(cmd="crash")
    failed = project.run()
    assert "web: create failed" in failed.error and "exec format error" in failed.error
    web = next(r for r in project.state()["resources"] if r["urn"].endswith("::web"))
    assert web["id"] == "c1" and web["initErrors"], "the created container is not orphaned"
    again = project.run()  # initErrors: an update, which starts the container again
    assert "web: update failed" in again.error
    project.config(cmd="serve")
    fixed = project.run()
    assert ops(fixed)["web"] == "replace"  # (steps the failures halted are created too)
    calls = project.node.calls
    assert calls.index("docker rm c1") < calls.index("docker run web sha256:aaa")


def test_a_daemon_that_does_not_answer_is_an_error_not_a_gone_container(project: Project) -> None:
    project.run()
    project.node.daemon_down = True
    result = project.run("preview", refresh=True)
    assert "Cannot connect to the Docker daemon" in result.error
    project.node.daemon_down = False
    assert ops(project.run(refresh=True)) == {}, "the container was kept in the state"


# --- Pulumi.yaml's config block (pkg/workspace/config.go mergeConfig, project.go Validate)


PROJECT_DECL: dict[str, Any] = {
    "name": "spark-vllm",
    "config": {
        "head": {"type": "string"},
        "nodes": {"type": "array", "items": {"type": "object"}},
        "drop_page_cache": {"type": "boolean", "default": False},
        "ports": {"type": "object", "default": {}},
        "pulumi:tags": {"value": {"a": "b"}},
    },
}


@pytest.mark.parametrize(
    ("config", "project_change", "error"),
    [
        ({"head": "a", "nodes": [{}]}, {}, None),
        ({"nodes": [{}]}, {}, "Stack 's' is missing configuration value 'head'"),
        ({}, {}, "Stack 's' is missing configuration values 'head' and 'nodes'"),
        ({"head": "a", "nodes": {"x": 1}}, {}, "key 'nodes' must be of type 'array<object>'"),
        ({"head": "a", "nodes": ["x"]}, {}, "key 'nodes' must be of type 'array<object>'"),
        ({"head": "a", "nodes": [{}], "drop_page_cache": "yes"}, {}, "must be of type 'boolean'"),
        ({"head": "a", "nodes": [{}], "drop_page_cache": True}, {}, None),
        ({"head": 7, "nodes": [{}]}, {}, None),  # a stack scalar is its text: "7" is a string
        ({"head": "a", "nodes": [{}]}, {"ports": {"type": "object", "default": 1}},
         "default value specified for configuration key 'ports' is not of the expected type"),
        ({"head": "a", "nodes": [{}]}, {"x": {"type": "array"}}, "does not specify the underlying"),
        ({"head": "a", "nodes": [{}]}, {"aws:region": {"type": "string"}},
         "is not namespaced by the project and should not define a type"),
        ({"head": "a", "nodes": [{}]}, {"k": {"default": 1, "value": 2}},
         "cannot have both a 'default' and 'value' attribute"),
        ({"head": "a", "nodes": [{}]}, {"k": {"type": "string", "secret": True, "default": "x"}},
         "key 'k' must be encrypted as it's secret"),
    ],
)  # fmt: skip
def test_project_config_block_rules(
    config: dict[str, Any], project_change: dict[str, Any], error: str | None
) -> None:
    from localengine.program import StackConfigError, apply_project_config

    project = copy.deepcopy(PROJECT_DECL)
    project["config"].update(project_change)
    if error is None:
        merged = apply_project_config(project, "s", config, set())
        assert merged["spark-vllm:drop_page_cache"] == config.get("drop_page_cache", False)
        assert merged["spark-vllm:ports"] == {} and merged["pulumi:tags"] == {"a": "b"}
        return
    with pytest.raises(StackConfigError, match=re.escape(error)):
        apply_project_config(project, "s", config, set())


def test_cli_output_prints_the_stack_outputs_from_the_state(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    """`output` reads the root stack's outputs (pulumi stack output): secrets as [secret]
    unless --show-secrets; no state is an error naming the fix."""
    assert cli.main(["output", "--stack", "test", "--cwd", str(project.dir)]) == 1
    assert "run `up` first" in capsys.readouterr().err
    project.run()
    assert cli.main(["output", "--stack", "test", "--json", "--cwd", str(project.dir)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown and shown == cli.stack_outputs(project.dir, "test", show_secrets=False)
    root = next(r for r in project.state()["resources"] if r["type"] == "pulumi:pulumi:Stack")
    assert set(shown) == set(root["outputs"])


# --- the program and its dynamic providers run as the Pulumi CLI runs them -------------------

WHERE_PROGRAM = textwrap.dedent(
    """
    import os
    import sys

    import pulumi
    from pulumi.dynamic import CreateResult, Resource, ResourceProvider

    FIELDS = ("pid", "parent", "cwd", "module", "project", "venv")


    class Where(ResourceProvider):
        def create(self, props):
            with open(f"/proc/{os.getppid()}/cmdline") as f:
                parent = f.read().replace("\\0", " ")
            return CreateResult("where-1", {
                "pid": os.getpid(), "parent": parent, "cwd": os.getcwd(),
                "module": sys.argv[0], "project": os.environ.get("PULUMI_PROJECT", ""),
                "venv": os.environ.get("PULUMI_RUNTIME_VIRTUALENV", "")})


    class WhereRes(Resource):
        def __init__(self, name):
            super().__init__(Where(), name, dict.fromkeys(FIELDS))


    w = WhereRes("where")
    pulumi.export("program", {"pid": os.getpid(), "cwd": os.getcwd(), "path0": sys.path[0]})
    pulumi.export("provider", {k: getattr(w, k) for k in FIELDS})
    """
)


def test_the_program_and_its_providers_run_in_processes_of_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The program in the language host's process (the program's folder its cwd and first
    sys.path entry); a dynamic provider in the SDK's provider host, started by the CLI's
    own script in the program's folder with PULUMI_PROJECT and the runtime options."""
    import os
    import sys

    monkeypatch.delenv("LOCALENGINE_BACKEND_URL", raising=False)
    (tmp_path / "Pulumi.yaml").write_text(project_yaml("where"))
    (tmp_path / "__main__.py").write_text(WHERE_PROGRAM)
    (tmp_path / "Pulumi.test.yaml").write_text("config: {}\n")
    result = run("up", "test", tmp_path, log=lambda _m: None)
    assert not result.error, result.error
    program, provider = result.outputs["program"], result.outputs["provider"]
    assert program["pid"] != os.getpid() and program["cwd"] == str(tmp_path)
    assert program["path0"] == "."  # runpy.run_path("."): the program's folder
    assert provider["pid"] not in (os.getpid(), program["pid"])
    assert provider["cwd"] == str(tmp_path)
    assert provider["module"].endswith("pulumi/dynamic/__main__.py")
    assert "vendor/pulumi-resource-pulumi-python 127.0.0.1:" in provider["parent"]
    assert provider["project"] == "where" and provider["venv"] == sys.prefix
    # The hosts are stopped with the run.
    assert not os.path.exists(f"/proc/{provider['pid']}")


def test_a_provider_the_host_cannot_import_fails_in_one_line_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provider class the program found through a sys.path edit is pickled by reference;
    the provider host (the program's folder and the virtualenv on its sys.path) cannot
    import it: the step fails at Check, before anything is created, saying what to do."""
    monkeypatch.delenv("LOCALENGINE_BACKEND_URL", raising=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "far_away.py").write_text(
        "from pulumi.dynamic import CreateResult, ResourceProvider\n"
        "class Hello(ResourceProvider):\n"
        "    def create(self, props):\n"
        "        return CreateResult('hello-1', {})\n"
    )
    project_dir = write_project(tmp_path / "project", "far", (
        "import sys\n"
        f"sys.path.insert(0, {str(elsewhere)!r})\n"
        "from pulumi.dynamic import Resource\n"
        "from far_away import Hello\n"
        "class Greeting(Resource):\n"
        "    pass\n"
        "Greeting(Hello(), 'hello', {})\n"
    ))  # fmt: skip
    result = run("up", "test", project_dir, log=lambda _m: None)
    assert "cannot be loaded in the provider host" in result.error
    assert "No module named 'far_away'" in result.error and "pip install" in result.error
    assert "\n" not in result.error.split("; fix:")[0]
    assert result.provider_writes == 0


# --- the state: apart from the CLI's, and a way across (localengine/export.py) ---------------

# pulumi/pulumi v3.259.0 pkg/secrets/passphrase/manager_test.go: this state opens with the
# passphrase "password" (TestPassphraseManagerCorrectPassphraseReturnsSecretsManager).
PULUMI_TEST_STATE = "v1:fozI5u6B030=:v1:F+6ZduKKd8G0/V7L:PGMFeIzwobWRKmEAzUdaQHqC5mMRIQ=="
RESOURCE_V3_FIELDS = {
    "urn", "custom", "delete", "id", "type", "inputs", "outputs", "parent", "dependencies",
    "initErrors", "provider", "propertyDependencies", "additionalSecretOutputs", "aliases",
    "customTimeouts", "ignoreChanges", "replaceOnChanges",
}  # fmt: skip


def test_the_passphrase_crypter_opens_pulumis_own_test_vector() -> None:
    from localengine.export import ExportError, PassphraseCrypter

    crypter = PassphraseCrypter.from_state("password", PULUMI_TEST_STATE)
    assert crypter.decrypt(crypter.encrypt('"a secret"')) == '"a secret"'
    assert PassphraseCrypter.from_state("password", crypter.state()).salt == crypter.salt
    with pytest.raises(ExportError, match="incorrect passphrase"):
        PassphraseCrypter.from_state("not it", PULUMI_TEST_STATE)
    with pytest.raises(ExportError, match="malformed state value"):
        PassphraseCrypter.from_state("password", "fozI5u6B030=")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("3600s", 3600.0), ("20m", 1200.0), ("1h30m", 5400.0), ("1.5h", 5400.0), ("250ms", 0.25)],
)
def test_custom_timeouts_are_go_durations_in_seconds(text: str, seconds: float) -> None:
    from localengine.export import duration_seconds

    assert duration_seconds(text) == pytest.approx(seconds)


def test_a_remote_command_is_bounded_by_its_custom_timeouts_else_by_the_engines_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step's customTimeouts reach the provider call (step.go: the request's timeout);
    the command model ends the ssh call there, else at DEFAULT_TIMEOUT_S."""
    import subprocess

    from localengine.providers import command as command_model

    monkeypatch.delenv("LOCALENGINE_BACKEND_URL", raising=False)
    write_project(tmp_path, "bounded", textwrap.dedent(
        """
        import pulumi
        import pulumi_command as command

        conn = command.remote.ConnectionArgs(host="127.0.0.1", private_key="k")
        command.remote.Command("quick", connection=conn, create="true",
                               opts=pulumi.ResourceOptions(
                                   custom_timeouts=pulumi.CustomTimeouts(create="90s")))
        command.remote.Command("hangs", connection=conn, create="sleep 1d",
                               opts=pulumi.ResourceOptions(
                                   custom_timeouts=pulumi.CustomTimeouts(create="2m30s")))
        command.remote.Command("plain", connection=conn, create="echo plain")
        """
    ))  # fmt: skip
    import threading

    bounds: dict[str, float] = {}
    others_called = threading.Event()

    def transport(target: Any, cmd: str, **kw: Any) -> Any:
        bounds[cmd.rsplit(" ", 1)[-1] if "sleep" not in cmd else "hangs"] = kw["timeout"]
        if "sleep" in cmd:
            # The three run at once: the hung one fails once the others were called (a
            # failed step stops new ones from starting, so its failure must not race them).
            others_called.wait(timeout=60)
            raise subprocess.TimeoutExpired(cmd, kw["timeout"])
        if {"true", "plain"} <= set(bounds):
            others_called.set()
        return subprocess.CompletedProcess([], 0, "out\n", "")

    def factory(pkg: str, _inputs: dict[str, Any]) -> Provider | None:
        return command_model.CommandProvider(transport) if pkg == "command" else None

    result = run("up", "test", tmp_path, provider_factory=factory, log=lambda _m: None)
    assert bounds == {"true": 90.0, "hangs": 150.0, "plain": command_model.DEFAULT_TIMEOUT_S}
    assert "hangs: create failed: hangs: no answer from 127.0.0.1 within 150s (its " in result.error
    assert "the command may still be running on the node" in result.error


def test_export_writes_what_pulumi_stack_import_reads(
    project: Project, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A version-3 deployment whose secrets are sealed as the CLI's passphrase manager
    seals them (the private key of the program's connection nowhere in plain text)."""
    from localengine.export import PassphraseCrypter

    assert not project.run().error
    state = project.state()
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "correct horse")
    out = tmp_path / "export.json"
    where = ["--stack", "test", "--cwd", str(project.dir)]
    assert cli.main(["export", *where, "--file", str(out)]) == 0
    assert out.stat().st_mode & 0o777 == 0o600
    text = out.read_text()
    assert "TEST-KEY-9f1" not in text
    data = json.loads(text)
    assert data["version"] == 3
    deployment = data["deployment"]
    assert deployment["secrets_providers"]["type"] == "passphrase"
    crypter = PassphraseCrypter.from_state(
        "correct horse", deployment["secrets_providers"]["state"]["salt"]
    )
    resources = deployment["resources"]
    assert [r["urn"] for r in resources] == [r["urn"] for r in state["resources"]]
    assert all(set(r) <= RESOURCE_V3_FIELDS for r in resources)
    opened: list[Any] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict) and value.get("4dabf18193072939515e22adb298388d"):
            assert set(value) == {"4dabf18193072939515e22adb298388d", "ciphertext"}
            opened.append(json.loads(crypter.decrypt(value["ciphertext"])))
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(resources)
    assert "TEST-KEY-9f1" in json.dumps(opened)
    timeouts = [r["customTimeouts"] for r in resources if "customTimeouts" in r]
    assert all(isinstance(v, float) for t in timeouts for v in t.values())
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE")
    assert cli.main(["export", *where]) == 1


def test_a_state_at_the_earlier_place_moves_apart_from_the_clis(project: Project) -> None:
    """The local engine kept its states under `.pulumi/` (where the CLI's file backend
    reads); a state it wrote there moves to `.localengine/` on the next run, key and all,
    and the run sees the stack as it was. A state of the CLI's own there is left alone."""
    assert not project.run().error
    new = project.dir / ".localengine" / "stacks" / "spark-vllm"
    old = project.dir / ".pulumi" / "stacks" / "spark-vllm"
    old.mkdir(parents=True)
    for name in ("test.json", "test.key"):
        (new / name).rename(old / name)
    (old / "cli.json").write_text(json.dumps(
        {"checkpoint": {"latest": {"manifest": {"version": "v3.272.0"}}}}))  # fmt: skip
    said: list[str] = []
    again = run("up", "test", project.dir, provider_factory=project.factory, log=said.append)
    assert not again.error, again.error
    assert ops(again) == {}, "the same stack: nothing to do"
    assert any("moved the local engine's state of test" in line for line in said)
    assert (new / "test.json").exists() and not (old / "test.json").exists()
    assert (new / "test.key").exists()
    assert (old / "cli.json").exists()


@pytest.mark.parametrize(
    ("tamper", "said"),
    [
        (
            lambda s: s["checkpoint"].update(stack="organization/webapp/prod"),
            "the state of 'organization/webapp/prod', not of 'organization/spark-vllm/test'",
        ),
        (
            lambda s: s["checkpoint"]["latest"]["resources"][1].update(
                urn="urn:pulumi:prod::webapp::command:remote:Command::a"
            ),
            "which is not a resource of stack 'test' of project 'spark-vllm'",
        ),
        (
            lambda s: s.update(deployment=s.pop("checkpoint")["latest"], version=3),
            "this is a `pulumi stack export` file, not a local-engine state",
        ),
        (
            lambda s: s["checkpoint"]["latest"]["manifest"].update(version="v3.272.0"),
            "written by v3.272.0, not by the local engine",
        ),
    ],
    ids=["another stack", "another project's resource", "export form", "the CLI's"],
)
def test_a_state_that_is_not_this_stacks_is_refused_before_anything_runs(
    project: Project, tamper: Any, said: str
) -> None:
    assert not project.run().error
    path = project.dir / ".localengine" / "stacks" / "spark-vllm" / "test.json"
    state = json.loads(path.read_text())
    tamper(state)
    path.write_text(json.dumps(state))
    for operation in ("up", "destroy", "preview"):
        result = project.run(operation)
        assert said in result.error and "\n" not in result.error, result.error
        assert "Fix:" in result.error
        assert result.provider_writes == 0 and project.node.calls == []
    assert json.loads(path.read_text()) == state  # left as it was


def test_an_unreadable_state_or_a_wrong_passphrase_is_one_line(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "first")
    assert not project.run().error
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "second")
    wrong = project.run("preview")
    assert "its secrets do not open with this key" in wrong.error and "\n" not in wrong.error
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE")
    none = project.run("preview")
    assert "its secrets are sealed with a passphrase" in none.error
    path = project.dir / ".localengine" / "stacks" / "spark-vllm" / "test.json"
    path.write_text(path.read_text()[:100])
    cut = project.run("up")
    assert "cannot be read as a state" in cut.error and "\n" not in cut.error
    assert project.node.calls == []


def test_a_missing_key_file_is_an_error_never_made_again(project: Project) -> None:
    assert not project.run().error
    key = project.dir / ".localengine" / "stacks" / "spark-vllm" / "test.key"
    key.unlink()
    refused = project.run("up")
    assert f"its key file {key} is missing" in refused.error, refused.error
    assert not key.exists() and project.node.calls == []


def test_a_second_run_on_a_locked_stack_is_refused_and_a_killed_runs_lock_goes_with_it(
    project: Project,
) -> None:
    """pulumi's diy backend: Update, Refresh and Destroy lock the stack ("the stack is
    currently locked"), Preview does not. The lock is an flock: a run killed with -9
    leaves none behind."""
    import signal
    import subprocess
    import sys

    from localengine.state import StateFile

    assert not project.run().error
    with StateFile(project.dir, "test").locked("up"):
        for operation in ("up", "refresh", "destroy"):
            refused = project.run(operation)
            assert "stack 'test' is currently locked by pid" in refused.error, refused.error
            assert "(up since" in refused.error and "\n" not in refused.error
            assert project.node.calls == [] and refused.provider_writes == 0
        assert not project.run("preview").error  # a preview takes no lock
    hold = (
        "import time\nfrom pathlib import Path\nfrom localengine.state import StateFile\n"
        f"with StateFile(Path({str(project.dir)!r}), 'test').locked('up'):\n"
        "    print('held', flush=True); time.sleep(600)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", hold], cwd=Path(__file__).resolve().parent.parent,
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    assert "currently locked" in project.run("up").error
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert not project.run("up").error


# --- ^C and SIGTERM from a terminal (pkg/backend/cancellation_scope.go) ---------------------

SLOW_PROGRAM = textwrap.dedent(
    """
    import os
    import time
    from pathlib import Path

    import pulumi
    from pulumi.dynamic import CreateResult, Resource, ResourceProvider


    class Slow(ResourceProvider):
        def create(self, props):
            Path(props["name"] + ".started").write_text(str(os.getpid()))
            time.sleep(float(props["seconds"]))
            return CreateResult(props["name"], dict(props))


    class SlowRes(Resource):
        def __init__(self, name, seconds, opts=None):
            super().__init__(Slow(), name, {"name": name, "seconds": seconds}, opts)


    a = SlowRes("a", float(pulumi.Config().get("seconds") or 4))
    SlowRes("b", 0, pulumi.ResourceOptions(depends_on=[a]))
    """
)


def _engine_in_a_terminal(tmp_path: Path, seconds: float) -> Any:
    """`python -m localengine up` as a terminal runs it: the leader of its own process
    group (the terminal's foreground group gets the ^C)."""
    import subprocess
    import sys

    (tmp_path / "Pulumi.yaml").write_text(project_yaml("slow"))
    (tmp_path / "Pulumi.test.yaml").write_text(f"config:\n  slow:seconds: '{seconds}'\n")
    (tmp_path / "__main__.py").write_text(SLOW_PROGRAM)
    env = {k: v for k, v in os.environ.items() if "BACKEND_URL" not in k}
    proc = subprocess.Popen(
        [sys.executable, "-m", "localengine", "up", "--stack", "test", "--cwd", str(tmp_path)],
        cwd=Path(__file__).resolve().parent.parent, env=env, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    started = tmp_path / "a.started"
    deadline = time.monotonic() + 120
    while not started.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.1)
    return proc


def test_a_first_ctrl_c_lets_the_step_in_flight_finish_and_records_it(tmp_path: Path) -> None:
    import os
    import signal

    proc = _engine_in_a_terminal(tmp_path, seconds=4)
    os.killpg(proc.pid, signal.SIGINT)  # the terminal's ^C, to the whole foreground group
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 8, out
    assert "^C received; cancelling" in out and "press ^C again" in out
    state = json.loads((tmp_path / ".localengine/stacks/slow/test.json").read_text())
    names = {r["urn"].rsplit("::", 1)[-1] for r in state["checkpoint"]["latest"]["resources"]}
    assert "a" in names, "the step in flight finished and was recorded"
    assert "b" not in names and not (tmp_path / "b.started").exists(), "nothing new started"


def test_a_second_ctrl_c_terminates_and_stops_the_provider_host(tmp_path: Path) -> None:
    import os
    import signal

    proc = _engine_in_a_terminal(tmp_path, seconds=300)
    host = int((tmp_path / "a.started").read_text())
    os.killpg(proc.pid, signal.SIGTERM)
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 8, out
    assert "SIGTERM received; cancelling" in out and "SIGTERM received; terminating" in out
    assert "terminated: steps in flight were not waited for" in out
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{host}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{host}"), "the provider host was stopped"
    # The create cut short stays pending (its call failed as the host stopped, and that
    # failure must not clear it): the next run asks whether `a` exists.
    state = json.loads((tmp_path / ".localengine/stacks/slow/test.json").read_text())
    pending = state["checkpoint"]["latest"].get("pending_operations") or []
    assert [(op["type"], op["resource"]["urn"].rsplit("::", 1)[-1]) for op in pending] == [
        ("creating", "a")
    ]


READS_PROGRAM = textwrap.dedent(
    """
    import time
    from pathlib import Path

    import pulumi
    from pulumi.dynamic import CreateResult, ReadResult, Resource, ResourceProvider


    class Counted(ResourceProvider):
        def create(self, props):
            return CreateResult(props["name"], dict(props))

        def read(self, id_, props):
            with open("reads.log", "a") as f:
                f.write(f"+ {time.monotonic()}\\n")
            time.sleep(0.5)
            with open("reads.log", "a") as f:
                f.write(f"- {time.monotonic()}\\n")
            return ReadResult(id_, props)


    class CountedRes(Resource):
        def __init__(self, name):
            super().__init__(Counted(), name, {"name": name})


    for i in range(8):
        CountedRes(f"r{i}")
    """
)


def _most_at_once(log: Path) -> int:
    events = sorted(
        (float(t), 1 if sign == "+" else -1)
        for sign, t in (line.split() for line in log.read_text().splitlines())
    )
    now = most = 0
    for _t, step in events:
        now += step
        most = max(most, now)
    return most


@pytest.mark.parametrize(("parallel", "most"), [(16, 4), (2, 2), (1, 1)])
def test_a_refresh_reads_in_parallel_as_far_as_the_host_and_parallel_allow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parallel: int, most: int
) -> None:
    """The engine refreshes every resource at once up to --parallel; the SDK's provider
    host serves at most 4 calls at a time (its ThreadPoolExecutor(max_workers=4))."""
    monkeypatch.delenv("LOCALENGINE_BACKEND_URL", raising=False)
    (tmp_path / "Pulumi.yaml").write_text(project_yaml("reads"))
    (tmp_path / "Pulumi.test.yaml").write_text("config: {}\n")
    (tmp_path / "__main__.py").write_text(READS_PROGRAM)
    assert not run("up", "test", tmp_path, log=lambda _m: None).error
    refreshed = run("refresh", "test", tmp_path, parallel=parallel, log=lambda _m: None)
    assert not refreshed.error and len(refreshed.refresh_steps) == 8
    assert _most_at_once(tmp_path / "reads.log") == most


def test_an_internal_error_is_one_line_and_its_traceback_on_demand(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*_a: Any, **_kw: Any) -> Any:
        raise ValueError("a bug of the engine")

    monkeypatch.setattr(cli, "run", broken)
    assert cli.main(["up", "--stack", "sim"]) == 255
    said = capsys.readouterr().err
    assert said == (
        "error: internal: ValueError: a bug of the engine (run with --debug for the traceback)\n"
    )
    with pytest.raises(ValueError, match="a bug of the engine"):
        cli.main(["up", "--stack", "sim", "--debug"])


@pytest.mark.parametrize(
    ("runtime", "expected"),
    [
        ("python", {}),  # the short form: a name, no options
        (
            {"name": "python", "options": {"toolchain": "pip", "virtualenv": ".venv"}},
            {"PULUMI_RUNTIME_TOOLCHAIN": "pip", "PULUMI_RUNTIME_VIRTUALENV": ".venv"},
        ),
    ],
    ids=["short", "with options"],
)
def test_a_provider_hosts_environment_from_either_form_of_runtime(
    runtime: Any, expected: dict[str, str]
) -> None:
    """provider_plugin.go NewProvider: each runtime option as PULUMI_RUNTIME_<NAME>, and
    PULUMI_PROJECT. (The short form, `runtime: python`, raised AttributeError before.)"""
    from localengine.providers.dynamic import PluginContext

    env = PluginContext(Path("/nonexistent"), {"name": "p", "runtime": runtime}, "a").environment()
    ours = {k: v for k, v in env.items() if k.startswith("PULUMI_RUNTIME_")}
    assert ours == expected and env["PULUMI_PROJECT"] == "p"
