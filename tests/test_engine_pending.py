"""What a killed run leaves and how it is settled: pending operations (pulumi
pkg/backend/snapshot.go), `refresh --import-pending-creates / --clear-pending-creates`
(pkg/cmd/pulumi/operations/refresh.go), `state delete` (pkg/resource/edit) and `import`
(pkg/cmd/pulumi/stack/io.go SaveSnapshot). The kills themselves: tests/test_engine_faults.py."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest

from localengine import __main__ as cli
from localengine.operations import Result
from tests.test_localengine import FakeCommand, Project, make_project

A = "urn:pulumi:test::spark-vllm::command:remote:Command::a"
B = "urn:pulumi:test::spark-vllm::command:remote:Command::b"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Project:
    return make_project(tmp_path, monkeypatch)


def _state_path(project: Project) -> Path:
    return project.dir / ".localengine" / "stacks" / "spark-vllm" / "test.json"


class Peeking(FakeCommand):
    """Reads the state file at the moment each command runs on the node."""

    def __init__(self, project: Project, seen: dict[str, list[tuple[str, str]]]):
        super().__init__(project.node)
        self.project, self.seen = project, seen

    def _run(self, name: str, inputs: dict[str, Any], command: str, previous: Any) -> Any:
        latest = self.project.state()
        self.seen[command] = [
            (op["type"], op["resource"]["urn"]) for op in latest.get("pending_operations", [])
        ]
        return super()._run(name, inputs, command, previous)


def _killed_during(project: Project, command: str, operation: str = "up") -> None:
    """The state file as it stood while `command` ran: what a kill -9 at that moment leaves."""
    copies: dict[str, str] = {}

    class Copying(FakeCommand):
        def _run(self, name: str, inputs: dict[str, Any], cmd: str, previous: Any) -> Any:
            if cmd == command:
                copies["state"] = _state_path(project).read_text()
            return super()._run(name, inputs, cmd, previous)

    original = project.factory
    project.factory = lambda pkg, inputs: (  # type: ignore[method-assign]
        Copying(project.node) if pkg == "command" else original(pkg, inputs)
    )
    try:
        assert not project.run(operation).error
    finally:
        project.factory = original  # type: ignore[method-assign]
    _state_path(project).write_text(copies["state"])


def test_each_step_is_pending_while_its_call_runs_and_cleared_with_its_result(
    project: Project,
) -> None:
    seen: dict[str, list[tuple[str, str]]] = {}
    original = project.factory
    project.factory = lambda pkg, inputs: (  # type: ignore[method-assign]
        Peeking(project, seen) if pkg == "command" else original(pkg, inputs)
    )
    assert not project.run().error
    # Steps run side by side: each sees its own pending operation among the others'.
    assert ("creating", A) in seen["echo a"]
    assert ("creating", B) in seen["echo b-a"] and ("creating", A) not in seen["echo b-a"]
    project.config(a="echo a2")
    assert not project.run().error
    assert ("updating", A) in seen["echo a2"]
    assert not project.run("destroy").error
    assert ("deleting", B) in seen["echo undo-b"]
    assert "pending_operations" not in project.state()


def test_a_pending_create_stops_up_and_destroy_until_the_user_says_whether_it_exists(
    project: Project,
) -> None:
    assert not project.run().error
    project.config(drop_b=True)
    assert not project.run().error  # b deleted
    project.config()
    _killed_during(project, "echo b-a")  # b's create ran; its result was never recorded
    calls_before = list(project.node.calls)
    for operation in ("up", "destroy"):
        refused = project.run(operation)
        assert refused.error.startswith("nothing was done: 1 resource(s) were being created")
        assert B in refused.error and "--import-pending-creates URN ID" in refused.error
        assert "\n" not in refused.error and project.node.calls == []
    assert calls_before  # the node had been reached before the kill
    assert not project.run("preview").error  # a preview runs (the CLI's too)
    kept = project.run("refresh")
    assert not kept.error
    assert [op["type"] for op in project.state()["pending_operations"]] == ["creating"]
    # The user looked: b exists on the node, with this ID.
    settled = project.run("refresh", import_pending_creates={B: "b-on-node"})
    assert not settled.error
    assert "pending_operations" not in project.state()
    b = next(r for r in project.state()["resources"] if r["urn"] == B)
    assert b["id"] == "b-on-node"
    again = project.run()
    assert not again.error and {s.name: s.op for s in again.steps}["b"] == "same"
    assert not [c for c in project.node.calls if c.startswith("run echo b")], "not created twice"


def test_a_cleared_pending_create_is_created_by_the_next_up(project: Project) -> None:
    _killed_during(project, "echo b-a")
    unmatched = "urn:pulumi:test::spark-vllm::command:remote:Command::zz"
    messages: list[str] = []
    from localengine.operations import run

    result = run(
        "refresh", "test", project.dir, provider_factory=project.factory, log=messages.append,
        import_pending_creates={unmatched: "x"}, clear_pending_creates=True,
    )  # fmt: skip
    assert not result.error
    assert f"warning: {unmatched} did not correspond to a pending create" in messages
    assert "pending_operations" not in project.state()
    assert not any(r["urn"] == B for r in project.state()["resources"])
    up = project.run()
    assert {s.name: s.op for s in up.steps}["b"] == "create"


def test_a_pending_delete_or_update_is_a_warning_and_refresh_clears_it(project: Project) -> None:
    assert not project.run().error
    project.config(drop_b=True)
    _killed_during(project, "echo undo-b")
    assert [op["type"] for op in project.state()["pending_operations"]] == ["deleting"]
    messages: list[str] = []
    from localengine.operations import run

    again = run("up", "test", project.dir, provider_factory=project.factory, log=messages.append)
    assert not again.error
    warning = next(m for m in messages if m.startswith("warning: 1 pending operation"))
    assert f"{B}, interrupted while deleting" in warning
    assert {s.name: s.op for s in again.steps}["b"] == "delete"  # tried again
    assert "pending_operations" not in project.state()
    project.config(a="echo a3")
    _killed_during(project, "echo a3")
    assert [op["type"] for op in project.state()["pending_operations"]] == ["updating"]
    assert not project.run("refresh").error
    assert "pending_operations" not in project.state()


def _main(project: Project, *words: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli.main([*words, "--stack", "test", "--cwd", str(project.dir)])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_state_delete_forgets_a_resource_and_refuses_while_others_depend_on_it(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    assert not project.run().error
    project.node.calls.clear()
    code, said = _main(project, "state", "delete", A, capsys=capsys)
    assert code == 1 and "can't be safely deleted because these resources depend on it" in said
    assert "b (" in said and "--target-dependents" in said and said.count("\n") == 1
    code, said = _main(project, "state", "delete", A + "x", capsys=capsys)
    assert code == 1 and "no resource" in said
    code, said = _main(project, "state", "delete", B, capsys=capsys)
    assert code == 0 and "Resource deleted" in said
    urns = [r["urn"] for r in project.state()["resources"]]
    assert B not in urns and A in urns
    code, said = _main(project, "state", "delete", A, "--target-dependents", capsys=capsys)
    assert code == 0, said
    left = {r["urn"].rsplit("::", 1)[-1] for r in project.state()["resources"]}
    assert "a" not in left and "web" not in left, "web depends on a: deleted with it"
    assert project.node.calls == [], "nothing on the node was touched"


def test_import_takes_an_export_back_and_refuses_another_stacks(
    project: Project, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:  # fmt: skip
    assert not project.run().error
    before = project.state()["resources"]
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "correct horse")
    exported = tmp_path / "out.json"
    code, said = _main(project, "export", "--file", str(exported), capsys=capsys)
    assert code == 0, said
    shutil.rmtree(project.dir / ".localengine")
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE")
    code, said = _main(project, "import", "--file", str(exported), capsys=capsys)
    assert code == 1 and "set PULUMI_CONFIG_PASSPHRASE" in said, said  # sealed secrets
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "correct horse")
    data = json.loads(exported.read_text())
    data["deployment"]["pending_operations"] = [{"resource": data["deployment"]["resources"][-1],
                                                 "type": "creating"}]  # fmt: skip
    exported.write_text(json.dumps(data))
    code, said = _main(project, "import", "--file", str(exported), capsys=capsys)
    assert code == 0, said
    assert "warning: removing pending operation 'creating'" in said
    # A new state takes the passphrase that is set (an existing one keeps its own way).
    after = project.state()["resources"]
    assert [r["urn"] for r in after] == [r["urn"] for r in before]
    assert [r["id"] for r in after] == [r["id"] for r in before]
    again: Result = project.run()
    assert not again.error and all(s.op == "same" for s in again.steps), again.steps
    other = json.loads(exported.read_text().replace("urn:pulumi:test::", "urn:pulumi:prod::"))
    exported.write_text(json.dumps(other))
    code, said = _main(project, "import", "--file", str(exported), capsys=capsys)
    assert code == 1 and "is not of stack 'test'" in said and "nothing was imported" in said


def test_only_a_step_that_runs_is_pending(project: Project) -> None:
    """With one worker, the steps waiting for it are not pending (the CLI marks a step
    pending when the step executor runs it)."""
    from localengine.operations import run

    seen: dict[str, list[tuple[str, str]]] = {}
    original = project.factory

    def peeking(pkg: str, inputs: dict[str, Any]) -> Any:
        return Peeking(project, seen) if pkg == "command" else original(pkg, inputs)

    assert not run("up", "test", project.dir, provider_factory=peeking, log=lambda _m: None,
                   parallel=1).error  # fmt: skip
    assert all(len(ops) == 1 for ops in seen.values()), seen


class PartialOnce(FakeCommand):
    """The create of `a`'s new copy fails after the object came to exist."""

    def _run(self, name: str, inputs: dict[str, Any], command: str, previous: Any) -> Any:
        if command == "echo a2":
            from localengine.providers.base import PartialCreate

            raise PartialCreate("a: half made", "a-new", {**inputs, "stdout": "a2"})
        return super()._run(name, inputs, command, previous)


