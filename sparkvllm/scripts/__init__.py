"""Node scripts: bash files that a step runs on a node, each with ONE way in for values.

A script file opens with its header, then its body:

    #!/usr/bin/env bash
    # What the script does (any number of comment lines).
    # revision: 1
    # uses: probe_loop              (optional: files of lib/ it needs, inlined first)
    # values: CONTAINER PROBE_ARGS[] (what render() assigns; NAME[] is a bash array)

`render(name, **values)` is the only way a value reaches a script: each becomes a
`readonly` variable, quoted (a list a bash array), before the libraries and the body; no
value is ever pasted into the script's text. The files are checked by `bash -n` and
shellcheck (tests/test_scripts.py, and .ci/run).

What a script does is its `identity`: its name, its revision (and its libraries'), and the
values; not its wording. A reworded message, a comment or a new layout keep the identity,
so no deployed step re-runs for them (components/node_step.py compares identities, not
texts); a change of what a script does bumps its `revision`, and that re-runs the steps
that run it. tests/test_golden.py holds every rendered command of the sim and spark stacks
and fails on any difference, naming what a deployed stack would re-run, until the golden
copies are accepted (CONTRIBUTING.md).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources

from sparkvllm import probes


@dataclass(frozen=True)
class Probe:
    """A probe's source (sparkvllm/probes) as a value: the script gets its text, the
    identity its name and revision (a reworded probe is the same probe)."""

    name: str


_HEADER = re.compile(r"^# (revision|uses|values):(.*)$")
_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
# Names bash, ssh or the step itself give a meaning (a value may not take one).
_RESERVED = {"PATH", "HOME", "IFS", "SHELL", "USER", "PWD", "OLDPWD", "SECONDS", "RANDOM",
             "LINENO", "HOSTNAME", "TMPDIR", "LANG", "TERM", "PS4", "ENV", "CDPATH",
             "WAIT_S", "PEER_USER", "PEER_PORT", "PEER_HOST_KEY"}  # fmt: skip


@dataclass(frozen=True)
class Script:
    """A script file, parsed: its header's fields and its body (the header removed)."""

    name: str
    revision: int
    uses: tuple[str, ...]
    values: tuple[str, ...]  # as declared: NAME, or NAME[] for an array
    body: str


@dataclass(frozen=True)
class Rendered:
    """A script as a node runs it (`text`), and what it does (`identity`)."""

    text: str
    identity: str


Value = str | int | Sequence[str] | Probe | Rendered


@cache
def load(name: str) -> Script:
    """The script file `name` (`lib/NAME` for a library), parsed."""
    text = resources.files(__package__).joinpath(f"{name}.sh").read_text()
    lines = text.splitlines()
    fields: dict[str, str] = {}
    start = 0
    for i, line in enumerate(lines):
        if i == 0 and line.startswith("#!"):
            continue
        if not line.startswith("#"):
            start = i
            break
        if m := _HEADER.match(line):
            fields[m.group(1)] = m.group(2).strip()
    else:
        start = len(lines)
    if "revision" not in fields:
        raise ValueError(f"scripts/{name}.sh: no `# revision: N` line in its header")
    values = tuple(fields.get("values", "").split())
    for v in values:
        bare = v.removesuffix("[]")
        if (
            not _NAME.match(bare)
            or bare in _RESERVED
            or bare.startswith(("BASH", "LC_", "SSH_A", "SPARKVLLM_"))
        ):
            raise ValueError(f"scripts/{name}.sh: {v!r} is not a value name of its own")
    body = "\n".join(lines[start:]).strip("\n")
    return Script(
        name, int(fields["revision"]), tuple(fields.get("uses", "").split()), values, body
    )


def _word(value: object) -> str:
    """`value` as one single-quoted bash word, whatever it holds."""
    return "'" + str(value).replace("'", "'\"'\"'") + "'"


def _assign(declared: str, value: Value) -> str:
    name = declared.removesuffix("[]")
    if isinstance(value, Probe):
        value = probes.script(value.name)
    elif isinstance(value, Rendered):
        value = value.text
    if declared.endswith("[]"):
        if isinstance(value, str | int):
            raise TypeError(f"{name}: an array takes a list, not {value!r}")
        return f"readonly -a {name}=({' '.join(_word(v) for v in value)})"
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise TypeError(f"{name}: takes a string or an integer, not {value!r}")
    return f"readonly {name}={_word(value)}"


def _libraries(script: Script) -> list[Script]:
    """The libraries `script` uses, each once, in the order they are first used."""
    out: list[Script] = []
    for lib in script.uses:
        used = load(f"lib/{lib}")
        for dep in [*_libraries(used), used]:
            if dep not in out:
                out.append(dep)
    return out


def _what(value: Value) -> object:
    """What a value contributes to an identity: a probe its name and revision, a script
    rendered for another node (a relay hop) its identity, not their texts."""
    if isinstance(value, Probe):
        return ("probe", value.name, probes.revision(value.name))
    if isinstance(value, Rendered):
        return ("script", value.identity)
    return value if isinstance(value, str | int) else list(value)


def identity(*parts: object) -> str:
    """A digest of what defines something (plain data: names, revisions, values)."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=list)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def render(name: str, **values: Value) -> Rendered:
    """Script `name` with `values` as quoted read-only variables: exactly the names its
    header declares (a missing or unknown one raises)."""
    script = load(name)
    declared = {v.removesuffix("[]"): v for v in script.values}
    if missing := sorted(set(declared) - set(values)):
        raise TypeError(f"scripts/{name}.sh: no value for {', '.join(missing)}")
    if unknown := sorted(set(values) - set(declared)):
        raise TypeError(f"scripts/{name}.sh declares no {', '.join(unknown)}")
    libs = _libraries(script)
    text = "\n".join(
        [
            *(_assign(declared[k], values[k]) for k in sorted(values)),
            *(lib.body for lib in libs),
            script.body,
        ]
    )
    plain = {k: _what(v) for k, v in values.items()}
    revisions = [(s.name, s.revision) for s in [*libs, script]]
    return Rendered(text, identity(revisions, plain))
