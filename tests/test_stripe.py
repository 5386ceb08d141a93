"""One stream over several connections (probes/stripe.py; lib/bulk.sh stripe, as
lib/peer_ssh.sh stripe_to_peer calls it): the probe between named pipes on this machine,
then the bash function with `ssh` a stub that runs the far side's command here as sshd
would (nothing leaves this machine).

What it must do: give back exactly the bytes sent, in order, from a pipe or a file; write
them into a file after a kept prefix and print the sha256 of the whole; fail, never pass
on a short stream as whole, when a connection is cut; leave no pipe, socket or folder
behind; never let a control call eat the stream."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sparkvllm import scripts
from sparkvllm.probes import script

PROBE = script("stripe")
CHUNK = 1 << 20  # probes/stripe.py CHUNK
# Not a whole number of chunks, more than one round of three connections.
DATA = os.urandom(3 * CHUNK + CHUNK // 2 + 17)


def pipes(folder: Path, n: int) -> list[str]:
    folder.mkdir()
    out = []
    for i in range(n):
        os.mkfifo(folder / str(i))
        out.append(str(folder / str(i)))
    return out


def stripe(
    tmp_path: Path,
    data: bytes,
    n: int,
    carry: str = "cat",
    into: tuple[Path, int] | None = None,
    from_file: int | None = None,
    far_name: str = "far",
    python: str = sys.executable,
) -> tuple[int, int, list[int], bytes, str]:
    """`data` split into n pipes, each carried by `carry` (a shell filter; `cat` carries
    all) to its connection's end (`hand`), which hands it to the joiner; `carry` applies
    to connection 1 only. The joiner writes to stdout, or `into` (a file, the bytes to
    keep). `from_file`: the split reads `data` from a file, from that offset, not from a
    pipe. `far_name`: the joiner's folder. `python` runs every end. Returns the split's,
    the join's and the hands' exit codes, what the join wrote (its stdout) and every
    message."""
    here, far = pipes(tmp_path / "here", n), tmp_path / far_name
    far.mkdir()
    out = tmp_path / "out"
    extra = ["--into", str(into[0]), "--at", str(into[1])] if into else []
    join = subprocess.Popen(
        [python, "-c", PROBE, "join", str(far), *extra],
        stdout=out.open("wb"),
        stderr=subprocess.PIPE,
    )
    hands = [
        subprocess.Popen(
            [
                "bash",
                "-c",
                f'{carry if i == 1 else "cat"} < "$0" | exec "$1" -c "$2" hand "$3" {i} {n}',
                pipe,
                python,
                PROBE,
                str(far),
            ],
            stderr=subprocess.PIPE,
        )
        for i, pipe in enumerate(here)
    ]
    if from_file is None:
        split = subprocess.run(
            [python, "-c", PROBE, "split", *here], input=data, capture_output=True
        )
    else:
        source = tmp_path / "source"
        source.write_bytes(os.urandom(from_file) + data)
        with source.open("rb") as f:
            f.seek(from_file)
            split = subprocess.run(
                [python, "-c", PROBE, "split", *here], stdin=f, capture_output=True
            )
    said = [h.communicate(timeout=60)[1] for h in hands]
    _, err = join.communicate(timeout=60)
    return (
        split.returncode,
        join.returncode,
        [h.returncode for h in hands],
        out.read_bytes(),
        (split.stderr + err + b"".join(said)).decode(),
    )


def test_the_bytes_come_back_whole_and_in_order(tmp_path: Path, node_python: str) -> None:
    """On this test's python, and on the oldest a node's host may have."""
    split, join, hands, got, said = stripe(tmp_path, DATA, 3, python=node_python)
    assert (split, join, hands) == (0, 0, [0, 0, 0]), said
    assert got == DATA
    assert not (tmp_path / "far").exists()  # the joiner removed its socket and its folder


def test_a_file_is_sent_from_where_its_reader_stands(tmp_path: Path) -> None:
    split, join, hands, got, said = stripe(tmp_path, DATA, 3, from_file=12345)
    assert (split, join, hands) == (0, 0, [0, 0, 0]), said
    assert got == DATA


def test_a_folder_deeper_than_a_unix_socket_path_allows(tmp_path: Path) -> None:
    """A socket's path holds at most 108 bytes: both ends name it from inside its folder."""
    far = "f" * 120
    split, join, hands, got, said = stripe(tmp_path, DATA, 2, far_name=far)
    assert (split, join, hands) == (0, 0, [0, 0]), said
    assert got == DATA and not (tmp_path / far).exists()


