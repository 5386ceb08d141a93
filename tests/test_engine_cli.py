"""The local engine's command line as a user meets it: installed with the package, run on
the project in the current folder (as the Pulumi CLI is), and bad input answered in one
line with exit 2, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from localengine import __main__ as cli
from tests.conftest import project_yaml
from tests.test_localengine import make_project

ENGINE = [sys.executable, "-m", "localengine"]


def engine(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m localengine ARGS` from `cwd`, as a user runs it: the package installed,
    not the checkout on PYTHONPATH."""
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", *env)}
    return subprocess.run(
        [*ENGINE, *args], cwd=cwd, env={**clean, **env}, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def in_process(
    cwd: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    *args: str,
    **env: str,
) -> subprocess.CompletedProcess[str]:
    """The same command line run in this process (its refusals need no program: a
    subprocess each would cost a second of imports), from `cwd` with `env` set."""
    monkeypatch.chdir(cwd)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    try:
        code = cli.main(list(args))
    except SystemExit as e:  # argparse's refusals
        code = int(e.code or 0)
    said = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), code, said.out, said.err)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A project of one's own: Pulumi.yaml, a stack file `dev`, no state yet."""
    (tmp_path / "Pulumi.yaml").write_text(project_yaml("mine"))
    (tmp_path / "Pulumi.dev.yaml").write_text("config: {}\n")
    (tmp_path / "__main__.py").write_text("import pulumi\npulumi.export('x', 1)\n")
    return tmp_path


NO_STACK = 6  # the Pulumi CLI's ExitStackNotFound
BAD_USAGE = [
    # (argv, env, what the one line names): exit 2, or 6 for a stack that is not there
    (["destroy", "--stack", "ncnope"], {}, "no stack named 'ncnope' found"),
    (["refresh", "--stack", "ncnope"], {}, "no stack named 'ncnope' found"),
    (["up", "--stack", "ncnope"], {}, "no stack named 'ncnope' found"),
    (["output", "--stack", "ncnope"], {}, "no stack named 'ncnope' found"),
    (["export", "--stack", "ncnope"], {}, "no stack named 'ncnope' found"),
    (["state", "delete", "urn:x", "--stack", "ncnope"], {}, "no stack named 'ncnope' found"),
    (["import", "--stack", "ncnope", "--file", "x.json"], {}, "no stack named 'ncnope'"),
    (["up", "--stack", "dev", "--parallel", "0"], {}, "--parallel/-p: '0': give a whole"),
    (["up", "--stack", "dev", "-p", "-3"], {}, "--parallel/-p: '-3': give a whole"),
    (["up", "--stack", "dev", "--parallel", "many"], {}, "'many': give a whole number"),
    (["preview", "--stack", "dev", "--cwd", "/nonexistent"], {}, "no Pulumi.yaml in"),
    (
        ["destroy", "--stack", "dev"],
        {"LOCALENGINE_BACKEND_URL": "s3://bucket"},
        "LOCALENGINE_BACKEND_URL = 's3://bucket': the local engine keeps its states in a folder",
    ),
    (
        ["import", "--stack", "dev", "--file", "x.json"],
        {"LOCALENGINE_BACKEND_URL": "https://api.pulumi.com"},
        "Fix: set it to file://DIR",
    ),
    (["up", "--stack", "bad/name"], {}, "stack names may only contain"),
    (["launch", "--stack", "dev"], {}, "invalid choice: 'launch'"),
]


