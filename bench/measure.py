"""Measurements on the SIMULATED cluster, each beside the raw alternative in the same run.

Every command runs as the program runs it: the program's own step specs over the same ssh
(the key on stdin), the raw alternatives built from the same ssh prelude. Byte counts are
the nodes' own interface counters (`/sys/class/net/eth0/statistics/tx_bytes`, summed over
the nodes), so they include the workstation's ssh sessions to the nodes.
"""

from __future__ import annotations

import json
import shlex
import statistics
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.figures import Figures, stopwatch
from localengine import operations
from sim import stack
from sparkvllm import scripts
from sparkvllm.config import StackConfig
from sparkvllm.specs import weights
from sparkvllm.specs.commands import (
    MAX_STREAMS,
    CommandSpec,
    env_assignments,
    image_sync,
    peer_env,
    peer_values,
)
from sparkvllm.specs.output import key_values
from sparkvllm.workstation import SshAccess

NETDEV = "eth0"  # the sim nodes' interface (sim/settings.py NODE_INTERFACE)


@dataclass
class Sim:
    cfg: StackConfig
    access: SshAccess
    say: Callable[[str], None]

    @property
    def head(self) -> str:
        return self.cfg.head

    @property
    def worker(self) -> str:
        return self.cfg.worker_nodes[0].name

    def on(self, node: str, command: str, stdin: str | None = None, timeout: int = 1800) -> str:
        return stack.run_on(self.cfg, self.access, node, command, stdin=stdin, timeout=timeout)

    def run_spec(self, spec: CommandSpec) -> str:
        """A step's command on its node, as the program runs it (the key on stdin)."""
        return stack.run_spec(self.cfg, self.access, spec)

    def tx_bytes(self) -> int:
        read = f"cat /sys/class/net/{NETDEV}/statistics/tx_bytes"
        return sum(int(self.on(n.name, read).strip()) for n in self.cfg.nodes)

    def timed(self, run: Callable[[], str], reset: str) -> Timed:
        """`run` from the same start as any other: `reset` on the worker, every node's dirty
        pages written out; its wall time and the CPU the nodes used meanwhile."""
        self.on(self.worker, reset)
        for n in self.cfg.nodes:
            self.on(n.name, "sync")
        containers = [c for n in self.cfg.nodes for c in _node_containers(n.name)]
        before = _used_ns(containers)
        with stopwatch() as t:
            out = run()
        return Timed(t[0], (_used_ns(containers) - before) / 1e9, out)

    def from_head_to_worker(self, pipe: str) -> str:
        """`pipe` run on the head, where `remote CMD` runs CMD on the worker (the program's
        own prelude: the key on stdin, the host key checked)."""
        target = next(n for n in self.cfg.nodes if n.name == self.worker)
        session = scripts.render("peer_session", **peer_values(self.cfg, target))
        lines = [session.text, pipe]
        env = env_assignments(peer_env(target, self.access.host_keys.get(self.worker)))
        return self.on(
            self.head,
            f"{env}bash -c {shlex.quote(chr(10).join(lines))}",
            stdin=self.access.private_key,
        )


@dataclass(frozen=True)
class Timed:
    seconds: float
    cpu_s: float  # core-seconds both nodes used meanwhile
    out: str


READS = 5  # each read figure is the median of this many runs (one run is noisy here)
SETTLE_S = 30  # idle first: a stack just deployed still loads and compiles for a while
# The 2-node reads of this run (measured before the stack grows and again after it is back):
# each 2-node figure is the median of all of them.
TWO_NODE_RUNS: dict[str, list[float]] = {"up": [], "preview": []}


def _runs_s(run: Callable[[], operations.Result], times: int = READS) -> list[float]:
    """The wall times of `times` runs of `run` after SETTLE_S idle seconds; each must
    succeed and change nothing."""
    time.sleep(SETTLE_S)
    took = []
    for _ in range(times):
        with stopwatch() as t:
            result = run()
        assert not result.error and not result.changed, result.error
        took.append(t[0])
    return took


def _median_s(run: Callable[[], operations.Result], times: int = READS) -> float:
    return statistics.median(_runs_s(run, times))


