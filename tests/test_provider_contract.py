"""The provider contract (docs/provider-contract.md): a deployed stack's state holds each
NodeStep's `__provider` as a pickle that names classes and functions by import path, and
every later refresh, preview and destroy loads THAT pickle in the SDK's provider host.

- The pickle names only the contract's paths and holds plain data (no config classes),
  and it is the same bytes on every run, whatever the hash seed.
- States written by earlier code (committed fixtures, tests/fixtures/provider_states/<commit>)
  still load in the real provider host with today's code: Check, Diff (with the state's
  own pickle, as a refresh or a destroy uses it) and Read of the checks (which run nothing
  on a node) answer, and an unchanged step diffs as unchanged.
"""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import dill
import pytest
from cryptography.fernet import Fernet

from localengine import wire
from localengine.program import project_file
from localengine.providers.dynamic import DynamicProvider, PluginContext
from tests.conftest import ROOT

FIXTURES = Path(__file__).parent / "fixtures" / "provider_states"
DYNAMIC = "pulumi-python:dynamic:Resource"

# What a NodeStep's pickle may name (docs/provider-contract.md): the provider class, the
# judges, and what dill itself needs to rebuild them.
CONTRACT = {
    ("components.node_step", "NodeStepProvider"),
    ("sparkvllm.specs.facts", "facts_check"),
    ("sparkvllm.specs.facts", "links_check"),
}


class _Names(dill.Unpickler):
    """Records every global a pickle names while loading it."""

    def __init__(self, data: bytes):
        super().__init__(io.BytesIO(data))
        self.names: set[tuple[str, str]] = set()

    def find_class(self, module: str, name: str) -> Any:
        self.names.add((module, name))
        return super().find_class(module, name)


def names_in(blob: str) -> set[tuple[str, str]]:
    unpickler = _Names(base64.b64decode(blob))
    unpickler.load()
    return {(m, n) for m, n in unpickler.names if not m.startswith(("dill.", "functools"))}


