"""The tools at their edges, run as a user runs them (`python -m sparkvllm.workstation`,
`.drift`, `.diagnose`): a stack file that cannot be used, a read-only HOME, a bad `--out`.
Each answers in a few lines whose last names the file, line, field or flag and the fix,
exits 2, shows no traceback (unless --debug) and writes nothing. The nodes are at TEST-NET
addresses (192.0.2.x) and every case stops before any ssh."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkvllm.config import ConfigError
from sparkvllm.config_sources import from_stack_file, stack_file_raw
from tests.conftest import TEST_PRIVATE_KEY, stack_file

TOOLS = ("workstation", "drift", "diagnose")
PROJECT = "edge-project"


def good_config(key_file: str = "id_test") -> dict[str, Any]:
    """The spark stack's config on TEST-NET nodes, its key a file beside it."""
    raw = copy.deepcopy(stack_file("spark"))
    for i, node in enumerate(raw["nodes"]):
        node["ssh"]["host"] = f"192.0.2.{10 + i}"
    raw.pop("ssh_private_key", None)
    raw["ssh_private_key_file"] = key_file
    return {"config": {f"spark-vllm:{k}": v for k, v in raw.items()}}


def project(folder: Path, stack_text: bytes | None = None) -> Path:
    """A project folder: Pulumi.yaml, Pulumi.dev.yaml (`stack_text`, else a good one), the
    key file."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Pulumi.yaml").write_text(f"name: {PROJECT}\nruntime: python\n")
    (folder / "id_test").write_text(TEST_PRIVATE_KEY)
    text = stack_text if stack_text is not None else yaml.safe_dump(good_config()).encode()
    (folder / "Pulumi.dev.yaml").write_bytes(text)
    return folder


def tool_env(home: Path) -> dict[str, str]:
    """A user's environment: HOME its own, the default state folder, no Pulumi CLI on PATH
    (the tools then read the stack file)."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPARKVLLM_STATE_DIR", "PATH")}
    return {**env, "HOME": str(home), "PATH": str(Path(sys.executable).parent)}


