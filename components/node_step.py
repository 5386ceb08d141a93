"""NodeStep: one-shot work on a node that a refresh reads back (a Python dynamic provider).

pulumi-command never reads a Command back, so a step whose result can be lost on the node
(the image on a worker, the weights, Ray's membership, the model server answering) is a
NodeStep, whose lifecycle is:

- create runs the step's command on its node over ssh from the workstation and records
  the value of `state_key` it printed (`expected`), plus a fresh `generation`;
- read runs the step's `read` command (on `read_node`) and records what the node shows
  now (`observed`); nothing on the node changes;
- diff replaces the step when what defines it changed (`create`, `stdin`, `triggers`, the
  node; for a step made of script files, `defines`: what its scripts do, not their
  wording) or when the last read found the node no longer as the step left it (`observed`
  != `expected`); a scripted step's new read (`reads`) is recorded by an update that runs
  nothing; a new SSH key changes nothing (the key is read from the workstation's
  identity file at call time); a new user, host key, key file or jump host is recorded by
  an update that runs nothing (a refresh reads the step back with what the state holds);
- a step given `keep_if` (a line it may have printed) is kept when only its command
  changed and the line is among what it printed: the new command would find what the
  old one left (the image it named carries the digest now pinned). An update records the
  new definition and keeps the result, the read and the ID (so what the ID carries);
- a step given `subject` (the identity of what it reads, e.g. the image-name step's ID for
  the image-ray probe) is kept, likewise, when only its command and its triggers changed
  and the subject is the one it recorded: it read that very thing, which is still there
  (a subject that may differ, or is unknown in a preview, replaces it as any step);
- delete runs the step's undo, if it has one;
- a check step (a preflight: no `read`) is judged by the provider's `judge` on what it
  printed; a failing one raises in create, so nothing is recorded and the next `up` runs
  it again (a judgement in an apply of the program would leave the failed output recorded,
  read back unchanged by every later run).

Downstream resources take `generation`, read from the step's ID (known in preview unless
the step is created or replaced), so re-running a step re-creates what was built on it, and
nothing else.
"""

from __future__ import annotations

import json
import shlex
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulumi
from pulumi.dynamic import (
    CreateResult,
    DiffResult,
    ReadResult,
    Resource,
    ResourceProvider,
    UpdateResult,
)

from sparkvllm.remote import ConnectionFiles, run_ssh
from sparkvllm.specs.commands import CommandSpec, env_assignments
from sparkvllm.specs.output import key_values, last_json
from sparkvllm.specs.ssh import Reach
from sparkvllm.workstation import prepare_command

# What defines a step: a change re-runs it. How it is read back (`read`, `read_stdin`) does
# not: a new read command changes no plan, and is recorded when the step next runs.
_DEFINING = ("create", "stdin", "stdin_identity", "state_key", "triggers", "host", "read_host")
# A step made of script files (sparkvllm/scripts) carries `defines` and `reads`: digests
# of what its create and its read do (the scripts' names and revisions, and the values),
# which then decide instead of the texts. A reworded script changes neither: the step is
# the same, and keeps the text it ran. A new `defines` re-runs the step; a new `reads` is
# recorded by an update that runs nothing (a refresh reads the step back with the read
# the state holds: a new one must reach it).
_SCRIPTED = ("create", "stdin")
_READS = ("read", "read_stdin", "reads")
# How the node is reached (user, port, host key, key file, jump host, and the run-time
# `env` of a head-to-worker step: the worker's user, port and host key): a change re-runs
# nothing, but it is recorded (an update that runs no command), because a refresh reads
# the step back with what the state holds: a node moved behind a bastion is read through it.
_ACCESS = ("user", "port", "host_key", "identity_file", "jump", "read_user", "read_port",
           "read_host_key", "read_jump", "read_identity_file", "stdin_file", "env")  # fmt: skip


