"""The fail-fast checks, provoked on the SIMULATED cluster: each broken input stops the
program with its message before any container starts (or, for a node's weights, is
repaired by the copy step), and nothing is left half-done; and the distribution steps
that repair a node move only what it lacks (a weights blob, an image layer).

Each test breaks one thing on the real sim nodes, runs the program (or, where the program
would simply converge the breakage away, the check's own commands) through the local
engine, reads the message, and restores what it broke. The module works on a fresh
simulation as well as after the deployment suites (it needs no running deployment).
"""

from __future__ import annotations

import copy
import re
import shlex
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from localengine.operations import Result
from sim import stack
from sparkvllm import scripts
from sparkvllm.config import StackConfig
from sparkvllm.specs import versions, weights
from sparkvllm.specs.commands import CommandSpec, fingerprint_script, image_sync
from sparkvllm.specs.output import NodesDisagreeError, key_values, same_on_every_node
from sparkvllm.workstation import SshAccess

pytestmark = pytest.mark.sim

HEAD, WORKER = "spark-1", "spark-2"
REF = "sparkvllm/vllm-sim:latest-sim"
TARBALL = "/var/lib/sparkvllm/images/vllm-sim.tar"
SNAPSHOTS = "/root/.cache/huggingface/hub/models--sparkvllm--tiny-qwen3/snapshots"
# Where the image's vLLM lives, found without importing it (as the support probe does).
VLLM_DIR = (
    "$(python3 -c 'import importlib.util, os; "
    'print(os.path.dirname(importlib.util.find_spec("vllm").origin))\')'
)


@dataclass
class Sim:
    raw: dict[str, Any]
    cfg: StackConfig
    access: SshAccess

    def on(self, node: str, command: str, stdin: str | None = None, timeout: int = 600) -> str:
        return stack.run_on(self.cfg, self.access, node, command, stdin=stdin, timeout=timeout)

    def run_spec(self, spec: CommandSpec) -> str:
        """A spec's command on its node, exactly as the program runs it."""
        return stack.run_spec(self.cfg, self.access, spec)

    def containers(self) -> dict[str, list[str]]:
        return {n.name: stack.our_containers(self.cfg, self.access, n.name) for n in self.cfg.nodes}


def _log(message: str) -> None:
    print(message, flush=True)


@pytest.fixture(scope="module")
def sim() -> Sim:
    stack.ensure_up()
    raw = stack.stack_raw()
    cfg, access = stack.load(raw)
    s = Sim(raw, cfg, access)
    s.on(HEAD, f"docker image inspect {REF} >/dev/null 2>&1 || docker load -i {TARBALL} >&2")
    return s


def _fails_before_any_container(s: Sim, raw: dict[str, Any], message: str) -> Result:
    """`up` with `raw` fails with `message` and no container changed on any node; its
    result."""
    before = s.containers()
    started = time.monotonic()
    result = stack.engine("up", raw, log=_log)
    seconds = time.monotonic() - started
    _log(f"phase: up failed after {seconds:.1f}s (in-flight steps finish first)")
    assert re.search(message, result.error), result.error
    assert s.containers() == before
    return result


def test_a_wrong_interface_name_stops_at_the_facts(sim: Sim) -> None:
    raw = copy.deepcopy(sim.raw)
    raw["nodes"][1]["cluster_link"]["netdev"] = "enp1s0f1np1"
    _fails_before_any_container(
        sim,
        raw,
        r"node spark-2: netdev 'enp1s0f1np1' does not exist \(present: [^)]*eth0",
    )