def two_node_reads(sim: Sim, figures: Figures) -> None:
    """The no-op `up` and the drift check on the stack's own nodes, READS more runs each,
    added to those of this run so far; the 2-node figures become the median of all."""
    quiet: Callable[[str], None] = lambda _m: None  # noqa: E731
    TWO_NODE_RUNS["up"] += _runs_s(lambda: stack.engine("up", log=quiet))
    TWO_NODE_RUNS["preview"] += _runs_s(lambda: stack.engine("preview", refresh=True, log=quiet))
    nodes = len(sim.cfg.nodes)
    runs = len(TWO_NODE_RUNS["up"])
    figures.add(
        "noop_up_s", statistics.median(TWO_NODE_RUNS["up"]), "s",
        "a second `localengine up --stack sim` on a converged stack (with the project's "
        "refresh: every step and container read back, then the program run and the diff), "
        f"the median of {runs} runs ({READS} before the stack grew, {READS} after it was back "
        f"when it did), each set after {SETTLE_S} s idle", "< 3",
    )  # fmt: skip
    how = (
        f"`preview --refresh` on the converged {nodes}-node stack (every read-back on every "
        f"node), the median of {runs} runs, as noop_up_s"
    )
    drift_s = statistics.median(TWO_NODE_RUNS["preview"])
    figures.add("drift_check_s", drift_s, "s", how, "grows < 0.3 s per node")
    figures.add(f"drift_check_s_{nodes}_nodes", drift_s, "s", how, "grows < 0.3 s per node")


def noop(sim: Sim, figures: Figures) -> None:
    converged = stack.engine("up", log=lambda _m: None)
    assert not converged.error, converged.error
    before = sim.tx_bytes()
    again = stack.engine("up", log=lambda _m: None)
    moved = sim.tx_bytes() - before
    assert not again.error, again.error
    figures.add(
        "noop_provider_calls",
        again.provider_writes,
        "calls",
        "provider calls that change a node during that no-op up",
        "0",
    )
    figures.add(
        "noop_bytes",
        moved,
        "bytes",
        "bytes the nodes sent during that no-op up "
        "(their eth0 tx counters: the refresh's ssh sessions and answers, no payload)",
        "0 payload",
    )
    two_node_reads(sim, figures)


def image(sim: Sim, figures: Figures) -> None:
    ref = sim.cfg.image.local_ref
    size = int(sim.on(sim.head, f"docker image inspect -f '{{{{.Size}}}}' {shlex.quote(ref)}"))
    figures.add("image_bytes", size, "bytes", "the image's size on the head (docker inspect)")
    untag = f"docker rmi -f {shlex.quote(ref)} >/dev/null"
    # The raw alternative: the pipe people run by hand, between the same two nodes.
    sim.on(sim.worker, untag)
    with stopwatch() as raw:
        sim.from_head_to_worker(f"docker save {shlex.quote(ref)} | remote docker load >&2")
    # The program's step (it streams only when the worker's fingerprint differs).
    sim.on(sim.worker, untag)
    spec = image_sync(
        sim.cfg, next(n for n in sim.cfg.worker_nodes), sim.access.host_keys.get(sim.worker)
    )
    with stopwatch() as synced:
        out = sim.run_spec(spec)
    assert "transferred=1" in out, out
    figures.add(
        "raw_pipe_s",
        raw[0],
        "s",
        "`docker save | ssh worker docker load` from the head, the worker's tag removed "
        "first (its running container keeps the layers: docker load still reads them all)",
    )
    figures.add("image_sync_s", synced[0], "s", "the program's image-sync step, same start "
                "(the worker holds every layer: none is sent)")  # fmt: skip
    figures.add(
        "image_sync_vs_raw_pipe",
        raw[0] / synced[0],
        "ratio",
        "raw_pipe_s / image_sync_s, measured side by side",
        ">= 0.9",
    )
    rerun_bytes(sim, spec, figures, "image_rerun_bytes", "image-sync (fingerprints match)")
    image_update(sim, figures, spec)
    whole_image(sim, figures)


# An image no node holds a layer of (random bytes: nothing to skip, nothing compresses),
# made on the head by `docker import` for the whole-stream figures and removed after.
BENCH_IMAGE = "sparkvllm/bench-image:whole"


