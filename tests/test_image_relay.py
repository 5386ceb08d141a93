"""The image relay's real script (sparkvllm/specs/commands.py image_relay) on four nodes
made of folders: `ssh` is a stub that runs the remote command as sshd would, as the node
it names (nothing leaves this machine), refusing a hop that has neither a key file nor a
forwarded agent; `docker` is a stub that keeps each node's image as a file (`save` prints
it: a real save archive; `load` takes what arrives as Docker does, refusing an archive
without a layer the node does not hold; the fingerprint is the sha256 of the image's
bytes). ssh-agent, ssh-add and the layer filter (probes/image_layers.py) are the real ones."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from sparkvllm.config import StackConfig, load_stack_config
from sparkvllm.specs import commands
from tests.conftest import TEST_PRIVATE_KEY, four_node_raw


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A real (throwaway) private key: ssh-add takes nothing else."""
    path = tmp_path_factory.mktemp("key") / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.read_text()


# ssh: options up to `--`, then the host, then the command words, run as sshd runs them
# (joined, under a shell) as that node. A hop with no -i authenticates with the agent:
# refused unless one is forwarded (SSH_AUTH_SOCK set and answering) and ForwardAgent=yes
# passes it on. Every call is logged as `from -> to options... | command's first line`.
# NO_ROUTE=`from>to`: a link that is down.
_SSH = """#!/bin/bash
opts=()
while [ "$1" != -- ]; do opts+=("$1"); shift; done
host=$2; shift 2
cmd=$*
printf '%s -> %s %s | %s\\n' "$NODE" "$host" "${opts[*]}" "${cmd%%$'\\n'*}" >> "$STATE/ssh.log"
[ "$NODE>$host" != "${NO_ROUTE:-}" ] || { echo "ssh: connect to $host: no route" >&2; exit 255; }
case " ${opts[*]} " in
  *" IdentityFile="*) ;;
  *) ssh-add -l >/dev/null 2>&1 || { echo "ssh: $host: no key, no agent" >&2; exit 255; };;
esac
case " ${opts[*]} " in *" ForwardAgent=yes "*) ;; *) unset SSH_AUTH_SOCK;; esac
NODE=$host exec bash -c "$*"
"""

# docker: the node's image is the file $STATE/<node>/image, its layers $STATE/<node>/layers.
# Each load is logged with the bytes that arrived.
_DOCKER = """#!/bin/bash
d=$STATE/$NODE
case "$*" in
  "save "*) echo "$NODE save" >> "$STATE/docker.log"; exec cat "$d/image";;
  load) mkdir -p "$d"; cat > "$d/in.part"
        echo "$NODE load $(stat -c %s "$d/in.part")" >> "$STATE/docker.log"
        python3 "$STATE/load_check.py" "$d/in.part" "$STATE/head/layers" "$d/layers" ||
          { rm -f "$d/in.part"; exit 1; }
        rm -f "$d/in.part"; cp "$STATE/head/image" "$d/image"
        cp "$STATE/head/layers" "$d/layers"; exit;;
  "info -f {{.DockerRootDir}}") echo "$d";;
  "image ls -q") [ ! -f "$d/layers" ] || echo sha256:someid;;
  "image inspect -f {{json .RootFS.Layers}} "*) [ -f "$d/layers" ] && cat "$d/layers";;
  "image inspect -f {{.Size}} "*) [ -f "$d/image" ] && stat -c %s "$d/image";;
  "image inspect --format "*) [ -f "$d/image" ] && sha256sum < "$d/image";;
  *) echo "docker stub: $*" >&2; exit 1;;
esac
"""

# docker load's rule (moby image/tarexport/load.go): a layer file may be absent only when
# the node holds that layer's chain (the same layers up to it).
_LOAD_CHECK = """
import json, os, sys, tarfile
archive, head_layers, node_layers = sys.argv[1:]
with tarfile.open(archive) as t:
    names = set(t.getnames())
    paths = json.load(t.extractfile("manifest.json"))[0]["Layers"]
layers = json.load(open(head_layers))
held = json.load(open(node_layers)) if os.path.exists(node_layers) else []
for i, path in enumerate(paths):
    if path not in names and held[: i + 1] != layers[: i + 1]:
        sys.exit(f"docker load: {path} is neither in the archive nor held")
"""

LAYERS = [f"sha256:{c * 64}" for c in "abc"]
LAYER_BYTES = 1024 * 1024  # 3 MiB in all: bigger than any pipe buffer on the way


def save_archive() -> bytes:
    """The image as `docker save` writes it (OCI layout): a random 1 MiB file per layer."""
    out = io.BytesIO()
    paths = [f"blobs/sha256/{d.split(':')[1]}" for d in LAYERS]
    with tarfile.open(fileobj=out, mode="w") as tar:
        files = [(p, os.urandom(LAYER_BYTES)) for p in paths]
        files += [("manifest.json", json.dumps([{"Config": "c.json", "Layers": paths}]).encode())]
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


IMAGE = save_archive()
# What a worker may hold: the head's image, or an earlier version that shares its first
# layer ("older") or its first two ("newer").
HOLDS = {"same": LAYERS, "older": LAYERS[:1], "newer": LAYERS[:2]}