def test_a_memory_plan_over_a_sim_nodes_memory_stops_before_anything_is_touched(
    sim: Sim,
) -> None:
    """The model promised 0.04 of a sim node's memory (the figures the facts read there):
    its KV cache would get under 1 GiB. `up` refuses it after the preflight (the facts, the
    links, the weights' size on the head), before any image, weights or container is
    touched; with those figures now recorded, `preview` refuses it too."""
    raw = copy.deepcopy(sim.raw)
    raw["vllm"]["gpu_memory_utilization"] = 0.04
    total_kb = int(sim.on(HEAD, "awk '/^MemTotal:/ {print $2}' /proc/meminfo"))
    message = (
        rf"memory plan: spark-1: model \S+'s weights take [0-9.]+ GiB of its [0-9.]+ GiB "
        rf"budget \(0\.04 of {re.escape(f'{total_kb / 2**20:.1f}')} GiB\), leaving [0-9.]+ GiB "
        r"for its KV cache \(at least 1 needed\); fix: raise its vllm.gpu_memory_utilization"
    )
    result = _fails_before_any_container(sim, raw, message)
    acting = ("dynamic:Resource::", "remote:Command::", "docker:index/")
    ran = {s.urn.rsplit("::", 1)[1] for s in result.steps
           if s.op != "same" and any(a in s.urn for a in acting)}  # fmt: skip
    assert ran <= {"spark-1-facts", "spark-2-facts", "spark-1-links", "spark-2-links",
                   "spark-1-weights-size"}, ran  # fmt: skip
    assert re.search(message, stack.engine("preview", raw, log=_log).error)


@pytest.fixture
def image_without_model_file(sim: Sim) -> Iterator[str]:
    """On the head: the sim image with vLLM's qwen3.py (Qwen3ForCausalLM) deleted."""
    tag = "sparkvllm/vllm-sim:no-qwen3-file"
    dockerfile = f'FROM {REF}\nRUN rm "{VLLM_DIR}/model_executor/models/qwen3.py"\n'
    sim.on(HEAD, f"docker build -q -t {tag} - >&2", stdin=dockerfile)
    yield tag
    sim.on(HEAD, f"docker rmi {tag} >&2")


def test_an_image_without_the_model_file_stops_before_the_stream(
    sim: Sim, image_without_model_file: str
) -> None:
    tag = image_without_model_file
    raw = copy.deepcopy(sim.raw)
    raw["image"] = {"ref": tag, "source": "present", "arch": "x86_64"}
    _fails_before_any_container(
        sim,
        raw,
        rf"image {tag} \(vLLM [0-9.]+\) registers Qwen3ForCausalLM in module qwen3 but that "
        "file is missing from the image",
    )
    # Found on the head: the broken image was never streamed to the other node.
    assert sim.on(WORKER, f"docker images -q {tag}").strip() == ""


@pytest.fixture
def head_blob_moved_away(sim: Sim) -> Iterator[str]:
    """The blob behind the tiny model's weights file on the head, moved aside."""
    blob = sim.on(HEAD, f"readlink -f {SNAPSHOTS}/*/model.safetensors").strip()
    sim.on(HEAD, f"mv {blob} {blob}.aside")
    yield blob
    sim.on(HEAD, f"mv {blob}.aside {blob}")


def test_a_missing_weight_file_on_the_head_stops_before_any_container(
    sim: Sim, head_blob_moved_away: str
) -> None:
    _fails_before_any_container(
        sim,
        sim.raw,
        r"model sparkvllm/tiny-qwen3@main in /root/.cache/huggingface on spark-1 is incomplete "
        r"and model.offline is true; .* Missing: model.safetensors",
    )


def test_a_missing_weight_file_on_a_worker_is_found_and_copied_again(sim: Sim) -> None:
    """The copy step compares the RESOLVED files: a worker whose symlink layout is intact
    but whose blob is gone gets the model again, and the manifests agree afterwards."""
    manifest = f'{scripts.load("lib/weights").body}\nmanifest "$(ls -d {SNAPSHOTS}/*)"'
    head_manifest = sim.on(HEAD, f"bash -c {shlex.quote(manifest)}").strip()
    sync = weights.weights_sync(sim.cfg, sim.cfg.nodes[1], sim.access.host_keys[WORKER])
    sim.run_spec(sync)  # in place first (a fresh sim has it; this makes it certain)
    blob = sim.on(WORKER, f"readlink -f {SNAPSHOTS}/*/model.safetensors").strip()
    sim.on(WORKER, f"rm {blob}")
    assert sim.on(WORKER, f"bash -c {shlex.quote(manifest)}").strip() != head_manifest

    size = int(sim.on(HEAD, f"stat -L -c %s {SNAPSHOTS}/*/model.safetensors"))

    out = key_values(sim.run_spec(sync))

    assert out["transferred"] == "1"
    assert out["sent"] == str(size)  # that blob only: config.json and the rest stayed
    assert out["manifest"] == head_manifest
    assert sim.on(WORKER, f"test -f {blob} && bash -c {shlex.quote(manifest)}").strip() == (
        head_manifest
    )