def whole_image(sim: Sim, figures: Figures, megabytes: int = 2048) -> None:
    """The whole image's stream, the program's (image-sync: several connections at once, a
    fast cipher) beside the raw pipe, each twice alternating from the same start (the
    worker holds none of its layers, every node's dirty pages written out), the best of
    each."""
    ref = shlex.quote(BENCH_IMAGE)
    make = (
        f"set -euo pipefail; d=$(mktemp -d); head -c {megabytes}M /dev/urandom > $d/payload; "
        f'tar -C "$d" -cf - payload | docker import - {ref} >/dev/null; rm -rf "$d"'
    )
    drop = f"docker rmi -f {ref} >/dev/null 2>&1 || true"
    raw = stack.stack_raw()
    raw["image"] = {**raw["image"], "ref": BENCH_IMAGE}
    cfg, _ = stack.load(raw)
    spec = image_sync(cfg, cfg.worker_nodes[0], sim.access.host_keys.get(sim.worker))
    sim.on(sim.head, f"bash -c {shlex.quote(make)}")
    try:
        size = int(sim.on(sim.head, f"docker image inspect -f '{{{{.Size}}}}' {ref}"))
        streams = min(int(sim.on(sim.head, "nproc").strip()), MAX_STREAMS)

        raw_s, program_s = [], []
        pipe = f"docker save {ref} | remote docker load >&2"
        for _ in range(2):
            raw_s.append(sim.timed(lambda: sim.from_head_to_worker(pipe), drop))
            program_s.append(sim.timed(lambda: sim.run_spec(spec), drop))
            assert key_values(program_s[-1].out)["transferred"] == "1", program_s[-1].out
    finally:
        for node in (sim.head, sim.worker):
            sim.on(node, drop)
    figures.add(
        "whole_image_bytes", size, "bytes",
        f"an image of {megabytes} MiB of random bytes in one layer (docker import on the "
        "head), none of it on the worker",
    )  # fmt: skip
    figures.add(
        "whole_image_raw_pipe_s", min(r.seconds for r in raw_s), "s",
        "`docker save | ssh worker docker load` (one stream, ssh's default cipher), the "
        "worker holding none of its layers (each of the two measured twice, alternating; "
        "the best of each)",
    )  # fmt: skip
    figures.add(
        "whole_image_sync_s", min(r.seconds for r in program_s), "s",
        f"the program's image-sync step, same start: {streams} connections at once (the "
        f"head's cores, at most {MAX_STREAMS}), AES-GCM where the CPU has AES instructions",
    )  # fmt: skip
    figures.add(
        "whole_image_sync_vs_raw_pipe",
        min(r.seconds for r in raw_s) / min(r.seconds for r in program_s), "ratio",
        "whole_image_raw_pipe_s / whole_image_sync_s, side by side", ">= 1.0",
    )  # fmt: skip
    cpu_figures(figures, "whole_image", size, raw_s, program_s)


def cpu_figures(
    figures: Figures, name: str, size: int, raw: list[Timed], program: list[Timed]
) -> None:
    """What each way cost in CPU: core-seconds per GB moved, both nodes together, in the
    fastest run of each (the sim's nodes share this machine's cores, so a transfer here is
    bound by the sum, not by one stream)."""
    for who, runs in (("raw_pipe", raw), ("program", program)):
        best = min(runs, key=lambda r: r.seconds)
        figures.add(
            f"{name}_{who}_cpu_s_per_gb", best.cpu_s / (size / 1e9), "core-s/GB",
            "CPU both nodes used in that run (their containers' cgroup counters, the "
            "idle servers included), per GB moved",
        )  # fmt: skip


def image_update(sim: Sim, figures: Figures, spec: CommandSpec, layer_mb: int = 100) -> None:
    """The head's image gains one layer of random bytes (an update); the worker holds the
    previous version. Bytes and time of the sync, beside the whole stream's."""
    layer = layer_mb * 1024 * 1024
    with stack.image_update(sim.cfg, sim.access, layer):
        before = sim.tx_bytes()
        with stopwatch() as t:
            out = sim.run_spec(spec)
        moved = sim.tx_bytes() - before
    assert "transferred=1" in out, out
    figures.add("update_bytes", moved, "bytes", f"bytes the nodes sent when image-sync "
                f"brought the worker an update adding one {layer_mb} MiB layer")  # fmt: skip
    figures.add(
        "update_bytes_vs_layer", moved / layer, "ratio",
        "update_bytes / the new layer's size (the image's other layers stay: docker save "
        "filtered to the layers the worker lacks)", "<= 1.1",
    )  # fmt: skip
    figures.add("update_s", t[0], "s", "that sync's time (the head reads `docker save` "
                "twice: once for its layer files, once to send)")  # fmt: skip