def _blobs_now(seed: str) -> dict[str, str]:
    """The NodeSteps' `__provider` pickles of the spark stack's program, as the SDK makes
    them (pulumi.dynamic serialize_provider), in a process with this hash seed."""
    script = (
        "import json, sys\n"
        "from pulumi.dynamic.dynamic import serialize_provider\n"
        "from components.node_step import NodeStepProvider\n"
        "from sparkvllm.config import load_stack_config\n"
        "from sparkvllm.specs import plans\n"
        "from sparkvllm.specs.ssh import Reach\n"
        "from tests.conftest import TEST_PRIVATE_KEY, stack_file\n"
        "raw = stack_file('spark'); raw['ssh_private_key'] = TEST_PRIVATE_KEY\n"
        "cfg = load_stack_config(raw)\n"
        "out = {}\n"
        "for n in cfg.nodes:\n"
        "    reach = Reach(n.ssh.host, n.ssh.port, n.ssh.user, n.ssh.host_key, '~/id')\n"
        "    p = plans.node(cfg, n, reach=reach, known_hosts_ref='~/kh', control_dir_ref='~/cm')\n"
        "    out[f'{n.name}-facts'] = serialize_provider(NodeStepProvider(judge=p.facts_check))\n"
        "    out[f'{n.name}-links'] = serialize_provider(NodeStepProvider(judge=p.links_check))\n"
        "out['step'] = serialize_provider(NodeStepProvider())\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True,
        env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    return dict(json.loads(done.stdout))


def test_the_pickles_are_plain_data_at_contract_paths_and_the_same_bytes_every_run() -> None:
    first, second = _blobs_now("1"), _blobs_now("2")
    assert first == second, sorted(k for k in first if first[k] != second.get(k))
    for name, blob in first.items():
        named = names_in(blob)
        assert named <= CONTRACT, (name, named - CONTRACT)
        assert ("components.node_step", "NodeStepProvider") in named


def _fixture_states() -> list[Path]:
    return sorted(p for p in FIXTURES.iterdir() if (p / "spark.json").exists())


def _unsealed(value: Any, key: Fernet) -> Any:
    """The state's value with its secrets decrypted (the local engine's keyfile form)."""
    if isinstance(value, dict) and value.get(wire.SIG_KEY) == wire.SECRET_SIG:
        if "ciphertext" in value:
            return wire.secret(json.loads(key.decrypt(value["ciphertext"].encode())))
        return value
    if isinstance(value, dict):
        return {k: _unsealed(v, key) for k, v in value.items()}
    if isinstance(value, list):
        return [_unsealed(v, key) for v in value]
    return value


@pytest.mark.parametrize("fixture", _fixture_states(), ids=lambda p: p.name)
def test_a_state_written_by_earlier_code_loads_in_the_provider_host(fixture: Path) -> None:
    key = Fernet((fixture / "spark.key").read_bytes().strip())
    state = json.loads((fixture / "spark.json").read_text())
    steps = [r for r in state["checkpoint"]["latest"]["resources"] if r["type"] == DYNAMIC]
    assert len(steps) >= 8
    host = DynamicProvider(PluginContext(ROOT, project_file(ROOT), "127.0.0.1:0"))
    try:
        for res in steps:
            inputs, outputs = _unsealed(res["inputs"], key), _unsealed(res["outputs"], key)
            blob = wire.plain(outputs["__provider"])
            assert ("components.node_step", "NodeStepProvider") in names_in(blob)
            # Check with the state's own pickle (the host loads it).
            checked = host.check(DYNAMIC, inputs, inputs)
            assert wire.plain(checked["step"]) == res["urn"].rsplit("::", 1)[-1]
            # Diff with the state's pickle deciding; the same inputs: no change.
            diff = host.diff(DYNAMIC, res["id"], inputs, outputs, inputs)
            assert diff.replaces == [], (res["urn"], diff)
            # Read and Delete load the pickle in the state (as a refresh and a destroy
            # do); where they would run nothing on a node (a check has no read command,
            # a step without an undo deletes nothing), they are called.
            if not outputs.get("read"):
                read = host.read(DYNAMIC, res["id"], inputs, outputs)
                assert read.id == res["id"]
            if not outputs.get("delete"):
                host.delete(DYNAMIC, res["id"], inputs, outputs)
    finally:
        host.close()


# What upgrading a deployed stack costs: each step a later change re-runs (and why), and
# never a container. A change that re-runs more must say so here.
# The preflight checks (each node's facts and links, the head's hub access) are script
# files since the stop after d3ba419: a check has no read-back to vouch for what it found
# in an earlier state, so it runs again (read-only, about a second each; nothing is built
# on them). The facts also read each RDMA device's PCI address since 9460579.
CHECKS = {"spark-1-facts", "spark-2-facts", "spark-1-links", "spark-2-links",
          "spark-1-hub-access"}  # fmt: skip
RERUN_ON_UPGRADE = {
    # The last landed code of stop 20. Its steps now made of script files with a
    # read-back (the image, the weights, the Ray wait, the guard) are adopted as they stand.
    "1f47042": CHECKS,
    # The code that introduced the provider contract.
    "ab4b42b": CHECKS,
    # The last code before the node scripts became files (stop 31).
    "d3ba419": CHECKS,
}  # fmt: skip
# Steps made of script files since those states were written are adopted as they stand
# (node_step.py `_recorded`): an update that runs nothing and keeps their generations, so
# what is built on them stays (the server on the Ray wait and the guard). The readiness
# wait, a pulumi-command Command, runs again on its new text (seconds against a running
# server).
ADOPTED = {"model-server-ray-ready": "update", "model-server-guard": "update",
           "model-server-health": "update", "image-obtain-spark-1": "update",
           "image-sync-spark-2": "update", "model-download-spark-1": "update",
           "model-sync-spark-2": "update"}  # fmt: skip


@pytest.mark.parametrize("commit", sorted(RERUN_ON_UPGRADE))
def test_upgrading_a_deployed_stack_replaces_no_container(
    commit: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A state as that code wrote it, with today's code: preview shows what up does, up
    re-runs only the listed steps and replaces no container, the next up does nothing, and
    destroy removes everything (the real host's Read of these pickles: the test above)."""
    import shutil

    from tests.conftest import TEST_PRIVATE_KEY, stack_file
    from tests.test_plan_engine import Stack, changed

    fixture = FIXTURES / commit
    stacks = tmp_path / "backend" / ".localengine" / "stacks" / "spark-vllm"
    stacks.mkdir(parents=True)
    for name in ("spark.json", "spark.key"):
        shutil.copy(fixture / name, stacks / name)
    stack = Stack(tmp_path / "backend", monkeypatch)
    make = runpy_module(FIXTURES / "make.py")
    monkeypatch.setenv("SPARKVLLM_STATE_DIR", make["FIXED_STATE_DIR"])
    key = tmp_path / "id_test"
    key.write_text(TEST_PRIVATE_KEY)
    raw = {**stack_file("spark"), "ssh_private_key_file": str(key)}

    def engine(operation: str) -> dict[str, str]:
        return changed(stack.run(operation, raw))

    planned = engine("preview")
    done = engine("up")
    assert planned == done
    assert {n for n, op in done.items() if op == "replace"} == RERUN_ON_UPGRADE[commit], done
    assert {n: done.get(n) for n in ADOPTED} == ADOPTED, done
    assert not any(n.endswith("-container") for n in done), done
    assert engine("up") == {}
    gone = stack.run("destroy", raw)
    assert gone.steps and all(s.op == "delete" for s in gone.steps)
    assert json.loads((stacks / "spark.json").read_text())["checkpoint"]["latest"].get(
        "resources"
    ) in (None, [])


def runpy_module(path: Path) -> dict[str, Any]:
    import runpy

    return runpy.run_path(str(path), run_name="fixture")
