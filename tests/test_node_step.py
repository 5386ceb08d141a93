"""NodeStep's lifecycle decisions (components/node_step.py), as data: what a diff does
with each kind of change, and how a step's state value is read from its output."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from components.node_step import NodeStepProvider, state_value

BASE: dict[str, Any] = {
    "step": "image-sync-spark-2", "create": "stream", "stdin": None, "stdin_identity": True,
    "read": "echo fingerprint=$(fp)", "read_stdin": None, "state_key": "fingerprint",
    "triggers": ["ref:1", "gen-a"], "identity_file": "~/.cache/spark-vllm/sim/id",
    "host": "10.0.0.1", "port": 22, "user": "root", "host_key": "ssh-ed25519 AAAA1",
    "read_host": "10.0.0.2", "read_port": 22, "read_user": "root",
    "read_host_key": "ssh-ed25519 AAAA2",
}  # fmt: skip


ACCESS: list[str] = []  # marker: an access change (an update, no replace)


def _state(**changes: Any) -> dict[str, Any]:
    return {**BASE, "stdout": "fingerprint=f1", "expected": "f1", "observed": "f1",
            "generation": "g1", **changes}  # fmt: skip


@pytest.mark.parametrize(
    ("olds", "news", "replaces"),
    [
        (_state(), BASE, []),
        (_state(observed=""), BASE, ["observed"]),  # the image went away
        (_state(observed="f2"), BASE, ["observed"]),  # another image under the tag
        (_state(), {**BASE, "triggers": ["ref:2", "gen-a"]}, ["triggers"]),
        (_state(), {**BASE, "create": "stream v2"}, ["create"]),
        (_state(), {**BASE, "read_host": "10.0.0.3"}, ["read_host"]),
        # How the node is reached re-runs nothing (an update records it: ACCESS), and how
        # the step is read back changes nothing.
        (_state(), {**BASE, "user": "ops", "host_key": "ssh-ed25519 AAAA9"}, ACCESS),
        (_state(), {**BASE, "identity_file": "/home/ci/.cache/spark-vllm/sim/id"}, ACCESS),
        (_state(), {**BASE, "jump": ["bastion", 22, "root", None]}, ACCESS),
        (_state(), {**BASE, "port": 2222, "read_port": 2200}, ACCESS),
        (_state(), {**BASE, "env": {"PEER_USER": "ops", "PEER_PORT": "22"}}, ACCESS),
        (_state(), {**BASE, "read": "echo fingerprint=$(fp2)"}, []),
    ],
    ids=[
        "same",
        "gone",
        "replaced",
        "triggers",
        "command",
        "read node",
        "access",
        "identity path",
        "jump host",
        "ports",
        "run-time env",
        "read command",
    ],
)
def test_diff(olds: dict[str, Any], news: dict[str, Any], replaces: list[str]) -> None:
    diff = NodeStepProvider().diff("id", olds, news)
    if replaces is ACCESS:
        assert diff.changes is True and not diff.replaces
        # The update records the new access and keeps what the step left.
        outs = NodeStepProvider().update("id", olds, news).outs
        assert outs is not None
        kept = {"stdout": "fingerprint=f1", "expected": "f1", "observed": "f1", "generation": "g1"}
        assert {k: outs.get(k) for k in [*news, *kept]} == {**news, **kept}
    else:
        assert (diff.changes, sorted(diff.replaces or [])) == (bool(replaces), replaces)


NAME: dict[str, Any] = {
    **BASE, "step": "image-name-spark-1", "create": "name repo:latest", "read": "id of repo:latest",
    "state_key": "id", "triggers": [], "read_host": "10.0.0.1",
}  # fmt: skip
PINNED = "digest=repo@sha256:d1"
NAMED = {**NAME, "stdout": f"name=repo:latest\nid=sha256:i1\n{PINNED}", "expected": "sha256:i1",
         "observed": "sha256:i1", "generation": "g1"}  # fmt: skip
PIN = {**NAME, "create": "name repo:sha256-d1", "read": "id of repo:sha256-d1", "keep_if": PINNED}


@pytest.mark.parametrize(
    ("olds", "news", "kept"),
    [
        (NAMED, PIN, True),  # the image carries the pinned digest
        (NAMED, {**PIN, "keep_if": "digest=repo@sha256:d2"}, False),  # another image
        (NAMED, {**PIN, "keep_if": None}, False),  # a new tag: no line keeps it
        ({**NAMED, "observed": "sha256:i2"}, PIN, False),  # the name means another image now
        (NAMED, {**PIN, "host": "10.0.0.9"}, False),  # another node
        (NAMED, {**PIN, "triggers": ["x"]}, False),  # more than the command changed
    ],
    ids=["same image", "other digest", "tag", "moved name", "other node", "triggers"],
)
def test_a_step_is_kept_only_for_the_line_it_printed(
    olds: dict[str, Any], news: dict[str, Any], kept: bool
) -> None:
    """A step with `keep_if` (the image-name step, for a digest pin) is kept by an update
    when only its command changed and it printed that line; else replaced as any step."""
    diff = NodeStepProvider().diff("id", olds, news)
    assert diff.changes is True and (not diff.replaces) == kept, diff.replaces
    if kept:
        outs = NodeStepProvider().update("id", olds, news).outs
        assert outs is not None
        # The new definition is recorded (the next diff finds nothing), the result and
        # the read of the name it carries are kept.
        assert outs["create"] == PIN["create"] and outs["keep_if"] == PINNED
        assert {k: outs[k] for k in ("stdout", "expected", "generation", "read")} == {
            k: NAMED[k] for k in ("stdout", "expected", "generation", "read")
        }
        assert not NodeStepProvider().diff("id", outs, news).changes


# The image-ray probe: no read-back; its subject is the image-name step's ID (the image the
# containers run, kept by a pin of the digest it carries).
PROBE: dict[str, Any] = {
    **BASE, "step": "image-ray-spark-1", "create": "docker run repo:latest", "read": None,
    "read_stdin": None, "state_key": None, "stdin": "probe", "stdin_identity": False,
    "triggers": ["obtain-g1"], "read_host": "10.0.0.1", "id_value": "json:ray",
    "subject": "image-name-spark-1=repo:latest-n1",
}  # fmt: skip
PROBED = {**PROBE, "stdout": '{"ray": "2.60.0"}', "expected": "", "observed": "",
          "generation": "g1"}  # fmt: skip
# A pin of the digest that image carries: the obtain step re-ran (new generation) and the
# probe's command names the pinned tag; the image-name step was kept (its ID too).
REPINNED = {**PROBE, "create": "docker run repo:sha256-d1", "triggers": ["obtain-g2"]}
UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"  # an unknown input, as a preview's diff sees it


@pytest.mark.parametrize(
    ("olds", "news", "kept"),
    [
        (PROBED, REPINNED, True),  # the very image it read
        (PROBED, {**REPINNED, "triggers": [UNKNOWN]}, True),  # its preview
        (PROBED, {**PROBE, "triggers": ["obtain-g2"]}, True),  # a new image.source
        # Another image: the image-name step was replaced (unknown in its preview).
        (PROBED, {**REPINNED, "subject": "image-name-spark-1=repo:sha256-d2-n2"}, False),
        (PROBED, {**REPINNED, "subject": UNKNOWN}, False),
        # A stack deployed before steps had a subject: nothing vouches, it runs again.
        ({**PROBED, "subject": None}, REPINNED, False),
        (PROBED, {**REPINNED, "stdin": "probe v2"}, False),  # another probe
        (PROBED, {**REPINNED, "host": "10.0.0.9"}, False),  # another node
    ],
    ids=[
        "same image",
        "preview",
        "new source",
        "other image",
        "other image in preview",
        "recorded without subject",
        "new probe",
        "other node",
    ],
)
def test_a_step_is_kept_while_its_subject_is_the_one_it_read(
    olds: dict[str, Any], news: dict[str, Any], kept: bool
) -> None:
    """A step with `subject` (the image-ray probe) is kept by an update, its result and ID
    with it, when only its command and triggers changed and the subject is the one it
    recorded; else replaced as any step."""
    diff = NodeStepProvider().diff("id", olds, news)
    assert diff.changes is True and (not diff.replaces) == kept, diff.replaces
    if kept:
        outs = NodeStepProvider().update("id", olds, news).outs
        assert outs is not None
        assert {k: outs[k] for k in ("create", "triggers", "subject")} == {
            k: news[k] for k in ("create", "triggers", "subject")
        }
        assert {k: outs[k] for k in ("stdout", "generation")} == {
            k: PROBED[k] for k in ("stdout", "generation")
        }
        assert not NodeStepProvider().diff("id", outs, news).changes


def test_a_subject_alone_re_runs_nothing() -> None:
    """A new subject with the same command and triggers (or one given to a step recorded
    before it had one: an upgrade) is no change: the state keeps what it recorded."""
    for olds in (PROBED, {**PROBED, "subject": None}):
        diff = NodeStepProvider().diff("id", olds, {**PROBE, "subject": "image-name-spark-1=x-n9"})
        assert diff.changes is False and not diff.replaces


SCRIPTED = {**BASE, "defines": "d1", "reads": "r1"}
DONE = {"stdout": "fingerprint=f1", "expected": "f1", "observed": "f1", "generation": "g1"}
# A step recorded before its scripts were files: no `defines`, another text.
BEFORE = {**BASE, "create": "stream (inline)", "read": "echo fingerprint=$(fp) (inline)", **DONE}


@pytest.mark.parametrize(
    ("olds", "news", "replaces", "recorded"),
    [
        # Reworded: the texts differ, what they do does not. Nothing changes (the state
        # keeps the text it ran).
        ({**SCRIPTED, **DONE}, {**SCRIPTED, "create": "stream, said otherwise"}, None, []),
        ({**SCRIPTED, **DONE}, {**SCRIPTED, "read": "reworded read"}, None, []),
        # What it does changed: re-run.
        ({**SCRIPTED, **DONE}, {**SCRIPTED, "create": "v2", "defines": "d2"}, ["defines"], []),
        # A new read: recorded by an update, nothing runs.
        (
            {**SCRIPTED, **DONE},
            {**SCRIPTED, "read": "new read", "reads": "r2"},
            [],
            ["read", "reads"],
        ),
        # Recorded before the move to files, its node as the step left it: adopted.
        (BEFORE, SCRIPTED, [], ["read", "reads", "create", "defines"]),
        # ... unless the node no longer shows it, or more than its texts changed.
        ({**BEFORE, "observed": ""}, SCRIPTED, ["observed"], None),
        (BEFORE, {**SCRIPTED, "triggers": ["ref:2"]}, ["triggers"], None),
        # A check (no read-back) recorded before: nothing vouches for it, it runs again.
        (
            {**BEFORE, "read": None, "state_key": None},
            {**SCRIPTED, "read": None, "state_key": None, "reads": None},
            ["create"],
            None,
        ),
    ],
    ids=[
        "reworded",
        "read reworded",
        "revised",
        "new read",
        "adopted",
        "adopted gone",
        "adopted retriggered",
        "a check is not adopted",
    ],
)
def test_a_scripted_step_is_defined_by_what_its_scripts_do(
    olds: dict[str, Any],
    news: dict[str, Any],
    replaces: list[str] | None,
    recorded: list[str] | None,
) -> None:
    """A step made of script files re-runs when what they do changes (`defines`), records
    a new read by an update (`reads`), and is the same for a reworded text."""
    provider = NodeStepProvider()
    diff = provider.diff("id", olds, news)
    if replaces is None:
        assert diff.changes is False and not diff.replaces
        return
    assert diff.changes is True and sorted(diff.replaces or []) == replaces, diff
    if replaces:
        return
    outs = provider.update("id", olds, news).outs
    assert outs is not None
    assert sorted(k for k in outs if outs.get(k) != olds.get(k)) == sorted(recorded or [])
    assert {k: outs[k] for k in DONE} == DONE  # the result and the generation are kept
    assert not provider.diff("id", outs, news).changes  # and the next diff finds nothing


# Ray's membership: a wait (wait_s) whose read-back reads the same nodes the same way.
WAIT = {**SCRIPTED, "step": "model-server-ray-ready", "wait_s": 180, "state_key": "json:node_ids",
        "read": "members 10.0.0.1,10.0.0.2 2", "read_stdin": "probe r1"}  # fmt: skip
WAITED = {**WAIT, "stdout": '{"node_ids": ["a", "b"]}', "expected": '["a", "b"]',
          "observed": '["a", "b"]', "generation": "g1"}  # fmt: skip
# How it waits was revised (its script's settle, its probe's liveness check).
REVISED = {**WAIT, "create": "wait v2", "defines": "d2", "reads": "r2", "read_stdin": "probe r2"}


@pytest.mark.parametrize(
    ("olds", "news", "kept"),
    [
        (WAITED, REVISED, True),
        # Another node set or GPU count: its read names other values.
        (WAITED, {**REVISED, "read": "members 10.0.0.1,10.0.0.3 2"}, False),
        # A Ray container was replaced in this run: re-triggered, it waits again.
        (WAITED, {**REVISED, "triggers": ["ref:1", "gen-b"]}, False),
        # The last read found other raylets: nothing vouches.
        ({**WAITED, "observed": '["a", "c"]'}, REVISED, False),
        # Not a wait: a step with a read-back whose script was revised re-runs.
        ({**WAITED, "wait_s": None}, {**REVISED, "wait_s": None}, False),
    ],
    ids=["revised wait", "other nodes", "re-triggered", "other raylets", "not a wait"],
)
def test_a_wait_is_kept_when_only_how_it_waits_changed(
    olds: dict[str, Any], news: dict[str, Any], kept: bool
) -> None:
    """A revised wait (Ray's membership) whose read still finds what it recorded is kept
    by an update: its result and generation stay (the model server built on it is not
    replaced); the revised read's probe is recorded."""
    provider = NodeStepProvider()
    diff = provider.diff("id", olds, news)
    assert diff.changes is True and (not diff.replaces) == kept, diff.replaces
    if kept:
        outs = provider.update("id", olds, news).outs
        assert outs is not None
        assert {k: outs[k] for k in ("stdout", "expected", "generation")} == {
            k: WAITED[k] for k in ("stdout", "expected", "generation")
        }
        assert (outs["defines"], outs["read_stdin"]) == ("d2", "probe r2")
        assert not provider.diff("id", outs, news).changes


@pytest.mark.parametrize(
    ("stdout", "key", "value"),
    [
        ("transferred=0\nid=sha256:a\nfingerprint=f1", "fingerprint", "f1"),
        ("manifest=incomplete", "manifest", "incomplete"),
        (
            "waiting\n" + '{"node_ids": ["b", "a"], "complete": true}',
            "json:node_ids",
            '["a", "b"]',
        ),
        ("", "json:node_ids", '""'),
        ("nothing", "fingerprint", ""),
    ],
)
def test_state_value(stdout: str, key: str, value: str) -> None:
    assert state_value(stdout, key) == value


def test_a_step_runs_with_its_env_and_leaves_no_file_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run-time values go before the command (quoted), the host keys are files only
    while the call runs, and a missing key file is one line naming it and the fix."""
    import components.node_step as node_step

    key = tmp_path / "id"
    key.write_text("TEST-ONLY")
    seen: dict[str, Any] = {}

    def fake_ssh(target: Any, command: str, **_kw: Any) -> Any:
        known = Path(str(target.options.known_hosts))
        seen.update(command=command, known=known, existed=known.exists())
        return subprocess.CompletedProcess([], 0, "fingerprint=f1\n", "")

    monkeypatch.setattr(node_step, "run_ssh", fake_ssh)
    props = {**BASE, "identity_file": str(key), "timeout_s": 60,
             "env": {"PEER_USER": "o'ps", "PEER_PORT": "22"}}  # fmt: skip
    made = NodeStepProvider().create(props)
    assert made.outs is not None and made.outs["expected"] == "f1"
    assert seen["command"].startswith("PEER_PORT=22 PEER_USER='o'\"'\"'ps' bash -c ")
    assert seen["existed"] and not seen["known"].exists()
    key.unlink()
    with pytest.raises(RuntimeError) as missing:
        NodeStepProvider().create(props)
    said = str(missing.value)
    assert f"the SSH key file {key} (to reach 10.0.0.1) is missing" in said
    assert "python -m sparkvllm.workstation --stack " in said and "\n" not in said
