"""The weights copy (sparkvllm/scripts/weights_sync.sh, as specs/weights.py weights_sync
renders it) run for real under bash between two "nodes" on this machine: each is a mount
namespace in which the model's HF cache path is bound to a folder of its own, and `ssh` is
a stub that enters the target's. No ssh, no network.

What it must do: move only the blobs the target lacks, resume a blob cut off mid-copy
from where it stopped, check every blob by content (sha256 for LFS files, git sha1 for the
others) before it takes its name, refuse to start without the disk space (node, need,
have), and send nothing when the copies already agree.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sparkvllm.config import StackConfig, load_stack_config
from sparkvllm.specs import weights
from sparkvllm.specs.output import key_values

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare (util-linux) for the two mount namespaces",
)

REVISION = "0123456789abcdef0123456789abcdef01234567"
SHARD = os.urandom(3 * 1024 * 1024 + 17)  # an LFS file: its blob is named by sha256
CONFIG = b'{"architectures": ["Qwen3_5MoeForConditionalGeneration"]}'  # a git-sha1 blob


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def write_model(cache: Path, cfg: StackConfig) -> dict[str, Path]:
    """The HF cache layout of `cfg.model` under `cache`: named blobs, snapshot links, refs.
    Returns each file's blob path."""
    repo = cache / "hub" / f"models--{cfg.model.id.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / REVISION
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    out = {}
    for file, data, name in [
        ("model.safetensors", SHARD, hashlib.sha256(SHARD).hexdigest()),
        ("config.json", CONFIG, git_sha1(CONFIG)),
    ]:
        (repo / "blobs" / name).write_bytes(data)
        (snap / file).symlink_to(f"../../blobs/{name}")
        out[file] = repo / "blobs" / name
    return out


