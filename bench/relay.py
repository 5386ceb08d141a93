"""The image to one worker vs to two, on a 3-node SIMULATED cluster (`--nodes 3`) whose
links are shaped to one rate: `tc tbf` on every node's eth0 egress, so that the link and
not the machine's shared disk and CPU is the bottleneck, as between real Sparks.

A synthetic image (one layer of random bytes on `scratch`, built on the head) keeps the
shaped transfers short. Side by side in the same run, each from "no worker has it":
one worker (its image-sync step), two workers as the program does it (the relay, then each
worker's image-sync step, which checks), and two workers the way it was before the relay
(both image-sync steps at once, each streaming from the head).
"""

from __future__ import annotations

import shlex
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bench.figures import Figures, stopwatch
from bench.measure import NETDEV, Sim
from sim import stack
from sparkvllm.specs.commands import CommandSpec, image_relay, image_sync

RELAY_REF = "sparkvllm/bench-relay:1"
LINK_MBIT = 200  # 25 MB/s: below what two ssh streams and two loads reach on 2 cores


def config(nodes: int) -> dict[str, Any]:
    """The sim stack's config over the first `nodes` simulated nodes, with the synthetic
    image (this config is never deployed)."""
    raw = stack.stack_raw_over(nodes)
    raw["image"] = {**raw["image"], "ref": RELAY_REF}
    return raw


@contextmanager
def shaped(sim: Sim, mbit: int) -> Iterator[None]:
    """Every node's egress limited to `mbit` (removed after)."""
    rate = f"tc qdisc replace dev {NETDEV} root tbf rate {mbit}mbit burst 256kb latency 200ms"
    try:
        for n in sim.cfg.nodes:
            sim.on(n.name, rate)
        yield
    finally:
        for n in sim.cfg.nodes:
            sim.on(n.name, f"tc qdisc del dev {NETDEV} root 2>/dev/null || true")


def _parallel(sim: Sim, specs: list[CommandSpec]) -> list[str]:
    """The steps at once, as the engine runs independent steps."""
    outs = [""] * len(specs)

    def run(i: int) -> None:
        outs[i] = sim.run_spec(specs[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(specs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outs


def _build(sim: Sim, base: str, megabytes: int) -> None:
    """RELAY_REF on the head: `base` plus one layer of `megabytes` random bytes."""
    sim.on(
        sim.head,
        "d=$(mktemp -d); trap 'rm -rf \"$d\"' EXIT; "
        f'head -c {megabytes}M /dev/urandom > "$d/blob"; '
        f"printf 'FROM {base}\\nCOPY blob /blob-{megabytes}\\n' > \"$d/Dockerfile\"; "
        f'docker build -q -t {shlex.quote(RELAY_REF)} "$d" >&2',
    )


def _image_id(sim: Sim, node: str) -> str:
    return sim.on(node, f"docker image inspect -f '{{{{.Id}}}}' {shlex.quote(RELAY_REF)}").strip()


def measure(sim: Sim, figures: Figures, megabytes: int = 300, update_mb: int = 100) -> None:
    ref = shlex.quote(RELAY_REF)
    _build(sim, "scratch", megabytes)
    base = _image_id(sim, sim.head)
    workers = sim.cfg.worker_nodes[:2]
    keys = sim.access.host_keys
    syncs = [image_sync(sim.cfg, n, keys.get(n.name)) for n in workers]
    relay = image_relay(sim.cfg, workers, keys)
    drop = f"docker rmi -f {ref} >/dev/null 2>&1 || true; docker image prune -f >/dev/null"

    def clear() -> None:
        for n in workers:
            sim.on(n.name, drop)

    def back_to_base(update: str) -> None:
        """Each worker holds the base version under the tag again, the update removed."""
        for n in workers:
            sim.on(n.name, f"docker tag {base} {ref} && {{ docker rmi -f {update} || true; }}")

    try:
        with shaped(sim, LINK_MBIT):
            clear()
            with stopwatch() as one:
                out = sim.run_spec(syncs[0])
            assert "transferred=1" in out, out
            clear()
            with stopwatch() as two:
                relayed = sim.run_spec(relay)
                checked = _parallel(sim, syncs)
            assert f"relayed={workers[0].name},{workers[1].name}" in relayed, relayed
            assert all("transferred=0" in o for o in checked), checked
            clear()
            with stopwatch() as direct:
                streamed = _parallel(sim, syncs)
            assert all("transferred=1" in o for o in streamed), streamed
            # An update: both workers hold the version before; one new layer.
            _build(sim, base, update_mb)
            update = _image_id(sim, sim.head)
            with stopwatch() as up_one:
                out = sim.run_spec(syncs[0])
            assert "transferred=1" in out, out
            back_to_base(update)
            with stopwatch() as up_two:
                relayed = sim.run_spec(relay)
                checked = _parallel(sim, syncs)
            assert f"relayed={workers[0].name},{workers[1].name}" in relayed, relayed
            assert all("transferred=0" in o for o in checked), checked
            back_to_base(update)
            with stopwatch() as up_direct:
                streamed = _parallel(sim, syncs)
            assert all("transferred=1" in o for o in streamed), streamed
    finally:
        clear()
        sim.on(sim.head, f"docker rmi -f {ref} {base} >/dev/null 2>&1 || true")
    figures.add("relay_link_mbit", LINK_MBIT, "Mbit/s", "every sim node's egress (tc tbf)")
    figures.add("relay_image_bytes", megabytes * 1024 * 1024, "bytes",
                "the synthetic image's layer (random bytes)")  # fmt: skip
    figures.add("one_worker_s", one[0], "s", "image-sync to one worker, shaped links")
    figures.add("two_workers_s", two[0], "s",
                "the relay to two workers, then both image-sync steps (checks)")  # fmt: skip
    figures.add(
        "two_workers_vs_one", two[0] / one[0], "ratio",
        "two_workers_s / one_worker_s, side by side (the image leaves the head once)", "<= 1.3",
    )  # fmt: skip
    figures.add(
        "two_workers_direct_vs_one", direct[0] / one[0], "ratio",
        "both image-sync steps at once, each streaming from the head (before the relay) / "
        "one_worker_s",
    )  # fmt: skip
    figures.add(
        "update_two_workers_vs_one", up_two[0] / up_one[0], "ratio",
        f"an update adding one {update_mb} MiB layer, both workers holding the version "
        "before: the relay's one thin stream then both image-sync steps, over image-sync "
        f"to one worker ({up_two[0]:.1f} s vs {up_one[0]:.1f} s)", "<= 1.3",
    )  # fmt: skip
    figures.add(
        "update_two_workers_direct_vs_one", up_direct[0] / up_one[0], "ratio",
        "that update by both image-sync steps at once, each sending the new layer from the "
        f"head (before the thin relay; {up_direct[0]:.1f} s), over one worker's",
    )  # fmt: skip
