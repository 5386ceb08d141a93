"""The docs agree with the code. Every command README.md and docs/*.md show (`python -m
MODULE ...`, `python SCRIPT.py ...`, `./SCRIPT ...`; `pulumi ...` needs the CLI and is not
checked) names a module or script that exists and takes each `--flag` shown with it; and
every markdown table there renders: each row has as many cells as its header, counted as
GitHub counts them (every pipe not escaped as `\\|`, inside code spans too)."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCED = re.compile(r"^```.*?^```", re.M | re.S)
COMMAND = re.compile(
    r"(?:^|[\s(])(?:\S*python3? +(?:-m +(?P<module>[\w.]+)|(?P<script>[\w./-]+\.py)(?!\w))"
    r"|(?P<exe>\./[\w.-]+))(?P<args>[^;&#`]*)"
)
SEPARATOR = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")


def code_shown(text: str) -> Iterator[str]:
    """Each line of a fenced or indented block, and each inline code span (whitespace
    collapsed: a span may wrap across lines)."""
    for block in FENCED.findall(text):
        yield from block.splitlines()[1:-1]
    prose = FENCED.sub("", text)
    yield from (line for line in prose.splitlines() if line.startswith("    "))
    yield from (" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose))


COMMANDS = sorted(
    {
        (page.name, m.group(0).strip(" ("))
        for page in PAGES
        for code in code_shown(page.read_text())
        for m in COMMAND.finditer(code)
    }
)


@functools.cache
def help_of(argv: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(("page", "command"), COMMANDS, ids=[c for _, c in COMMANDS])
def test_a_command_shown_exists_and_takes_its_flags(page: str, command: str) -> None:
    m = COMMAND.search(command)
    assert m is not None
    args = m["args"].replace("\\|", "|").split()
    flags = sorted(set(re.findall(r"(?<![\w-])--[a-z][\w-]*", m["args"])))
    if m["exe"]:  # a bash script: its flags are in its text
        script = ROOT / m["exe"]
        assert os.access(script, os.X_OK), f"{page}: {command}: no executable {m['exe']}"
        assert all(f in script.read_text() for f in flags), f"{page}: {command}"
        return
    if m["module"]:
        assert importlib.util.find_spec(m["module"]), f"{page}: {command}: no such module"
        target = ["-m", m["module"]]
    else:
        assert (ROOT / m["script"]).is_file(), f"{page}: {command}: no such script"
        target = [m["script"]]
    words = []  # subcommands: the words before the first flag or placeholder
    for arg in args:
        if not re.fullmatch(r"[a-z][a-z|/-]*", arg):
            break
        words.append(arg)
    if not words and not flags:
        return
    for first in re.split(r"[|/]", words[0]) if words else [None]:
        argv = (*target, *([first, *words[1:]] if first else []))
        shown = help_of(argv)
        assert shown.returncode == 0, f"{page}: {command}: {' '.join(argv)}: {shown.stderr}"
        missing = [f for f in flags if not re.search(re.escape(f) + r"(?![\w-])", shown.stdout)]
        assert not missing, f"{page}: {command}: {' '.join(argv)} takes no {missing}"


def cells(row: str) -> int:
    return len(re.sub(r"^\||\|$", "", row.strip().replace("\\|", "")).split("|"))


def table_problems(text: str) -> list[str]:
    """Rows that do not render: a row with another number of cells than its header, or a
    row with no header and separator above it (after a sentence, it is that sentence's)."""
    lines = FENCED.sub(lambda b: "\n" * b.group(0).count("\n"), text).splitlines()
    problems, width = [], 0
    for i, line in enumerate(lines):
        if not line.lstrip().startswith("|"):
            width = 0
        elif width:
            if cells(line) != width:
                problems.append(f"line {i + 1}: {cells(line)} cells, its header {width}")
        elif i + 1 < len(lines) and SEPARATOR.match(lines[i + 1]):
            width = cells(line)
        else:
            problems.append(f"line {i + 1}: a row with no header and separator above it")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_table_renders(page: Path) -> None:
    assert table_problems(page.read_text()) == [], page.name