def test_an_empty_stream_is_an_empty_stream(tmp_path: Path) -> None:
    assert stripe(tmp_path, b"", 2)[:4] == (0, 0, [0, 0], b"")


def test_into_a_file_after_its_kept_bytes_with_the_whole_files_sha256(
    tmp_path: Path, node_python: str
) -> None:
    part = tmp_path / "part"
    part.write_bytes(DATA[:1000] + b"bytes after the kept ones: written over")
    got = stripe(tmp_path, DATA[1000:], 2, into=(part, 1000), python=node_python)
    split, join, hands, printed, said = got
    assert (split, join, hands) == (0, 0, [0, 0]), said
    assert part.read_bytes() == DATA
    assert printed.decode().split() == [hashlib.sha256(DATA).hexdigest()]


def test_into_a_file_from_stdin(tmp_path: Path) -> None:
    part = tmp_path / "part"
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "join", "-", "--into", str(part), "--at", "0"],
        input=DATA,
        capture_output=True,
    )
    assert done.returncode == 0, done.stderr
    assert part.read_bytes() == DATA
    assert done.stdout.decode().split() == [hashlib.sha256(DATA).hexdigest()]


def test_a_file_shorter_than_the_bytes_to_keep_is_an_error(tmp_path: Path) -> None:
    part = tmp_path / "part"
    part.write_bytes(b"short")
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "join", "-", "--into", str(part), "--at", "100"],
        input=b"more",
        capture_output=True,
    )
    assert done.returncode == 1
    assert b"shorter than the 100 bytes" in done.stderr
    assert done.stdout == b""


def test_a_cut_connection_fails_every_end_and_the_stream_is_not_whole(tmp_path: Path) -> None:
    part = tmp_path / "part"
    split, join, hands, _, said = stripe(tmp_path, DATA, 3, carry="head -c 100000", into=(part, 0))
    assert split == 1 and join == 1 and hands == [1, 1, 1]
    # Which end notices first is a race: the sender gives up at the first connection it
    # cannot write to (the cut one, or one whose far end already ended with the joiner)
    # and ends at once, so another connection's end may see its own stream cut off first.
    # Every end fails either way (above), and each says so.
    assert re.search(r"here/\d: \[Errno 32\] Broken pipe", said), said
    assert re.search(r"connection \d: cut off \(\d+ of \d+ bytes\)", said), said
    written = part.read_bytes()
    assert len(written) < len(DATA) and DATA.startswith(written)  # a prefix: it resumes
    assert not (tmp_path / "far").exists()


def test_a_connection_whose_joiner_is_gone_gives_up(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "hand", str(tmp_path / "gone"), "0", "1"],
        input=b"x",
        capture_output=True,
        timeout=30,
    )
    assert done.returncode == 1
    assert b"no joiner" in done.stderr


# ssh: options up to `--`, the host, then the command, run here under a shell as sshd runs
# it, stdin read eagerly and passed on as ssh does (what the command leaves unread is gone).
# Each connection is logged. CUT=1: connection 1 (of 3) stops after 100000 bytes (a link
# that drops). REFUSED=1: connection 2 (of 3) never gets in (sshd refused it).
_SSH = """#!/bin/bash
while [ "$1" != -- ]; do shift; done
shift 2
printf '%s\\n' "$*" >> "$LOG"
if [ -n "${CUT:-}" ] && [[ "$*" == *" hand "*" 1 3" ]]; then
  head -c 100000 | bash -c "$*"; exit 255
fi
if [ -n "${REFUSED:-}" ] && [[ "$*" == *" hand "*" 2 3" ]]; then
  exit 255
fi
cat | bash -c "$*"
"""


