"""Upgrades cost what they must: every node command of the sim and spark stacks, as a
deployed stack holds it, against its golden copy (tests/golden/); on a difference, the
failure names what a stack deployed by the golden code would re-run and replace (a preview
of it with this checkout's program, tests/golden.py). And the rule the golden copies rest
on, shown: a reworded script re-runs nothing; a revised one re-runs its steps and what is
built on them."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest

from sparkvllm import scripts
from sparkvllm.config import load_stack_config
from sparkvllm.specs import commands, containers
from tests.golden import GOLDEN, STACKS, Deployed, differences, explain, read


@pytest.mark.parametrize("stack", STACKS)
def test_the_node_commands_are_their_golden_copies(
    stack: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployed = Deployed(stack, tmp_path, monkeypatch.setenv)
    golden = read((GOLDEN / f"{stack}.txt").read_text())
    diffs = differences(golden, deployed.golden())
    if diffs:
        deployed.put_back(golden)
        pytest.fail(explain(stack, diffs, deployed.plan(), {**golden, **deployed.golden()}))


@pytest.mark.parametrize(
    ("revised", "expected"),
    [
        # A message of the ray-ready wait (its library) and the guard's layout and
        # comments: the same steps, nothing runs, no container is replaced.
        (0, {}),
        # What they do changed (their revisions): the guard's new read is recorded; the
        # ray-ready wait, whose read-back still finds the raylets it recorded, is kept
        # (components/node_step.py `_wait_kept`): nothing runs, and the server (whose
        # labels carry the wait's generation) is not replaced.
        (1, {"model-server-ray-ready": "update", "model-server-guard": "update"}),
    ],
    ids=["reworded", "revised"],
)
def test_a_reworded_script_re_runs_nothing_and_a_revised_one_re_runs_its_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, revised: int, expected: dict[str, str]
) -> None:
    deployed = Deployed("sim", tmp_path, monkeypatch.setenv)
    now = deployed.golden()
    cfg = load_stack_config(deployed.raw)
    ray_head = containers.container_name("sim", "ray-head")
    server = containers.container_name("sim", "model-server")
    # The program rendered what these render.
    assert commands.ray_ready(cfg, ray_head).create == now["model-server-ray-ready"]["create"]
    assert commands.server_guard(cfg, server).read == now["model-server-guard"]["read"]

    load = scripts.load
    edits = {
        "lib/probe_loop": ("%s: not ready after %ss;", "%s: still not ready after %s seconds;"),
        "server_guard": ('case "$s" in', '# what the container is doing\ncase "$s" in  '),
    }

    def edited(name: str) -> scripts.Script:
        script = load(name)
        if name not in edits:
            return script
        old, new = edits[name]
        assert old in script.body
        return dataclasses.replace(
            script, body=script.body.replace(old, new), revision=script.revision + revised
        )

    monkeypatch.setattr(scripts, "load", edited)
    ready, guard = commands.ray_ready(cfg, ray_head), commands.server_guard(cfg, server)
    assert ready.create != now["model-server-ray-ready"]["create"]
    assert guard.read != now["model-server-guard"]["read"]
    same = (ready.defines == now["model-server-ray-ready"]["defines"],
            guard.reads == now["model-server-guard"]["reads"])  # fmt: skip
    assert same == (not revised, not revised)

    # A stack deployed by the code with these scripts, previewed with today's.
    before = copy.deepcopy(now)
    before["model-server-ray-ready"].update(create=ready.create, defines=str(ready.defines))
    before["model-server-guard"].update(read=str(guard.read), reads=str(guard.reads))
    deployed.put_back(before)
    plan = deployed.plan()
    assert plan == expected, plan
    if not revised:
        # A reworded script: the preview of that stack is all same.
        assert plan == {}