def rerun_bytes(sim: Sim, spec: CommandSpec, figures: Figures, name: str, step: str) -> None:
    """Bytes the nodes send when a distribution step runs again on an up-to-date node."""
    before = sim.tx_bytes()
    out = sim.run_spec(spec)
    assert "transferred=0" in out, out
    figures.add(name, sim.tx_bytes() - before, "bytes",
                f"bytes the nodes sent when {step} ran again", "0 payload")  # fmt: skip


# A synthetic model of a real size on the sim's disk (the tiny model is 2 MB: there ssh
# setup is all one would measure): one random "shard" named by its sha256, and a config.
BENCH_MODEL = "sparkvllm/bench-weights"
BENCH_REVISION = "0" * 40


def _make_model(repo: str, megabytes: int) -> str:
    """Bash that writes the synthetic model's HF cache layout at `repo` (the head)."""
    r = shlex.quote(repo)
    return "\n".join(
        [
            "set -euo pipefail",
            f"rm -rf {r}; mkdir -p {r}/blobs {r}/snapshots/{BENCH_REVISION} {r}/refs",
            f"printf %s {BENCH_REVISION} > {r}/refs/main",
            f"head -c {megabytes}M /dev/urandom > {r}/blobs/new",
            "printf '{}' > " + f"{r}/blobs/cfg",
            "for f in new:model.safetensors cfg:config.json; do",
            f'  h=$(sha256sum < {r}/blobs/"${{f%%:*}}" | cut -c1-64)',
            f'  mv {r}/blobs/"${{f%%:*}}" {r}/blobs/"$h"',
            f'  ln -s ../../blobs/"$h" {r}/snapshots/{BENCH_REVISION}/"${{f#*:}}"',
            "done",
        ]
    )


def model_weights(sim: Sim, figures: Figures, megabytes: int = 1024) -> None:
    raw = stack.stack_raw()
    raw["model"] = {**raw["model"], "id": BENCH_MODEL, "revision": "main"}
    cfg, _ = stack.load(raw)
    repo = weights.repo_dir(cfg)
    hub, name = repo.rsplit("/", 1)
    wipe = f"rm -rf {shlex.quote(repo)}"
    sim.on(sim.head, f"bash -c {shlex.quote(_make_model(repo, megabytes))}")
    try:
        _weights_figures(sim, figures, cfg, repo, hub, name)
    finally:
        for node in (sim.head, sim.worker):
            sim.on(node, wipe)