def run_tool(tool: str, *args: str, env: dict[str, str], prefix: tuple[str, ...] = ()) -> Any:
    argv = [*prefix, sys.executable, "-m", f"sparkvllm.{tool}", "--stack", "dev", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


BAD_STACK_FILES = {
    "broken YAML": (b"config:\n  spark-vllm:nodes: [\n", ["line 3", "correct the YAML"]),
    "a top-level list": (
        b"- config\n- nodes\n",
        ["the top level is a list; it must be a mapping with a `config:` key", "Fix:"],
    ),
    "bytes that are not UTF-8": (
        b"config:\n  spark-vllm:head: spark\xff-1\n",
        ["line 2: byte 0xff is not UTF-8", "Fix: save it as UTF-8"],
    ),
    "a key given twice": (
        b"config:\n  spark-vllm:head: spark-1\n  spark-vllm:head: spark-2\n",
        ['line 3, column 3: mapping key "spark-vllm:head" already defined at line 2', "Fix:"],
    ),
    "config: not a mapping": (b"config: [a, b]\n", ["its `config:` is a list", "Fix:"]),
    "a secret only the CLI decrypts": (
        b"config:\n  spark-vllm:ssh_private_key:\n    secure: AAABAKr0Yq1N\n",
        ["ssh_private_key = '[secret]': is a Pulumi secret", "ssh_private_key_file"],
    ),
}


@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize("case", BAD_STACK_FILES, ids=str)
def test_a_stack_file_that_cannot_be_used(tool: str, case: str, tmp_path: Path) -> None:
    text, told = BAD_STACK_FILES[case]
    folder = project(tmp_path / "project", text)
    home = tmp_path / "home"
    home.mkdir()
    before = files_under(tmp_path)
    done = run_tool(tool, "--cwd", str(folder), env=tool_env(home))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "Pulumi.dev.yaml" in last or "ssh_private_key" in last, last
    for part in told:
        assert part in last, last
    assert "AAABAKr0Yq1N" not in done.stderr  # not even a secret's ciphertext
    assert len(done.stderr.strip().splitlines()) <= 3, done.stderr
    assert files_under(tmp_path) == before


def test_debug_shows_the_traceback_with_the_same_answer(tmp_path: Path) -> None:
    text, _ = BAD_STACK_FILES["broken YAML"]
    folder = project(tmp_path / "project", text)
    done = run_tool("drift", "--cwd", str(folder), "--debug", env=tool_env(tmp_path))
    assert done.returncode == 2
    assert "Traceback" in done.stderr
    assert "line 3" in done.stderr.strip().splitlines()[-1]


def read_only(folder: Path) -> tuple[str, ...]:
    """The argv prefix that runs a command with `folder` read-only: a read-only bind mount
    in a mount namespace of its own for root (whom permissions do not stop), else the
    permissions themselves."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return ()
    unshare, mount, sh = (shutil.which(t) for t in ("unshare", "mount", "sh"))
    if unshare is None or mount is None or sh is None:
        pytest.skip("needs unshare and mount (util-linux) to make a folder read-only for root")
    script = f'{mount} --bind "$1" "$1" && {mount} -o remount,bind,ro "$1" && shift && exec "$@"'
    return (unshare, "-rm", sh, "-c", script, "sh", str(folder))


@pytest.mark.parametrize("tool", TOOLS)
def test_a_read_only_home(tool: str, tmp_path: Path) -> None:
    folder = project(tmp_path / "project")
    home = tmp_path / "home"
    home.mkdir()
    done = run_tool(
        tool, "--cwd", str(folder), env=tool_env(home), prefix=read_only(home)
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert f"state folder = '~/.cache/spark-vllm/{PROJECT}/dev'" in last, last
    assert f"cannot write {home}/.cache" in last, last
    assert "Fix: make it writable (it is under HOME), or point SPARKVLLM_STATE_DIR" in last
    assert list(home.iterdir()) == []


@pytest.mark.parametrize("where", ["a file", "a read-only folder", "under a file"])
def test_diagnose_out_that_cannot_take_the_tarball(where: str, tmp_path: Path) -> None:
    folder = project(tmp_path / "project")
    home = tmp_path / "home"
    home.mkdir()
    prefix: tuple[str, ...] = ()
    if where == "a file":
        out = tmp_path / "report.tar.gz"
        out.write_text("kept")
    elif where == "under a file":
        (tmp_path / "report").write_text("kept")
        out = tmp_path / "report" / "sub"
    else:
        out = tmp_path / "ro"
        out.mkdir()
        prefix = read_only(out)
    before = files_under(tmp_path)
    done = run_tool("diagnose", "--cwd", str(folder), "--out", str(out), env=tool_env(home),
                    prefix=prefix)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert f"--out {out}" in last and "fix: give a folder" in last, last
    assert files_under(tmp_path) == before  # no key files either: refused first


def test_the_workstation_writes_under_the_project_and_the_stack(tmp_path: Path) -> None:
    folder = project(tmp_path / "project")
    home = tmp_path / "home"
    done = run_tool("workstation", "--cwd", str(folder), env=tool_env(home))
    assert done.returncode == 0, done.stderr
    state = home / ".cache" / "spark-vllm" / PROJECT / "dev"
    assert sorted(p.name for p in state.iterdir()) == [
        "id", "known_hosts", "known_hosts.spark-1", "known_hosts.spark-2"
    ]  # fmt: skip
    assert f"workstation: {state} holds id," in done.stdout
    # A state deployed before names ~/.cache/spark-vllm/<stack>: on this fresh machine it
    # is a link to the new folder, so its first refresh finds the files.
    earlier = home / ".cache" / "spark-vllm" / "dev"
    assert earlier.is_symlink() and earlier.resolve() == state.resolve()
    (earlier.parent / "other").mkdir()  # another's folder of before is never touched
    again = run_tool("workstation", "--cwd", str(folder), env=tool_env(home))
    assert again.returncode == 0 and earlier.resolve() == state.resolve(), again.stderr


# The loader every reader of a stack file uses (sparkvllm/config_sources.py), below the
# tools: the file and line in the message, as the Pulumi CLI's YAML parser refuses.
LOADED = {
    "nested key twice": (
        "config:\n  spark-vllm:nodes:\n    - name: a\n      ssh: {host: h, host: i}\n",
        'line 4, column 22: mapping key "host" already defined at line 4',
    ),
    "a tab": ("config:\n\tspark-vllm:head: a\n", "line 2, column 1: found character '\\t'"),
    "a control character": ('config: {a: "\x07"}\n', "line 1: the control character U+0007"),
}


@pytest.mark.parametrize("case", LOADED, ids=str)
def test_the_stack_file_loader_names_the_file_and_line(case: str, tmp_path: Path) -> None:
    text, told = LOADED[case]
    (tmp_path / "Pulumi.x.yaml").write_text(text)
    with pytest.raises(ConfigError) as e:
        stack_file_raw("x", tmp_path)
    last = str(e.value).splitlines()[-1]
    assert f"stack file = '{tmp_path}/Pulumi.x.yaml': {told}" in last, last
    assert "<unicode string>" not in str(e.value)


def test_a_merge_key_override_is_not_a_duplicate(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.x.yaml").write_text(
        "base: &b {host: h, user: u}\nconfig:\n  spark-vllm:ssh: {<<: *b, host: i}\n"
    )
    assert stack_file_raw("x", tmp_path) == {"ssh": {"host": "i", "user": "u"}}


def test_a_secret_inside_a_map_is_named(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.x.yaml").write_text(
        "config:\n  spark-vllm:ssh_private_keys:\n    spark-2:\n      secure: AAAB\n"
    )
    with pytest.raises(ConfigError) as e:
        from_stack_file("x", tmp_path)
    assert (
        str(e.value)
        .splitlines()[-1]
        .endswith(
            "Fix: run this where the Pulumi CLI is installed, or without it name each node's key "
            "file in nodes[].ssh.private_key_file."
        )
    )


def test_with_the_pulumi_cli_its_refusal_is_one_line(tmp_path: Path) -> None:
    """Where the CLI is installed the tools read the config through it (a stand-in here,
    which refuses as the CLI does for a stack it does not know); a broken stack file is
    named by our loader first, as without the CLI."""
    folder = project(tmp_path / "project")
    home = tmp_path / "home"
    cli = tmp_path / "bin" / "pulumi"
    cli.parent.mkdir()
    cli.write_text("#!/bin/sh\necho \"error: no stack named 'dev' found\" >&2\nexit 255\n")
    cli.chmod(0o755)
    env = {**tool_env(home), "PATH": f"{cli.parent}{os.pathsep}{Path(sys.executable).parent}"}
    done = run_tool("drift", "--cwd", str(folder), env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "  - stack = 'dev': `pulumi config` failed: error: no stack named 'dev' found. Fix: "
        "correct what it names (it reads Pulumi.yaml, the stack file and the stack's backend)."
    )
    (folder / "Pulumi.dev.yaml").write_bytes(BAD_STACK_FILES["a key given twice"][0])
    done = run_tool("drift", "--cwd", str(folder), env=env)
    assert done.returncode == 2
    assert "already defined at line 2" in done.stderr.strip().splitlines()[-1]
    assert not home.exists()