@pytest.fixture
def cfg(spark_raw: dict[str, Any]) -> StackConfig:
    return load_stack_config(four_node_raw(spark_raw))


def addr(cfg: StackConfig, i: int) -> str:
    return str(cfg.nodes[i].cluster_link.address)


def relay(
    cfg: StackConfig, tmp_path: Path, holding: dict[int, str], key: str = "", **env: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run the relay from the head (node 0) to the three workers. `holding`: worker
    index -> what it holds (HOLDS)."""
    state = tmp_path / "state"
    bin_ = tmp_path / "bin"
    for d in (state / "head", bin_):
        d.mkdir(parents=True)
    (state / "head" / "image").write_bytes(IMAGE)
    (state / "head" / "layers").write_text(json.dumps(LAYERS))
    (state / "load_check.py").write_text(_LOAD_CHECK)
    for i, what in holding.items():
        node = state / addr(cfg, i)
        node.mkdir()
        (node / "image").write_bytes(IMAGE if what == "same" else what.encode())
        (node / "layers").write_text(json.dumps(HOLDS[what]))
    for name, text in (("ssh", _SSH), ("docker", _DOCKER)):
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    spec = commands.image_relay(cfg, cfg.worker_nodes, {n.name: n.ssh.host_key for n in cfg.nodes})
    assert spec.node == cfg.head and spec.stdin_secret == "ssh_private_key"
    environ = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
    out = subprocess.run(
        ["bash", "-c", spec.create],
        input=key or TEST_PRIVATE_KEY,
        capture_output=True,
        text=True,
        timeout=60,
        env={**environ, "PATH": f"{bin_}:{environ['PATH']}", "STATE": str(state), "NODE": "head",
             "OMP_NUM_THREADS": str(STREAMS), **env},
    )  # fmt: skip
    return out, state


def log(state: Path, name: str) -> list[str]:
    path = state / name
    return path.read_text().splitlines() if path.exists() else []


def hops(state: Path) -> list[list[str]]:
    """The relay's hops in order, `[from, "->", to]`: the calls on the agent (no key file)
    of each hop (its control calls and its connections) counted once."""
    out: list[list[str]] = []
    for line in log(state, "ssh.log"):
        hop = line.split(" ")[:3]
        if "IdentityFile=" not in line and hop not in out:
            out.append(hop)
    return out


STREAMS = 3  # each hop's connections: the sender's cores (OMP_NUM_THREADS sets GNU nproc)


def streams(state: Path, hop: list[str]) -> list[str]:
    """The option words of the hop's bulk connections (each hands its stdin to the joiner)."""
    calls = [line.split(" | ", 1) for line in log(state, "ssh.log")]
    return [opts for opts, cmd in calls
            if opts.split(" ")[:3] == hop and cmd.startswith("exec python3 -c ")]  # fmt: skip


def loads(state: Path) -> dict[str, int]:
    """node address -> the bytes its docker load took in."""
    found = [line.split() for line in log(state, "docker.log") if " load " in line]
    return {node: int(size) for node, _load, size in found}


pytestmark = pytest.mark.skipif(
    shutil.which("ssh-agent") is None, reason="ssh-agent (openssh-client) is not installed"
)


def test_three_workers_lacking_the_image_get_it_from_one_save_hop_by_hop(
    cfg: StackConfig, tmp_path: Path, key: str
) -> None:
    out, state = relay(cfg, tmp_path, {}, key)
    assert out.returncode == 0, out.stderr
    assert "relayed=spark-2,spark-3,spark-4" in out.stdout.splitlines()
    for i in (1, 2, 3):
        assert (state / addr(cfg, i) / "image").read_bytes() == IMAGE
    assert log(state, "docker.log").count("head save") == 1  # the image left the head once
    assert loads(state) == {addr(cfg, i): len(IMAGE) for i in (1, 2, 3)}
    # The stream went head -> w1 -> w2 -> w3, each hop on the agent (no key file on a
    # worker) with the next node's host key checked, over STREAMS connections at once
    # with AES-GCM first where the CPU has AES instructions.
    assert hops(state) == [
        ["head", "->", addr(cfg, 1)],
        [addr(cfg, 1), "->", addr(cfg, 2)],
        [addr(cfg, 2), "->", addr(cfg, 3)],
    ]
    aes = "aes" in Path("/proc/cpuinfo").read_text().split()
    for hop in hops(state):
        conns = streams(state, hop)
        assert len(conns) == STREAMS, log(state, "ssh.log")
        for h in conns:
            assert "ForwardAgent=yes" in h and "StrictHostKeyChecking=yes" in h
            assert "IdentitiesOnly" not in h
            assert ("-c aes128-gcm@openssh.com," in h) == aes, h
    assert key.splitlines()[1] not in out.stdout + out.stderr
    leftovers = [p for p in state.rglob("*") if p.name in ("kh", "load", "in.part")]
    assert leftovers == []


def test_one_worker_of_each_kind_is_no_relay(cfg: StackConfig, tmp_path: Path, key: str) -> None:
    """spark-2 has it, spark-3 holds an older version, spark-4 lacks it entirely: no two
    alike, so each is left to its own step (spark-3's sends only the new layers)."""
    out, state = relay(cfg, tmp_path, {1: "same", 2: "older"}, key)
    assert out.returncode == 0, out.stderr
    assert "relayed=" in out.stdout.splitlines()
    assert log(state, "docker.log") == []
    assert (state / addr(cfg, 2) / "image").read_bytes() == b"older"


def test_workers_holding_the_version_before_get_one_stream_of_the_new_layers(
    cfg: StackConfig, tmp_path: Path, key: str
) -> None:
    """An update: every worker holds the first layer; one thin stream, hop by hop,
    carries the other two, and every worker ends with the head's image."""
    out, state = relay(cfg, tmp_path, {1: "older", 2: "older", 3: "older"}, key)
    assert out.returncode == 0, out.stderr
    assert "relayed=spark-2,spark-3,spark-4" in out.stdout.splitlines()
    assert "sending the layers not all of them hold" in out.stderr
    for i in (1, 2, 3):
        assert (state / addr(cfg, i) / "image").read_bytes() == IMAGE
    sizes = loads(state)
    assert sorted(sizes) == sorted(addr(cfg, i) for i in (1, 2, 3))
    for size in sizes.values():  # two layers and the archive's headers, not three
        assert 2 * LAYER_BYTES < size < 2 * LAYER_BYTES + 64 * 1024
    assert hops(state) == [["head", "->", addr(cfg, 1)], [addr(cfg, 1), "->", addr(cfg, 2)],
                           [addr(cfg, 2), "->", addr(cfg, 3)]]  # fmt: skip


def test_the_thin_stream_leaves_out_only_what_every_worker_holds(
    cfg: StackConfig, tmp_path: Path, key: str
) -> None:
    """spark-2 holds the first layer, spark-3 the first two: the second goes too (spark-2
    lacks it; a stream without it would not load there), spark-3 takes it in and keeps
    its own. spark-4 has the image."""
    out, state = relay(cfg, tmp_path, {1: "older", 2: "newer", 3: "same"}, key)
    assert out.returncode == 0, out.stderr
    assert "relayed=spark-2,spark-3" in out.stdout.splitlines()
    sizes = loads(state)
    assert sorted(sizes) == sorted([addr(cfg, 1), addr(cfg, 2)])
    assert all(2 * LAYER_BYTES < size < 3 * LAYER_BYTES for size in sizes.values())
    for i in (1, 2):
        assert (state / addr(cfg, i) / "image").read_bytes() == IMAGE


def test_with_two_bare_workers_and_one_holder_the_bare_ones_are_relayed(
    cfg: StackConfig, tmp_path: Path, key: str
) -> None:
    """The chain is of one kind: the two that lack everything get it whole; spark-2,
    holding the version before, is left to its own step (only the new layers)."""
    out, state = relay(cfg, tmp_path, {1: "older"}, key)
    assert out.returncode == 0, out.stderr
    assert "relayed=spark-3,spark-4" in out.stdout.splitlines()
    assert loads(state) == {addr(cfg, 2): len(IMAGE), addr(cfg, 3): len(IMAGE)}
    assert (state / addr(cfg, 1) / "image").read_bytes() == b"older"


def test_two_of_three_lacking_it_form_the_chain(cfg: StackConfig, tmp_path: Path, key: str) -> None:
    out, state = relay(cfg, tmp_path, {2: "same"}, key)
    assert out.returncode == 0, out.stderr
    assert "relayed=spark-2,spark-4" in out.stdout.splitlines()
    assert (state / addr(cfg, 3) / "image").read_bytes() == IMAGE
    assert log(state, "docker.log").count("head save") == 1


def test_a_broken_hop_fails_nothing_and_says_who_got_it(
    cfg: StackConfig, tmp_path: Path, key: str
) -> None:
    """spark-3 unreachable from spark-2: spark-2 still loads the whole stream; the relay
    reports only spark-2 and leaves spark-3 and spark-4 to their own steps."""
    out, state = relay(cfg, tmp_path, {}, key, NO_ROUTE=f"{addr(cfg, 1)}>{addr(cfg, 2)}")
    assert out.returncode == 0, out.stderr
    assert "relayed=spark-2" in out.stdout.splitlines()
    assert (state / addr(cfg, 1) / "image").read_bytes() == IMAGE
    assert not (state / addr(cfg, 3) / "image").exists()
    assert "the relay did not complete; each worker's own step sends what it lacks" in out.stderr


def test_a_key_the_agent_refuses_leaves_every_worker_to_its_own_step(
    cfg: StackConfig, tmp_path: Path
) -> None:
    """A key ssh-add cannot load (a passphrase; here not a key at all): nothing is sent,
    nothing fails, and the reason is said."""
    out, state = relay(cfg, tmp_path, {})
    assert out.returncode == 0, out.stderr
    assert "relayed=" in out.stdout.splitlines()
    assert log(state, "docker.log") == []
    assert "did not take the key (it has a passphrase?)" in out.stderr
