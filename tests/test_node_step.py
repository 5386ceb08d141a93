"""NodeStep's lifecycle decisions (components/node_step.py), as data: what a diff does
with each kind of change, and how a step's state value is read from its output."""

from __future__ import annotations

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