def _weights_figures(
    sim: Sim, figures: Figures, cfg: StackConfig, repo: str, hub: str, name: str
) -> None:
    size = int(sim.on(sim.head, f"du -sbL {shlex.quote(repo)} | cut -f1"))
    figures.add("weights_bytes", size, "bytes", f"a synthetic model ({BENCH_MODEL}): one random "
                "shard named by its sha256, and a config, on the head")  # fmt: skip
    wipe = f"rm -rf {shlex.quote(repo)}"
    raw_pipe = f"tar -C {shlex.quote(hub)} -cf - {shlex.quote(name)} | remote " + shlex.quote(
        f"mkdir -p {shlex.quote(hub)} && tar -C {shlex.quote(hub)} -xf -"
    )
    spec = weights.weights_sync(cfg, cfg.worker_nodes[0], sim.access.host_keys.get(sim.worker))

    # Each three times, alternating, the best of each: from the same start (the worker's
    # copy removed, every node's dirty pages written out first, so neither pays for the
    # other's writes).
    raw_s, copy_s = [], []
    for _ in range(3):
        raw_s.append(sim.timed(lambda: sim.from_head_to_worker(raw_pipe), wipe))
        copy_s.append(sim.timed(lambda: sim.run_spec(spec), wipe))
        assert key_values(copy_s[-1].out)["transferred"] == "1", copy_s[-1].out
    raw, copied = min(r.seconds for r in raw_s), min(r.seconds for r in copy_s)
    figures.add("weights_copy_s", copied, "s", "the program's model-sync step (several "
                "blobs at once, each over ssh connections of its own: the one shard here "
                "over as many as the head's cores; each checked by its sha256 on the "
                "worker as it arrives, then the manifest), the worker's copy removed "
                "first")  # fmt: skip
    figures.add(
        "weights_raw_pipe_s",
        raw,
        "s",
        "`tar | ssh worker tar` from the head, same start "
        "(each of the two measured three times, alternating; the best of each)",
    )
    figures.add(
        "weights_copy_vs_raw_pipe", raw / copied, "ratio",
        "weights_raw_pipe_s / weights_copy_s, side by side (the program's copy also hashes "
        "every blob on arrival)", ">= 1.0",
    )  # fmt: skip
    cpu_figures(figures, "weights", size, raw_s, copy_s)
    rerun_bytes(sim, spec, figures, "weights_rerun_bytes", "model-sync (manifests match)")
    # An interrupted copy: the worker keeps 40% of the shard as a part; the step resumes.
    blob = sim.on(sim.worker, f"readlink -f {shlex.quote(repo)}/snapshots/*/model.safetensors")
    blob = blob.strip()
    shard = int(sim.on(sim.worker, f"stat -c %s {shlex.quote(blob)}"))
    cut = shard * 2 // 5
    part = shlex.quote(blob + weights.PART)
    sim.on(sim.worker, f"mv {shlex.quote(blob)} {part} && truncate -s {cut} {part}")
    before = sim.tx_bytes()
    resumed = key_values(sim.run_spec(spec))
    moved = sim.tx_bytes() - before
    figures.add(
        "weights_resume_overhead", moved / (shard - cut), "ratio",
        "bytes the nodes sent to finish an interrupted copy (60% of the shard left) over "
        f"that remainder (step's own count: {resumed['sent']} bytes)", "<= 1.05",
    )  # fmt: skip
    # Verification: every blob of the worker's copy hashed, on every core.
    verify = f"{scripts.load('lib/weights').body}\nverify_all {shlex.quote(repo)}/blobs"
    with stopwatch() as checked:
        bad = sim.on(sim.worker, f"bash -c {shlex.quote(verify)}").strip()
    assert not bad, bad
    figures.add(
        "verify_s_per_gb", checked[0] / (size / 1e9), "s/GB",
        "every blob's sha256 (or git sha1) against its name, on all the node's cores; the copy "
        "does this per blob on arrival, the download for every blob",
    )  # fmt: skip