@pytest.fixture
def worker_with_another_ray(sim: Sim) -> Iterator[None]:
    """spark-2 holds a different image under the same tag: the sim image with Ray's
    metadata saying 2.54.0 (as an image built with another Ray would). Restored after."""
    if sim.on(WORKER, f"docker images -q {REF}").strip() == "":
        sim.run_spec(image_sync(sim.cfg, sim.cfg.nodes[1], sim.access.host_keys[WORKER]))
    original = sim.on(WORKER, f"docker image inspect --format '{{{{.Id}}}}' {REF}").strip()
    dockerfile = (
        f"FROM {REF}\nRUN find / -xdev -path '*/ray-*.dist-info/METADATA' "
        "-exec sed -i 's/^Version: .*/Version: 2.54.0/' {} +\n"
    )
    sim.on(WORKER, f"docker build -q -t {REF} - >&2", stdin=dockerfile)
    yield
    sim.on(WORKER, f"docker tag {original} {REF} && docker image prune -f >&2")
    assert sim.on(WORKER, f"docker image inspect --format '{{{{.Id}}}}' {REF}").strip() == original


def test_a_node_with_another_image_under_the_same_tag_is_named(
    sim: Sim, worker_with_another_ray: None
) -> None:
    """The checks the program runs after the image is on every node, run on the nodes: the
    fingerprints and the versions disagree, and each message names both nodes' values.
    (Under `apply` the copy step would first stream the head's image over it: the sim
    drift suite shows that repair.)"""
    prints = {n.name: sim.on(n.name, fingerprint_script(REF)).strip() for n in sim.cfg.nodes}
    with pytest.raises(NodesDisagreeError, match=r"image differs across nodes: spark-1=\w+"):
        same_on_every_node(prints, "image differs")
    outs = {n.name: sim.run_spec(versions.image_versions(sim.cfg, n)) for n in sim.cfg.nodes}
    with pytest.raises(
        NodesDisagreeError,
        match=r"versions differ across nodes: ray: spark-1=2\.60\.0, spark-2=2\.54\.0",
    ):
        versions.agreed_versions(sim.cfg, outs)


LAYER_BYTES = 30_000_000


@pytest.fixture
def image_update_on_the_head(sim: Sim) -> Iterator[int]:
    """The head's image under the stack's tag gains one layer of LAYER_BYTES random bytes
    (an update of the image); the worker holds the previous version. Yields the layer's
    size; restores the previous image under the tag on both nodes after."""
    sim.run_spec(image_sync(sim.cfg, sim.cfg.nodes[1], sim.access.host_keys[WORKER]))
    with stack.image_update(sim.cfg, sim.access, LAYER_BYTES):
        yield LAYER_BYTES


def test_an_image_update_sends_only_the_layer_the_worker_lacks(
    sim: Sim, image_update_on_the_head: int
) -> None:
    """The worker holds every layer but the new one: the sync sends that layer (and the
    image's small config files), not the 4 GB image, and the worker's copy is then the
    head's (same fingerprint)."""
    sent = "cat /sys/class/net/eth0/statistics/tx_bytes"
    before = int(sim.on(HEAD, sent))
    out = key_values(
        sim.run_spec(image_sync(sim.cfg, sim.cfg.nodes[1], sim.access.host_keys[WORKER]))
    )
    moved = int(sim.on(HEAD, sent)) - before
    _log(f"image update: {moved} bytes sent for a layer of {image_update_on_the_head}")

    assert out["transferred"] == "1"
    prints = {n.name: sim.on(n.name, fingerprint_script(REF)).strip() for n in sim.cfg.nodes}
    assert prints[HEAD] == prints[WORKER] == out["fingerprint"]
    assert image_update_on_the_head < moved < 1.1 * image_update_on_the_head