def state_value(stdout: str, key: str) -> str:
    """The value a step or its read reports: `key` of its key=value lines, or for
    `json:FIELD` that field of its last JSON line (lists sorted)."""
    if key.startswith("json:"):
        value = last_json(stdout).get(key.removeprefix("json:"), "")
        return json.dumps(sorted(value) if isinstance(value, list) else value)
    return key_values(stdout).get(key, "")


def _key_file(props: dict[str, Any], reach: Reach) -> Path:
    """The workstation's key file for `reach`; missing (a machine that never ran the
    program: a refresh reads before it runs), one line naming it and the command that
    writes it."""
    path = Path(reach.identity_file).expanduser()
    if not path.is_file():
        raise RuntimeError(
            f"{props['step']}: the SSH key file {path} (to reach {reach.host}) is missing on "
            f"this workstation; fix: run `{prepare_command(path.parent.name)}` first (it "
            "writes the stack's key and known_hosts files from its config and secrets)"
        )
    return path


def _on_node(props: dict[str, Any]) -> tuple[Reach, str | None, str]:
    """How the step's own command (create, delete) runs: on its node, with its stdin (the
    key of the node it reaches from its own, the read node's; or a secret the workstation
    wrote, the hf_token, empty when the stack has none) and its run-time values: a wait
    budget ($WAIT_S) and how a head-to-worker step reaches its worker (`env`), passed at
    run time so that a new value is not a new step."""
    reach = Reach.from_props(props)
    _key_file(props, reach)
    stdin = props.get("stdin")
    if props.get("stdin_identity") and stdin is None:
        stdin = _key_file(props, Reach.from_props(props, "read_")).read_text()
    if props.get("stdin_file") and stdin is None:
        secret = Path(str(props["stdin_file"])).expanduser()
        stdin = secret.read_text() if secret.exists() else ""
    values = [("WAIT_S", str(int(props["wait_s"])))] if props.get("wait_s") else []
    env = env_assignments([*values, *sorted((props.get("env") or {}).items())])
    return reach, stdin, env


def _run(
    props: dict[str, Any], reach: Reach, command: str, stdin: str | None, env: str,
    timeout: float,
) -> str:  # fmt: skip
    """`command` on the node `reach` names, under bash, `env` assigned first."""
    _key_file(props, reach)
    # The host keys as known_hosts files in a private temp folder, removed after the call
    # (the provider host is stopped with a signal: nothing may be left for an exit hook).
    with ConnectionFiles() as files:
        result = run_ssh(
            reach.target(files), f"{env}bash -c {shlex.quote(command)}", stdin=stdin,
            timeout=timeout,
        )  # fmt: skip
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-15:])
        raise RuntimeError(
            f"{props['step']} failed on {reach.host} (exit {result.returncode}):\n{tail}"
        )
    return result.stdout.removesuffix("\n")


# What a kept step keeps of its last run: its result, and the read that checks it (a kept
# wait reads as before, the same `read`, and records its revised probe: result only).
_RESULT = ("stdout", "expected", "observed", "generation")
_KEPT = (*_RESULT, "read", "read_stdin")


def _reruns(olds: dict[str, Any], news: dict[str, Any]) -> list[str]:
    """The defining inputs that changed: each re-runs the step. For a scripted step, what
    its scripts do (`defines`) stands for their texts; one recorded before its scripts
    were files (no `defines`) is adopted instead when a read-back vouches for it
    (`_adoptable`, `_recorded`), else its new text re-runs it."""
    keys: list[str] = list(_DEFINING)
    if olds.get("defines") and news.get("defines"):
        keys = [*(k for k in keys if k not in _SCRIPTED), "defines"]
    elif _adoptable(olds, news):
        keys = [k for k in keys if k not in _SCRIPTED]
    return [k for k in keys if olds.get(k) != news.get(k)]