def complete(endpoint: str, model: str, tokens: int, timeout: float = 600) -> int:
    """One completion of `tokens` tokens (ignore_eos: always that many); its token count."""
    body = {
        "model": model,
        "prompt": "The simulated spark cluster says",
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    req = urllib.request.Request(
        f"{endpoint}/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return int(json.loads(resp.read())["usage"]["completion_tokens"])


def served_model(endpoint: str, model: str, figures: Figures, streams: int = 8) -> None:
    with stopwatch() as one:
        tokens = complete(endpoint, model, 64)
    figures.add(
        "smoke_tok_s",
        tokens / one[0],
        "tokens/s",
        "one stream, 64 tokens, "
        "temperature 0 (a CPU figure on the sim; the seed's two Sparks: about 27)",
    )
    done: list[int] = []
    threads = [
        threading.Thread(target=lambda: done.append(complete(endpoint, model, 64)))
        for _ in range(streams)
    ]
    with stopwatch() as load:
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    figures.add(
        "load_tok_s",
        sum(done) / load[0],
        "tokens/s",
        f"{streams} concurrent streams of 64 tokens, all tokens over the wall time",
    )


# Step name -> phase of a cold deploy (README "How it works").
PHASES = {
    "facts": "preflight",
    "links": "preflight",
    "hub-access": "preflight",
    "image-obtain": "image_obtain",
    "image-support": "image_obtain",
    "image-relay": "image_sync",
    "image-sync": "image_sync",
    "image-versions": "image_sync",
    "model-download": "weights",
    "model-sync": "weights",
    "ray-head-container": "ray_head",
    "ray-worker": "ray_workers",
    "model-server-ray-ready": "ray_ready",
    "model-server-container": "server_ready",
    "model-server-health": "server_ready",
}


def phase_of(step: str) -> str:
    for key, phase in PHASES.items():
        if key in step:
            return phase
    return "other"


def cold(sim: Sim, figures: Figures) -> None:
    """Destroy, then one `up` to healthy: total, per phase, critical path, overhead."""
    gone = stack.engine("destroy", log=lambda _m: None)
    assert not gone.error, gone.error
    with stopwatch() as t:
        up = stack.engine("up", log=sim.say)
    assert not up.error, up.error
    phases: dict[str, float] = {}
    for s in up.steps:
        if s.op != "same":
            phase = phase_of(s.name)
            phases[phase] = phases.get(phase, 0.0) + s.seconds
    figures.add(
        "cold_total_s",
        t[0],
        "s",
        "`localengine up` from nothing to healthy (images "
        "already on the sim's disk; the head loads its tarball)",
    )
    for phase, seconds in phases.items():
        figures.add(
            f"phase_{phase}_s",
            seconds,
            "s",
            f"sum of the {phase} steps' own times (steps in parallel overlap)",
        )
    # The path nothing can shorten, in order: the image to the workers, Ray's head, Ray
    # reporting every node (this includes the wait's 30 s settle: the answer must hold that
    # long, as a dead raylet counts as alive until the GCS misses its heartbeats), the
    # server's load to ready.
    path = ("image_sync", "ray_head", "ray_ready", "server_ready")
    critical = sum(phases.get(p, 0.0) for p in path)
    figures.add(
        "critical_path_s",
        critical,
        "s",
        "image transfer + Ray head start + Ray reporting every node (with the wait's 30 s "
        "settle) + model load to ready: the steps that follow each other",
    )
    figures.add(
        "cold_overhead_ratio", t[0] / critical, "ratio",
        "cold_total_s / critical_path_s: what the program adds around that path", "<= 1.2",
    )  # fmt: skip


def scale(sim: Sim, figures: Figures, nodes: int) -> None:
    """The converged 2-node stack grown to `nodes` simulated nodes (tensor-parallel across
    all of them) by one `up` with that config, its no-op `up` and drift check there, then
    shrunk back by one `up` with the stack's own config. The new nodes start bare: the
    image is removed from them first, so the growth includes sending it."""
    raw = stack.stack_raw_over(nodes)
    quiet: Callable[[str], None] = lambda _m: None  # noqa: E731
    new = [n["name"] for n in raw["nodes"][len(sim.cfg.nodes) :]]
    ref = shlex.quote(sim.cfg.image.local_ref)
    grown_sim = Sim(*stack.load(raw), sim.say)
    for name in new:
        grown_sim.on(name, f"docker rmi -f {ref} >/dev/null 2>&1; docker image prune -f >/dev/null")
    try:
        with stopwatch() as out:
            grown = stack.engine("up", raw, log=sim.say)
        assert not grown.error, grown.error
        again = stack.engine("up", raw, log=quiet)
        assert not again.error and not again.changed, again.error
        noop_s = _median_s(lambda: stack.engine("up", raw, log=quiet))
        drift_s = _median_s(lambda: stack.engine("preview", raw, refresh=True, log=quiet))
    finally:
        with stopwatch() as back:
            shrunk = stack.engine("up", log=sim.say)
        stack.load()  # the sim stack's own ssh files again
    assert not shrunk.error, shrunk.error
    two_node_reads(sim, figures)  # back on 2 nodes: measured again, beside the first set
    figures.add(
        f"scale_out_to_{nodes}_s", out[0], "s",
        f"one `up` with the stack over {nodes} nodes (TP={nodes}) on the converged "
        f"{len(sim.cfg.nodes)}-node stack: the image to {len(new)} bare node(s), their "
        "weights check, Ray, the server replaced, to healthy",
    )  # fmt: skip
    figures.add(f"noop_up_s_{nodes}_nodes", noop_s, "s",
                f"a no-op `up` on the converged {nodes}-node stack, the median of {READS}",
                "< 3")  # fmt: skip
    how = (
        f"`preview --refresh` on the converged {nodes}-node stack (every read-back on every "
        f"node), the median of {READS}"
    )
    figures.add(f"drift_check_s_{nodes}_nodes", drift_s, "s", how, "grows < 0.3 s per node")
    base = figures.figures.get(f"drift_check_s_{len(sim.cfg.nodes)}_nodes")  # both sets
    if base is not None:
        figures.add(
            "drift_check_growth_s_per_node", (drift_s - base.value) / len(new), "s/node",
            f"(drift_check_s_{nodes}_nodes - drift_check_s_{len(sim.cfg.nodes)}_nodes) / "
            f"{len(new)}, measured in the same run", "< 0.3",
        )  # fmt: skip
    figures.add("scale_in_s", back[0], "s",
                f"one `up` with the stack's own config after: back to {len(sim.cfg.nodes)} "
                "nodes (the extra nodes' containers removed, the server replaced)")  # fmt: skip


def _cpu_ns(container_id: str) -> int | None:
    """CPU time a container used so far, from the host's cgroup files: v1 (cgroupfs)
    cpuacct.usage, else v2 cpu.stat usage_usec; None when it has no cgroup there."""
    v1 = Path(f"/sys/fs/cgroup/cpuacct/docker/{container_id}/cpuacct.usage")
    if v1.exists():
        return int(v1.read_text())
    for v2 in (
        Path(f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope/cpu.stat"),
        Path(f"/sys/fs/cgroup/docker/{container_id}/cpu.stat"),
    ):
        if v2.exists():
            stat = dict(line.split() for line in v2.read_text().splitlines())
            return int(stat["usage_usec"]) * 1000
    return None


def _node_containers(node: str) -> list[str]:
    """A sim node's container and the containers its own dockerd runs. On a host whose
    containers share its cgroup namespace (cgroup v1), a node's dockerd puts its
    containers' cgroups beside the node's, not in it; with a private one (v2) they are
    inside it and have no cgroup of their own at the top (`_cpu_ns` is None)."""

    def ids(*argv: str) -> list[str]:
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        return out.split()

    outer = f"sparkvllm-sim-{node}"
    return [*ids("docker", "inspect", "-f", "{{.Id}}", outer),
            *ids("docker", "exec", outer, "docker", "ps", "-q", "--no-trunc")]  # fmt: skip


def _used_ns(containers: list[str]) -> int:
    return sum(n for n in map(_cpu_ns, containers) if n is not None)


def node_cpu(sim: Sim, seconds: float) -> dict[str, float]:
    """Cores each sim node used on average over `seconds`: its container (sshd, its own
    dockerd) and the containers it runs (ours), from the host's cgroup counters."""
    containers = {n.name: _node_containers(n.name) for n in sim.cfg.nodes}
    if _cpu_ns(containers[sim.head][0]) is None:
        raise RuntimeError("no cgroup CPU counter for the sim's node containers on this host")
    before = {n: _used_ns(c) for n, c in containers.items()}
    start = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - start
    return {n: (_used_ns(c) - before[n]) / 1e9 / elapsed for n, c in containers.items()}


IDLE_S = 60
SETTLE_S = 30


def launchers(sim: Sim, figures: Figures) -> None:
    """Each launcher from nothing to healthy, side by side in one run (destroy, then one
    `up` with `parallelism.launcher` set), and the CPU its idle deployment then takes on
    each node, beside the nodes with nothing deployed. Leaves the stack destroyed (the
    caller's `up` converges it again)."""
    quiet: Callable[[str], None] = lambda _m: None  # noqa: E731
    gone = stack.engine("destroy", log=quiet)
    assert not gone.error, gone.error
    time.sleep(SETTLE_S)
    for node, cores in node_cpu(sim, IDLE_S).items():
        figures.add(f"idle_cpu_none_{node}_cores", cores, "cores",
                    f"the sim node with nothing deployed, over {IDLE_S} s")  # fmt: skip
    cold: dict[str, float] = {}
    for launcher in ("ray", "native"):
        raw = stack.stack_raw()
        raw["parallelism"]["launcher"] = launcher
        with stopwatch() as t:
            up = stack.engine("up", raw, log=sim.say)
        assert not up.error, up.error
        assert up.outputs["launcher"]["name"] == launcher, up.outputs["launcher"]
        cold[launcher] = t[0]
        how = f"destroy, then one `up` with parallelism.launcher {launcher} to healthy"
        figures.add(f"cold_{launcher}_s", t[0], "s", how)
        # The server answered once: the deployment is idle from here.
        time.sleep(SETTLE_S)
        for node, cores in node_cpu(sim, IDLE_S).items():
            figures.add(
                f"idle_cpu_{launcher}_{node}_cores", cores, "cores",
                f"the sim node's CPU over {IDLE_S} s with the {launcher} deployment idle "
                f"({SETTLE_S} s after it was healthy; nothing asked of it)",
            )  # fmt: skip
        gone = stack.engine("destroy", raw, log=quiet)
        assert not gone.error, gone.error
    figures.add("cold_native_vs_ray", cold["native"] / cold["ray"], "ratio",
                "cold_native_s / cold_ray_s, side by side in one run")  # fmt: skip