def run_function(
    tmp_path: Path, n: int, data: bytes, cut: bool = False, into: str = "", refused: bool = False
) -> tuple[int, str]:
    """stripe_to_peer N (the library as a script renders it) sending `data` into `cat > OUT`
    on the "node", or (`into`) to a command line that joins the stream itself. Returns its
    exit code and its stderr."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "ssh").write_text(_SSH)
    (bin_ / "ssh").chmod(0o755)
    (tmp_path / "tmp").mkdir()
    libs = "\n".join(scripts.load(f"lib/{name}").body for name in ("quote", "bulk", "peer_ssh"))
    call = '"$INTO" joins' if into else '"cat > $(sq "$OUT")"'
    body = f'{libs}\nstripe_to_peer "$N" "$PROBE" {call}'
    env = {
        **os.environ,
        "PATH": f"{bin_}:{os.environ['PATH']}",
        "TMPDIR": str(tmp_path / "tmp"),
        "LOG": str(tmp_path / "ssh.log"),
        "OUT": str(tmp_path / "out"),
        "N": str(n),
        "PROBE": PROBE,
        "INTO": into,
        "PEER_PORT": "22",
        "PEER_USER": "spark",
        "TARGET_ADDRESS": "192.0.2.2",
        **({"CUT": "1"} if cut else {}),
        **({"REFUSED": "1"} if refused else {}),
    }
    done = subprocess.run(
        ["bash", "-c", f"SSH_OPTS=(); {body}"],
        input=data,
        env=env,
        capture_output=True,
        timeout=60,  # far below the joiner's and the connections' own wait (IDLE_S)
    )
    return done.returncode, done.stderr.decode()


def test_stripe_to_peer_carries_the_stream_over_n_connections(tmp_path: Path) -> None:
    rc, said = run_function(tmp_path, 3, DATA)
    assert rc == 0, said
    assert (tmp_path / "out").read_bytes() == DATA
    # (Counted in the whole log: the joiner's long call may be written in pieces while the
    # connections append theirs.)
    calls = (tmp_path / "ssh.log").read_text()
    assert calls.count(f"' hand '{tmp_path}/tmp/tmp.") == 3
    assert calls.count(f"' join '{tmp_path}/tmp/tmp.") == 1  # the joiner
    assert os.listdir(tmp_path / "tmp") == []  # no pipe or folder left on either end


def test_a_command_that_joins_the_stream_itself_gets_where_it_comes_from(
    tmp_path: Path,
) -> None:
    part = tmp_path / "part"
    # (The far side's $PROBE: the stub's shell has this test's environment.)
    joiner = f'python3 -c "$PROBE" join "$1" --into {part} --at 0'
    rc, said = run_function(tmp_path, 3, DATA, into=f"f() {{ {joiner}; }}; f")
    assert rc == 0, said
    assert part.read_bytes() == DATA
    assert os.listdir(tmp_path / "tmp") == []


def test_a_connection_that_never_gets_in_fails_the_transfer_at_once(tmp_path: Path) -> None:
    """One of three connections is refused: the sender ends the others and removes the
    joiner's folder, so the joiner stops waiting for it (within the run's 60 s, not after
    IDLE_S; the joiner may find its folder gone before or after it listens)."""
    rc, said = run_function(tmp_path, 3, DATA, refused=True)
    assert rc != 0
    assert "/2: [Errno 32] Broken pipe" in said  # the refused connection's pipe, named
    assert not (tmp_path / "out").exists() or (tmp_path / "out").read_bytes() != DATA
    assert os.listdir(tmp_path / "tmp") == []


def test_a_joiner_that_fails_to_start_fails_the_transfer_at_once(tmp_path: Path) -> None:
    """The joining command fails before any connection is handed in: the connections find
    its folder gone and give up, long before the joiner's wait (IDLE_S) would."""
    rc, said = run_function(tmp_path, 3, DATA, into="false")
    assert rc != 0
    assert "no joiner" in said
    assert os.listdir(tmp_path / "tmp") == []


def test_one_stream_is_the_plain_stream(tmp_path: Path) -> None:
    rc, said = run_function(tmp_path, 1, DATA)
    assert rc == 0, said
    assert (tmp_path / "out").read_bytes() == DATA
    assert (tmp_path / "ssh.log").read_text().splitlines() == [f"cat > '{tmp_path}/out'"]


def test_a_dropped_connection_fails_the_transfer(tmp_path: Path) -> None:
    rc, said = run_function(tmp_path, 3, DATA, cut=True)
    assert rc != 0
    assert (tmp_path / "out").read_bytes() != DATA
    assert ": cut off (" in said  # the joiner saw a connection end before its end mark
    assert os.listdir(tmp_path / "tmp") == []


@pytest.mark.parametrize(
    "argv",
    [[], ["split"], ["copy", "a"], ["hand", "f", "x", "2"], ["join", "-", "--into", "f"]],
)
def test_bad_arguments_exit_2(argv: list[str]) -> None:
    assert subprocess.run([sys.executable, "-c", PROBE, *argv]).returncode == 2