class TwoNodes:
    """`head` and `target` folders, each seen at the model's hf_cache path in its own
    mount namespace."""

    def __init__(self, tmp_path: Path, raw: dict[str, Any]) -> None:
        self.cache = tmp_path / "hf"  # the path both "nodes" use
        self.head, self.target = tmp_path / "head", tmp_path / "target"
        for d in (self.cache, self.head, self.target):
            d.mkdir()
        raw = {**raw, "model": {**raw["model"], "hf_cache": str(self.cache)}}
        self.cfg = load_stack_config(raw)
        self.blobs = write_model(self.head, self.cfg)
        self.tmp = tmp_path / "tmp"  # TMPDIR on both "nodes"
        self.tmp.mkdir()
        self.enter = tmp_path / "enter"
        # enter DIR CMD: run CMD (a shell string) with DIR bound at the cache path.
        self.enter.write_text(
            '#!/bin/bash\nmount --bind "$1" ' + str(self.cache) + ' && exec bash -c "$2"\n'
        )
        self.enter.chmod(0o755)

    def target_blob(self, file: str) -> Path:
        return self.target / self.blobs[file].relative_to(self.head)

    def copy(
        self,
        target_mount: str | None = None,
        cores: int | None = None,
        python: bool = True,
        target_cores: int | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """The step's script on the head; `ssh` enters the target (each call is logged, one
        short line each, in ssh.log: `own` for a connection of its own (-S none) or
        `shared`, then the command's last 200 characters). `target_mount` replaces the
        target folder's bind (e.g. a small tmpfs); `cores`: what `nproc` says (GNU nproc reads
        OMP_NUM_THREADS) on the head, and on the target unless `target_cores` says;
        `python` False: the target has no python3 (a function of that name that fails,
        exported ahead of every command there)."""
        into = target_mount or f"{self.enter} {self.target}"
        there = "" if python else "python3() { return 127; }; export -f python3; "
        if target_cores:
            there += f"export OMP_NUM_THREADS={target_cores}; "
        command = f'"{there}$*"'
        stub = self.enter.parent / "bin" / "ssh"
        stub.parent.mkdir(exist_ok=True)
        # Options up to `--` (a control call, -O exit, does nothing), the host, then the
        # command words, run as sshd runs them: joined, under a shell, on the target.
        stub.write_text(
            "#!/bin/bash\n"
            "via=shared\n"
            'while [ "$1" != -- ]; do\n'
            '  [ "$1" = -O ] && exit 0; [ "$1 ${2:-}" = "-S none" ] && via=own; shift\n'
            "done\n"
            "shift 2; c=\"${*//$'\\n'/ }\"\n"
            f'echo "$via ${{c: -200}}" >> {self.enter.parent}/ssh.log\n'
            f"exec unshare -m {into} {command}\n"
        )
        stub.chmod(0o755)
        spec = weights.weights_sync(self.cfg, self.cfg.nodes[1], None)
        env = {
            **os.environ,
            **dict(spec.env),
            "PATH": f"{stub.parent}:{os.environ['PATH']}",
            "TMPDIR": str(self.tmp),
        }
        if cores:
            env["OMP_NUM_THREADS"] = str(cores)
        return subprocess.run(
            ["unshare", "-m", str(self.enter), str(self.head), spec.create],
            input="TEST-ONLY KEY\n",
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )


@pytest.fixture
def nodes(tmp_path: Path, spark_raw: dict[str, Any]) -> TwoNodes:
    return TwoNodes(tmp_path, spark_raw)


def ok(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    assert result.returncode == 0, result.stderr
    return key_values(result.stdout)


def test_a_first_copy_moves_every_blob_and_the_target_reads_the_same(nodes: TwoNodes) -> None:
    out = ok(nodes.copy())
    assert out["transferred"] == "1"
    assert int(out["sent"]) == len(SHARD) + len(CONFIG)
    assert nodes.target_blob("model.safetensors").read_bytes() == SHARD
    snap = nodes.target / "hub" / nodes.blobs["config.json"].parent.parent.name / "snapshots"
    assert (snap / REVISION / "config.json").read_bytes() == CONFIG  # the links came too
    again = ok(nodes.copy())
    assert again["transferred"] == "0" and again["sent"] == "0"
    assert again["manifest"] == out["manifest"]


def test_an_interrupted_copy_resumes_where_it_stopped(nodes: TwoNodes) -> None:
    ok(nodes.copy())
    blob = nodes.target_blob("model.safetensors")
    cut = 1024 * 1024 + 5
    blob.unlink()
    Path(f"{blob}{weights.PART}").write_bytes(SHARD[:cut])  # a copy cut off mid-blob

    out = ok(nodes.copy())

    assert int(out["sent"]) == len(SHARD) - cut  # only the remainder
    assert blob.read_bytes() == SHARD and not Path(f"{blob}{weights.PART}").exists()


def test_a_target_without_python3_gets_the_same_copy_and_resumes(nodes: TwoNodes) -> None:
    """No python3 there: each blob goes through tee to sha256 (the plain stream), a part
    resumes the same way, and every blob is checked before it is named."""
    first = ok(nodes.copy(cores=4, python=False))
    assert nodes.target_blob("model.safetensors").read_bytes() == SHARD
    assert "' hand '/" not in (nodes.enter.parent / "ssh.log").read_text()
    blob = nodes.target_blob("model.safetensors")
    blob.unlink()
    Path(f"{blob}{weights.PART}").write_bytes(SHARD[:12345])

    out = ok(nodes.copy(python=False))

    assert int(out["sent"]) == len(SHARD) - 12345
    assert blob.read_bytes() == SHARD
    assert out["manifest"] == first["manifest"]


def test_one_big_blob_goes_over_several_connections_and_arrives_whole(
    nodes: TwoNodes,
) -> None:
    """Fewer blobs than streams: the shard over 4 connections at once (the head's 4 cores),
    put back in order on the target, checked and named as any other."""
    ok(nodes.copy())
    blob = nodes.target_blob("model.safetensors")
    blob.unlink()
    log = nodes.enter.parent / "ssh.log"
    log.unlink()

    out = ok(nodes.copy(cores=4, target_cores=8))

    assert int(out["sent"]) == len(SHARD)
    assert blob.read_bytes() == SHARD
    assert log.read_text().count("' hand '/") == 4
    assert list(nodes.tmp.iterdir()) == []  # no pipe, socket, key or folder left on either


def test_a_small_blob_beside_the_shard_takes_none_of_its_connections(nodes: TwoNodes) -> None:
    """A first copy of the shard and the config, 2 streams: the shard over both, the
    config (a few bytes) over the step's shared connection: no handshake of its own."""
    log = nodes.enter.parent / "ssh.log"

    out = ok(nodes.copy(cores=2, target_cores=4))

    assert out["transferred"] == "1" and out["streams"] == "2"
    assert nodes.target_blob("model.safetensors").read_bytes() == SHARD
    assert nodes.target_blob("config.json").read_bytes() == CONFIG
    own = [line for line in log.read_text().splitlines() if line.startswith("own ")]
    assert len(own) == 2 and all("' hand '/" in line for line in own)


def test_streams_are_half_the_targets_cores(nodes: TwoNodes) -> None:
    """The target deciphers, writes and hashes every byte: a head of 4 cores copying to a
    target of 2 sends the shard over one connection, not four."""
    log = nodes.enter.parent / "ssh.log"

    out = ok(nodes.copy(cores=4, target_cores=2))

    assert out["streams"] == "1"
    assert nodes.target_blob("model.safetensors").read_bytes() == SHARD
    own = [line for line in log.read_text().splitlines() if line.startswith("own ")]
    assert len(own) == 1 and "' hand '/" not in log.read_text()
    assert own[0].endswith(" -")  # the plain stream, taken from stdin


def test_a_blob_whose_bytes_do_not_match_its_name_is_never_named(nodes: TwoNodes) -> None:
    """A part whose first bytes are wrong: the resumed copy fails its checksum on the
    target, is dropped, and the error says the link (the head's copy is good)."""
    ok(nodes.copy())
    blob = nodes.target_blob("model.safetensors")
    blob.unlink()
    Path(f"{blob}{weights.PART}").write_bytes(b"\0" * 4096)

    failed = nodes.copy()

    assert failed.returncode == 1
    assert "arrived corrupt on spark-2 (the head's copy is good)" in failed.stderr
    assert blob.name in failed.stderr
    assert not blob.exists() and not Path(f"{blob}{weights.PART}").exists()
    assert int(ok(nodes.copy())["sent"]) == len(SHARD)  # the next run sends it whole


def test_a_corrupt_blob_on_the_head_is_named_as_the_heads(nodes: TwoNodes) -> None:
    head_blob = nodes.blobs["config.json"]
    head_blob.write_bytes(CONFIG.replace(b"Qwen", b"Qwem"))  # same size, other content

    failed = nodes.copy()

    assert failed.returncode == 1
    assert "on spark-1 does not match its name (its checksum): the head's copy is corrupt" in (
        failed.stderr
    )
    assert str(nodes.cache / head_blob.relative_to(nodes.head)) in failed.stderr  # its path there
    assert not nodes.target_blob("config.json").exists()


def test_a_target_without_the_space_is_refused_before_a_byte_moves(nodes: TwoNodes) -> None:
    small = f"{nodes.enter}-tmpfs"
    Path(small).write_text(
        "#!/bin/bash\nmount -t tmpfs -o size=1m tmpfs "
        + str(nodes.cache)
        + ' && exec bash -c "$1"\n'
    )
    os.chmod(small, 0o755)

    failed = nodes.copy(target_mount=small)

    assert failed.returncode == 1
    line = failed.stderr.strip().splitlines()[-1]
    assert line.startswith(f"not enough disk on spark-2 for {nodes.cfg.model.id}: ")
    assert "needs 3.1 MB, has 1.0 MB; fix: free space there" in line


def test_several_blobs_move_at_once_and_one_bad_one_stops_only_itself(
    nodes: TwoNodes,
) -> None:
    """Six more shards: they go several at a time (as many as the head's cores and half
    the target's, at most MAX_STREAMS), each over a session of its own; one whose part
    starts wrong fails its own check, the others are taken, and the next run sends only that one."""
    repo = nodes.blobs["model.safetensors"].parent.parent
    shards = {}
    for i in range(6):
        data = os.urandom(512 * 1024 + i)
        name = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / name).write_bytes(data)
        (repo / "snapshots" / REVISION / f"extra-{i}.safetensors").symlink_to(f"../../blobs/{name}")
        shards[name] = data
    out = ok(nodes.copy(cores=4, target_cores=8))
    assert out["streams"] == str(min(4, weights.MAX_STREAMS))
    target_blobs = nodes.target_blob("model.safetensors").parent
    assert all((target_blobs / n).read_bytes() == d for n, d in shards.items())

    bad, good = sorted(shards)[:2]
    (target_blobs / bad).unlink()
    (target_blobs / good).unlink()
    Path(f"{target_blobs / bad}{weights.PART}").write_bytes(b"\1" * 1000)
    failed = nodes.copy()
    assert failed.returncode == 1
    said = "arrived corrupt on spark-2 (the head's copy is good); fix: re-run `up`"
    assert said in failed.stderr and f"check the cluster link: {bad}" in failed.stderr
    # The bad one has the least left to send, so it goes last: the others were taken.
    assert (target_blobs / good).read_bytes() == shards[good]
    again = ok(nodes.copy())
    assert int(again["sent"]) == len(shards[bad])