def test_a_replaced_resource_is_condemned_in_the_same_write_as_its_new_copy(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CreateStep.Apply: once the create returned, a partial failure too, the old copy is
    condemned; and no write of the state ever lacks the old object until its delete."""
    from localengine.state import StateFile

    assert not project.run().error
    old_id = next(r["id"] for r in project.state()["resources"] if r["urn"] == A)
    writes: list[list[tuple[str, str, bool]]] = []
    save = StateFile.save

    def spying(self: StateFile, resources: Any, pending: Any = None) -> None:
        writes.append([(r.urn, r.id, r.delete) for r in resources])
        save(self, resources, pending)

    monkeypatch.setattr(StateFile, "save", spying)
    original = project.factory
    project.factory = lambda pkg, inputs: (  # type: ignore[method-assign]
        PartialOnce(project.node) if pkg == "command" else original(pkg, inputs)
    )
    project.config(a="echo a2", trigger="2")
    failed = project.run()
    assert "a: create failed: a: half made" in failed.error
    records = [(r["urn"], r["id"], r.get("delete", False)) for r in project.state()["resources"]]
    assert (A, "a-new", False) in records and (A, old_id, True) in records
    assert all(any(u == A and i == old_id for u, i, _d in w) for w in writes), "never lost"
    project.factory = original  # type: ignore[method-assign]
    healed = project.run()
    assert not healed.error
    assert "run echo undo-a" in project.node.calls, "the old copy is deleted"
    condemned = [r["urn"] for r in project.state()["resources"] if r.get("delete")]
    assert condemned == []


def test_an_imported_pending_create_condemns_the_live_record_it_replaces(project: Project) -> None:
    assert not project.run().error
    old_id = next(r["id"] for r in project.state()["resources"] if r["urn"] == A)
    project.config(a="echo a2", trigger="2")  # a replacement, create first
    _killed_during(project, "echo a2")
    assert not project.run("refresh", import_pending_creates={A: "a-new"}).error
    records = [(r["urn"], r["id"], r.get("delete", False)) for r in project.state()["resources"]]
    assert (A, "a-new", False) in records and (A, old_id, True) in records
    assert not project.run().error
    assert "run echo undo-a" in project.node.calls


def test_a_custom_timeout_that_is_not_a_duration_is_refused_at_registration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from localengine.operations import run
    from tests.conftest import write_project

    monkeypatch.delenv("LOCALENGINE_BACKEND_URL", raising=False)
    write_project(tmp_path, "timeouts", textwrap.dedent(
        """
        import pulumi
        import pulumi_command as command

        timeouts = pulumi.CustomTimeouts(create="ten minutes")
        command.remote.Command("c", connection=command.remote.ConnectionArgs(host="h"),
                               create="true", opts=pulumi.ResourceOptions(custom_timeouts=timeouts))
        """
    ))  # fmt: skip
    result = run("up", "test", tmp_path, log=lambda _m: None)
    assert "c: customTimeouts.create: invalid duration 'ten minutes'" in result.error