@pytest.mark.parametrize(("argv", "env", "names"), BAD_USAGE)
def test_bad_usage_is_one_line_exit_2_or_6_and_writes_nothing(
    folder: Path,
    argv: list[str],
    env: dict[str, str],
    names: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = sorted(folder.rglob("*"))
    done = in_process(folder, monkeypatch, capsys, *argv, **env)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == (NO_STACK if "no stack named" in names else 2), done
    assert len(lines) == 1 and names in lines[0] and "Traceback" not in done.stderr, lines
    assert sorted(folder.rglob("*")) == before


def test_it_works_on_the_project_of_the_folder_it_runs_in_or_above(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From a project's own folder (and a folder below it), with the package installed:
    the project found as the CLI finds it, never the checkout's."""
    (tmp_path / "proj").mkdir()
    project = make_project(tmp_path / "proj", monkeypatch)
    assert not project.run().error  # a state, with outputs
    below = project.dir / "sub"
    below.mkdir()
    for where in (project.dir, below):
        shown = engine(where, "output", "--stack", "test", "--json")
        assert shown.returncode == 0 and '"b"' in shown.stdout, shown
    elsewhere = engine(tmp_path, "output", "--stack", "test", "--cwd", "proj", "--json")
    assert elsewhere.returncode == 0 and '"b"' in elsewhere.stdout, elsewhere


CONFIG_REFUSED = """import pulumi
raise pulumi.RunError(
    "stack config is invalid (2 problems); nothing was deployed:\\n"
    "  - a.b = 1: too small. Fix: give 2 or more.\\n"
    "  - c = 'x': unknown. Fix: remove it."
)
"""


def test_a_config_error_is_shown_once_a_line_per_problem(folder: Path) -> None:
    """The program's error goes out once, when the run ends (the CLI's Diagnostics), whole:
    a line per problem, never cut to its first and last line, never also on stdout."""
    (folder / "__main__.py").write_text(CONFIG_REFUSED)
    done = engine(folder, "preview", "--stack", "dev")
    assert done.returncode == 1, done
    assert done.stderr.splitlines() == [
        "error: stack config is invalid (2 problems); nothing was deployed:",
        "  - a.b = 1: too small. Fix: give 2 or more.",
        "  - c = 'x': unknown. Fix: remove it.",
    ]
    assert "Fix:" not in done.stdout and "Traceback" not in done.stdout + done.stderr


BAD_FILES = [
    # (file, its bytes, what the one line names)
    ("Pulumi.dev.yaml", b"config:\n  mine:a: [1\n", "Pulumi.dev.yaml': line 3"),
    (
        "Pulumi.dev.yaml",
        b"config:\n  mine:head: a\n  mine:head: b\n",
        'mapping key "mine:head" already defined at line 2',
    ),
    ("Pulumi.dev.yaml", b"- config\n", "the top level is a list"),
    ("Pulumi.dev.yaml", b"config:\n  mine:a: \xff\n", "byte 0xff is not UTF-8"),
    ("Pulumi.dev.yaml", b"config: [1]\n", "its `config:` is a list"),
    ("Pulumi.yaml", b"name: [mine\n", "Pulumi.yaml': line 2"),
]


@pytest.mark.parametrize("operation", ["up", "preview", "refresh", "destroy"])
@pytest.mark.parametrize(("name", "content", "names"), BAD_FILES)
def test_a_broken_stack_or_project_file_is_one_line_exit_2_and_writes_nothing(
    folder: Path,
    operation: str,
    name: str,
    content: bytes,
    names: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (folder / name).write_bytes(content)
    before = sorted(folder.rglob("*"))
    done = in_process(folder, monkeypatch, capsys, operation, "--stack", "dev")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done
    assert len(lines) == 1 and names in lines[0] and "Fix:" in lines[0], lines
    assert sorted(folder.rglob("*")) == before


def test_a_state_folder_that_cannot_be_written_is_one_line_before_anything_runs(
    folder: Path,
) -> None:
    (folder / ".localengine").write_text("a file where the engine keeps its folder\n")
    done = engine(folder, "up", "--stack", "dev")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done
    last = done.stderr.strip().splitlines()[-1]
    assert "cannot be written" in last and "nothing was done" in last, last
    assert "LOCALENGINE_BACKEND_URL=file://DIR" in last


def test_a_config_too_large_for_the_programs_environment_names_its_key(folder: Path) -> None:
    """The language host passes the config in one environment variable (PULUMI_CONFIG);
    a value past Linux's 128 KiB for one is named, not `Argument list too long`."""
    (folder / "Pulumi.dev.yaml").write_text(f"config:\n  mine:notes: {'x' * 1_000_000}\n")
    done = engine(folder, "preview", "--stack", "dev")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done
    last = done.stderr.strip().splitlines()[-1]
    assert "mine:notes holds 1000002 bytes" in last and "Fix: shorten" in last, last
