"""NodeStep: one-shot work on a node that a refresh reads back (a Python dynamic provider).

pulumi-command never reads a Command back, so a step whose result can be lost on the node
(the image on a worker, the weights, Ray's membership, the model server answering) is a
NodeStep, whose lifecycle is:

- create runs the step's command on its node over ssh from the workstation and records
  the value of `state_key` it printed (`expected`), plus a fresh `generation`;
- read runs the step's `read` command (on `read_node`) and records what the node shows
  now (`observed`); nothing on the node changes;
- diff replaces the step when what defines it changed (`create`, `stdin`, `triggers`, the
  node) or when the last read found the node no longer as the step left it (`observed` !=
  `expected`); a new SSH key or user changes nothing (they are not inputs: the key is read
  from the workstation's identity file at call time);
- delete runs the step's undo, if it has one.

Downstream resources take `generation` (known in preview unless the step is replaced), so
re-running a step re-creates what was built on it, and nothing else.
"""

from __future__ import annotations

import json
import shlex
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, Resource, ResourceProvider

from sparkvllm.remote import ConnectionFiles, run_ssh
from sparkvllm.specs.commands import CommandSpec, parse_kv
from sparkvllm.specs.health import last_json
from sparkvllm.specs.ssh import SshTarget

# What defines a step: a change re-runs it. How it is read back (`read`, `read_stdin`) does
# not: a new read command changes no plan, and is recorded when the step next runs.
_DEFINING = ("create", "stdin", "stdin_identity", "state_key", "triggers", "host", "port",
             "read_host", "read_port")  # fmt: skip


@dataclass(frozen=True)
class Reach:
    """How the workstation reaches one node (no secret: the key stays in its file)."""

    host: str
    port: int
    user: str
    host_key: str | None
    identity_file: str  # may start with ~ (expanded at call time)

    def target(self) -> SshTarget:
        base = _FILES.target(
            {"host": self.host, "port": self.port, "user": self.user, "hostKey": self.host_key}
        )
        identity = str(Path(self.identity_file).expanduser())
        return replace(base, options=replace(base.options, identity=identity))


# Host keys as known_hosts files in a private temp directory of this process.
_FILES = ConnectionFiles()


def state_value(stdout: str, key: str) -> str:
    """The value a step or its read reports: `key` of its key=value lines, or for
    `json:FIELD` that field of its last JSON line (lists sorted)."""
    if key.startswith("json:"):
        value = last_json(stdout).get(key.removeprefix("json:"), "")
        return json.dumps(sorted(value) if isinstance(value, list) else value)
    return parse_kv(stdout).get(key, "")


def _reach(props: dict[str, Any], prefix: str = "") -> Reach:
    return Reach(
        host=str(props[f"{prefix}host"]),
        port=int(props[f"{prefix}port"]),
        user=str(props[f"{prefix}user"]),
        host_key=props.get(f"{prefix}host_key") or None,
        identity_file=str(props["identity_file"]),
    )


def _run(
    props: dict[str, Any], command: str, stdin: str | None, prefix: str, timeout: float
) -> str:
    reach = _reach(props, prefix)
    if props.get("stdin_identity") and stdin is None and not prefix:
        stdin = Path(reach.identity_file).expanduser().read_text()
    # A wait budget is passed at run time ($WAIT_S), so a new budget is not a new step.
    env = f"WAIT_S={int(props['wait_s'])} " if props.get("wait_s") and not prefix else ""
    result = run_ssh(
        reach.target(), f"{env}bash -c {shlex.quote(command)}", stdin=stdin, timeout=timeout
    )
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-15:])
        raise RuntimeError(
            f"{props['step']} failed on {reach.host} (exit {result.returncode}):\n{tail}"
        )
    return result.stdout.removesuffix("\n")


class NodeStepProvider(ResourceProvider):
    def create(self, props: dict[str, Any]) -> CreateResult:
        stdout = _run(props, props["create"], props.get("stdin"), "", float(props["timeout_s"]))
        expected = state_value(stdout, props["state_key"])
        outs = {**props, "stdout": stdout, "expected": expected, "observed": expected,
                "generation": uuid.uuid4().hex[:16]}  # fmt: skip
        return CreateResult(f"{props['step']}-{outs['generation']}", outs)

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        if not props.get("read"):
            return ReadResult(id_, props)
        stdout = _run(props, props["read"], props.get("read_stdin"), "read_", 300.0)
        return ReadResult(id_, {**props, "observed": state_value(stdout, props["state_key"])})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        replaces = [k for k in _DEFINING if olds.get(k) != news.get(k)]
        if olds.get("observed") != olds.get("expected"):
            replaces.append("observed")
        return DiffResult(changes=bool(replaces), replaces=replaces)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> Any:
        raise RuntimeError("a NodeStep is never updated in place (diff replaces or keeps it)")

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        if props.get("delete"):
            _run(props, props["delete"], None, "", float(props["timeout_s"]))


class NodeStep(Resource):
    """A CommandSpec run on its node, read back by refresh. Outputs: `stdout`,
    `expected`, `observed`, `generation`."""

    stdout: pulumi.Output[str]
    generation: pulumi.Output[str]

    def __init__(
        self,
        resource_name: str,
        spec: CommandSpec,
        *,
        reach: Reach,
        read_reach: Reach | None = None,
        triggers: list[pulumi.Input[str]] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        if spec.read is None or spec.state_key is None:
            raise ValueError(f"{spec.name}: a NodeStep needs a read command and a state key")
        other = read_reach or reach
        props: dict[str, Any] = {
            "step": spec.name,
            "create": spec.create,
            "delete": spec.delete,
            "stdin": spec.stdin,
            "stdin_identity": spec.stdin_secret == "ssh_private_key",
            "read": spec.read,
            "read_stdin": spec.read_stdin,
            "state_key": spec.state_key,
            "timeout_s": spec.timeout_s,
            "wait_s": spec.wait_s,
            "triggers": triggers or [],
            "identity_file": reach.identity_file,
            "host": reach.host, "port": reach.port, "user": reach.user,
            "host_key": reach.host_key,
            "read_host": other.host, "read_port": other.port, "read_user": other.user,
            "read_host_key": other.host_key,
            "stdout": None, "expected": None, "observed": None, "generation": None,
        }  # fmt: skip
        super().__init__(NodeStepProvider(), resource_name, props, opts)