def _recorded(olds: dict[str, Any], news: dict[str, Any]) -> list[str]:
    """The inputs an update records without running anything: how the node is reached,
    a scripted step's new read (`reads`), and, for a step recorded before its scripts
    were files, its scripted definition: its node still shows what it left (else the
    diff replaces it for that), so it is adopted as it stands, and keeps its result and
    generation (nothing built on it is replaced)."""
    keys = [k for k in _ACCESS if olds.get(k) != news.get(k)]
    if news.get("reads") and olds.get("reads") != news.get("reads"):
        keys += [k for k in _READS if olds.get(k) != news.get(k)]
    if _adoptable(olds, news):
        keys += [k for k in (*_SCRIPTED, "defines") if olds.get(k) != news.get(k)]
    return keys


def _adoptable(olds: dict[str, Any], news: dict[str, Any]) -> bool:
    """A step recorded before its scripts were files, which a read-back vouches for (its
    last read found the node as it left it). A check has no read: nothing vouches for what
    it found, so it runs again (a read-only preflight: seconds, nothing built on it)."""
    return bool(news.get("defines") and not olds.get("defines") and olds.get("read"))


def _kept(olds: dict[str, Any], news: dict[str, Any]) -> bool:
    """The node still shows what the step left, and either only the command changed and
    the step printed the line the new definition keeps it for (`keep_if`), or only the
    command and the triggers changed and what it read is the very one it recorded
    (`subject`: a new command for the same thing, re-triggered by a step that found it in
    place)."""
    if olds.get("observed") != olds.get("expected"):
        return False
    changed = set(_reruns(olds, news))
    line = news.get("keep_if")
    if line:
        return (
            changed in ({"create"}, {"defines"})
            and line in str(olds.get("stdout") or "").splitlines()
        )
    if _wait_kept(olds, news):
        return True
    subject = news.get("subject")
    return (
        bool(subject)
        and olds.get("subject") == subject
        and bool(changed)
        and changed <= {"create", "defines", "triggers"}
    )


def _wait_kept(olds: dict[str, Any], news: dict[str, Any]) -> bool:
    """A wait (`wait_s`: Ray's membership) whose read-back reads the same thing the same
    way (its `read` command, values included: the same nodes, GPUs and container) and
    last found what it recorded, when only how it waits changed (`defines`: its script or
    probe revised): waiting again would find what it recorded, and a new generation would
    replace what was built on it (the model server) for nothing. Called once the read is
    known to vouch (observed == expected)."""
    return (
        bool(news.get("wait_s") and olds.get("read"))
        and olds.get("read") == news.get("read")
        and set(_reruns(olds, news)) == {"defines"}
    )


def carried(step_id: str) -> str:
    """The value a step's ID carries (`<step>=<value>-<generation>`; "" for none)."""
    return step_id.rsplit("-", 1)[0].partition("=")[2]


def step_id(props: dict[str, Any], stdout: str, generation: str) -> str:
    """`<step>-<generation>`; a step whose printed value the program decides on carries it
    too, `<step>=<value>-<generation>`, the value of its `id_value` key (see NodeStep)."""
    key = props.get("id_value")
    shown = f"={state_value(stdout, str(key))}" if key else ""
    return f"{props['step']}{shown}-{generation}"


class NodeStepProvider(ResourceProvider):
    def __init__(self, judge: Callable[[str], object] | None = None):
        # Pickled with the provider (dill): a module function, or a partial of one over
        # plain data without secrets. (Not `check`: that is the provider's Check.)
        self.judge = judge

    def create(self, props: dict[str, Any]) -> CreateResult:
        reach, stdin, env = _on_node(props)
        stdout = _run(props, reach, props["create"], stdin, env, float(props["timeout_s"]))
        if self.judge is not None:
            # Raises on what the node printed: a failed create records nothing, so the
            # next `up` runs the step (a preflight) again.
            self.judge(stdout)
        expected = state_value(stdout, props["state_key"]) if props.get("state_key") else ""
        outs = {**props, "stdout": stdout, "expected": expected, "observed": expected,
                "generation": uuid.uuid4().hex[:16]}  # fmt: skip
        return CreateResult(step_id(props, stdout, outs["generation"]), outs)

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        if not props.get("read"):
            return ReadResult(id_, props)
        # On the node it reads back, with its own stdin (a probe) and nothing else.
        reach = Reach.from_props(props, "read_")
        stdout = _run(props, reach, props["read"], props.get("read_stdin"), "", 300.0)
        return ReadResult(id_, {**props, "observed": state_value(stdout, props["state_key"])})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        replaces = _reruns(olds, news)
        if _kept(olds, news):
            return DiffResult(changes=True, replaces=[])
        if olds.get("observed") != olds.get("expected"):
            replaces.append("observed")
        recorded = _recorded(olds, news)
        return DiffResult(changes=bool(replaces or recorded), replaces=replaces)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        """Only what `_recorded` names changed (diff replaces for anything else), or the
        step is kept (`keep_if`, `subject`): record it; no command runs on the node."""
        if _kept(olds, news):
            kept = _RESULT if _wait_kept(olds, news) else _KEPT
            return UpdateResult({**news, **{k: olds.get(k) for k in kept}})
        return UpdateResult({**olds, **{k: news.get(k) for k in _recorded(olds, news)}})

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        if props.get("delete"):
            reach, stdin, env = _on_node(props)
            _run(props, reach, props["delete"], stdin, env, float(props["timeout_s"]))


