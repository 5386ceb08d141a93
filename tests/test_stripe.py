"""One stream over several connections (probes/stripe.py; lib/bulk.sh stripe, as
lib/peer_ssh.sh stripe_to_peer calls it): the probe between named pipes on this machine,
then the bash function with `ssh` a stub that runs the far side's command here as sshd
would (nothing leaves this machine).

What it must do: give back exactly the bytes sent, in order; fail, never pass on a short
stream as whole, when a connection is cut; leave no named pipe or folder behind; never
let a control call eat the stream."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkvllm import scripts
from sparkvllm.probes import script

PROBE = script("stripe")
CHUNK = 4 << 20
# Not a whole number of chunks, more than one round of three pipes.
DATA = os.urandom(3 * CHUNK + CHUNK // 2 + 17)


def pipes(folder: Path, n: int) -> list[str]:
    folder.mkdir()
    out = []
    for i in range(n):
        os.mkfifo(folder / str(i))
        out.append(str(folder / str(i)))
    return out


def stripe(tmp_path: Path, data: bytes, n: int, carry: str = "cat") -> tuple[int, int, bytes, str]:
    """`data` split into n pipes, each carried by `carry` (a shell filter; `cat` carries all)
    to the joiner. Returns the split's and the join's exit codes, what the join wrote and
    both their messages."""
    here, far = pipes(tmp_path / "here", n), pipes(tmp_path / "far", n)
    out = tmp_path / "out"
    join = subprocess.Popen(
        [sys.executable, "-c", PROBE, "join", *far],
        stdout=out.open("wb"),
        stderr=subprocess.PIPE,
    )
    carriers = [
        subprocess.Popen(["bash", "-c", f'{carry if i == 1 else "cat"} < "$0" > "$1"', a, b])
        for i, (a, b) in enumerate(zip(here, far, strict=True))
    ]
    split = subprocess.run(
        [sys.executable, "-c", PROBE, "split", *here], input=data, capture_output=True
    )
    for c in carriers:
        c.wait(timeout=60)
    _, err = join.communicate(timeout=60)
    return split.returncode, join.returncode, out.read_bytes(), (split.stderr + err).decode()


def test_the_bytes_come_back_whole_and_in_order(tmp_path: Path) -> None:
    split, join, got, _ = stripe(tmp_path, DATA, 3)
    assert (split, join) == (0, 0)
    assert got == DATA
    assert not (tmp_path / "far").exists()  # the joiner removed its pipes and their folder


def test_an_empty_stream_is_an_empty_stream(tmp_path: Path) -> None:
    assert stripe(tmp_path, b"", 2)[:3] == (0, 0, b"")


def test_a_cut_connection_fails_both_ends_and_the_stream_is_not_whole(tmp_path: Path) -> None:
    split, join, got, said = stripe(tmp_path, DATA, 3, carry="head -c 100000")
    assert split == 1 and join == 1
    assert len(got) < len(DATA)
    assert "cut off" in said and "far/1" in said
    assert not (tmp_path / "far").exists()


# ssh: options up to `--`, the host, then the command, run here under a shell as sshd runs
# it, stdin read eagerly and passed on as ssh does (what the command leaves unread is gone).
# Each connection is logged. CUT=1: the connection carrying pipe 1 stops after 100000
# bytes (a link that drops).
_SSH = """#!/bin/bash
while [ "$1" != -- ]; do shift; done
shift 2
printf '%s\\n' "$*" >> "$LOG"
if [ -n "${CUT:-}" ] && [[ "$*" == "exec cat > "*"/1'" ]]; then
  head -c 100000 | bash -c "${*#exec }"; exit 255
fi
cat | bash -c "$*"
"""


def run_function(tmp_path: Path, n: int, data: bytes, cut: bool = False) -> tuple[int, str]:
    """stripe_to_peer N (the library as a script renders it) sending `data` into `cat > OUT`
    on the "node". Returns its exit code and its stderr."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "ssh").write_text(_SSH)
    (bin_ / "ssh").chmod(0o755)
    (tmp_path / "tmp").mkdir()
    libs = "\n".join(scripts.load(f"lib/{name}").body for name in ("quote", "bulk", "peer_ssh"))
    body = f'{libs}\nstripe_to_peer "$N" "$PROBE" "cat > $(sq "$OUT")"'
    env = {
        **os.environ,
        "PATH": f"{bin_}:{os.environ['PATH']}",
        "TMPDIR": str(tmp_path / "tmp"),
        "LOG": str(tmp_path / "ssh.log"),
        "OUT": str(tmp_path / "out"),
        "N": str(n),
        "PROBE": PROBE,
        "PEER_PORT": "22",
        "PEER_USER": "spark",
        "TARGET_ADDRESS": "192.0.2.2",
        **({"CUT": "1"} if cut else {}),
    }
    done = subprocess.run(
        ["bash", "-c", f"SSH_OPTS=(); {body}"], input=data, env=env, capture_output=True
    )
    return done.returncode, done.stderr.decode()


def test_stripe_to_peer_carries_the_stream_over_n_connections(tmp_path: Path) -> None:
    rc, said = run_function(tmp_path, 3, DATA)
    assert rc == 0, said
    assert (tmp_path / "out").read_bytes() == DATA
    # (Counted in the whole log: the joiner's long call may be written in pieces while the
    # connections append theirs.)
    calls = (tmp_path / "ssh.log").read_text()
    assert calls.count("exec cat > '/") == 3
    assert calls.count("' join '/") == 1  # the joiner
    assert os.listdir(tmp_path / "tmp") == []  # no pipe or folder left on either end


def test_one_stream_is_the_plain_stream(tmp_path: Path) -> None:
    rc, said = run_function(tmp_path, 1, DATA)
    assert rc == 0, said
    assert (tmp_path / "out").read_bytes() == DATA
    assert (tmp_path / "ssh.log").read_text().splitlines() == [f"cat > '{tmp_path}/out'"]


def test_a_dropped_connection_fails_the_transfer(tmp_path: Path) -> None:
    rc, said = run_function(tmp_path, 3, DATA, cut=True)
    assert rc != 0
    assert (tmp_path / "out").read_bytes() != DATA
    assert "cut off" in said
    assert os.listdir(tmp_path / "tmp") == []


@pytest.mark.parametrize("argv", [[], ["split"], ["copy", "a"]])
def test_bad_arguments_exit_2(argv: list[str]) -> None:
    assert subprocess.run([sys.executable, "-c", PROBE, *argv]).returncode == 2