class NodeStep(Resource):
    """A CommandSpec run on its node, read back by refresh; named `spec.name`. Outputs:
    `stdout`, `expected`, `observed`, `generation`.

    A spec without `read` (and `state_key`) is a check: run at create, never read back.
    `check` judges its output in the provider (raising fails the create: nothing recorded,
    the next `up` runs it again)."""

    stdout: pulumi.Output[str]
    generation: pulumi.Output[str]

    def __init__(
        self,
        spec: CommandSpec,
        *,
        reach: Reach,
        read_reach: Reach | None = None,
        triggers: list[pulumi.Input[str]] | None = None,
        stdin_file: str | None = None,
        check: Callable[[str], object] | None = None,
        id_value: str | None = None,
        keep_if: str | None = None,
        subject: pulumi.Input[str] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        if (spec.read is None) != (spec.state_key is None):
            raise ValueError(f"{spec.name}: a read command and a state key go together")
        if spec.stdin_secret == "hf_token" and stdin_file is None:
            raise ValueError(f"{spec.name}: its hf_token comes from a file: pass stdin_file")
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
            **reach.props(),
            **other.props("read_"),
            "stdout": None, "expected": None, "observed": None, "generation": None,
        }  # fmt: skip
        if other.identity_file != reach.identity_file:
            props["read_identity_file"] = other.identity_file
        if spec.env:  # only where there is one: other steps' inputs stay as they were
            props["env"] = dict(spec.env)
        # Only for a step made of script files (likewise).
        props.update({k: v for k, v in (("defines", spec.defines), ("reads", spec.reads)) if v})
        if id_value is not None:
            if "=" in spec.name:
                raise ValueError(f"{spec.name}: a step carrying a value has no = in its name")
            props["id_value"] = id_value
        if keep_if is not None:
            props["keep_if"] = keep_if
        if subject is not None:  # only where there is one (a new input key is no change)
            props["subject"] = subject
        if spec.stdin_secret == "hf_token":
            # Where the secret is, not the secret: the value never enters the state.
            props["stdin_file"] = stdin_file
        super().__init__(NodeStepProvider(judge=check), spec.name, props, opts)
        # The generation as the ID carries it (`<step>-<generation>`): an update (only the
        # access changed) keeps the ID known in preview (pulumi step.go UpdateStep.Apply
        # propagates it "even in previews"), while every output of a dynamic provider's
        # update is unknown there (provider_plugin.go: the inputs stand in for the outputs,
        # and `generation` is not an input). A create or replace: unknown, as it must be.
        self.generation = self.id.apply(lambda id_: str(id_).rsplit("-", 1)[-1])
        # With `id_value` (a key as `state_key` names one), that value of what the step
        # printed, from the ID
        # (`<step>=<value>-<generation>`) for the same reason: known in the preview of an
        # update, where `expected` is not.
        self.id_value = self.id.apply(lambda id_: carried(str(id_)) if id_value else "")
