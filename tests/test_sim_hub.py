"""A gated model on the SIMULATED cluster, from a hub stand-in of the sim's own (sim/hub.py,
a container on the sim network serving the tiny model as `sparkvllm/tiny-gated` behind a
token; no outside address). Without hf_token the `up` stops at the head's preflight with
the fix, and nothing on a node changes; with it, the head's check passes and the image's
own huggingface_hub downloads the weights with the token from stdin."""

from __future__ import annotations

import copy
import json
import shlex
from collections.abc import Iterator
from typing import Any

import pytest

from localengine.state import StateFile
from sim import stack
from sim.settings import REPO_ROOT
from sparkvllm.config import load_stack_config
from sparkvllm.specs import weights
from sparkvllm.specs.commands import CommandSpec
from tests.conftest import SimDeployment, sim_log

pytestmark = pytest.mark.sim

HEAD = "spark-1"
GATED = "sparkvllm/tiny-gated"
TOKEN = "hf_simHubToken7c41e0"
SCRATCH = "/root/hub-test-cache"  # a cache of its own on the head, removed after


@pytest.fixture(scope="module")
def hub(sim_deployment: SimDeployment) -> Iterator[str]:
    cluster = stack.cluster(quiet=True)
    endpoint = cluster.hub_up(GATED, TOKEN)
    yield endpoint
    cluster.hub_down()
    d = sim_deployment
    stack.run_on(d.cfg, d.access, HEAD, f"rm -rf {SCRATCH}")


def _gated_raw(endpoint: str, token: str | None = None, cache: str | None = None) -> dict[str, Any]:
    raw = copy.deepcopy(stack.stack_raw())
    raw["model"].update({"id": GATED, "offline": False, "hub_endpoint": endpoint})
    if cache:
        raw["model"]["hf_cache"] = cache
    if token:
        raw["hf_token"] = token
    return raw


def _containers(d: SimDeployment) -> dict[str, str]:
    listing = "docker ps -a --format '{{.Names}} {{.ID}} {{.State}}' | sort"
    return {n.name: stack.run_on(d.cfg, d.access, n.name, listing) for n in d.cfg.nodes}


def _run(d: SimDeployment, spec: CommandSpec, stdin: str) -> tuple[int, str, str]:
    from sparkvllm.remote import run_ssh

    result = run_ssh(d.access.targets[spec.node], spec.shell_command,
                     stdin=stdin, timeout=spec.timeout_s)  # fmt: skip
    return result.returncode, result.stdout, result.stderr


def test_a_gated_model_without_a_token_stops_at_the_head_preflight(
    sim_deployment: SimDeployment, hub: str
) -> None:
    d = sim_deployment
    before = _containers(d)
    failed = stack.engine("up", _gated_raw(hub), log=sim_log)
    assert failed.error, "a gated model without hf_token must not deploy"
    assert "is gated" in failed.error and "pulumi config set --secret hf_token" in failed.error
    sim_log(f"gated, no token: {failed.error.strip().splitlines()[-1]}")
    # Nothing on a node changed, nothing was downloaded, and the failed check is not in
    # the state (a failed create records nothing): the next `up` asks the hub again.
    assert _containers(d) == before
    repo = "/root/.cache/huggingface/hub/models--sparkvllm--tiny-gated"
    assert (
        stack.run_on(d.cfg, d.access, HEAD, f"test -e {repo} && echo yes || echo no").strip()
        == "no"
    )
    assert not any(r.name == f"{HEAD}-hub-access" for r in StateFile(REPO_ROOT, "sim").load())
    # The stack as deployed is untouched: a preview of its own config plans nothing.
    assert not [s for s in stack.engine("preview", log=sim_log).steps if s.op != "same"]


def test_with_the_token_the_check_passes_and_the_download_uses_it(
    sim_deployment: SimDeployment, hub: str
) -> None:
    d = sim_deployment
    cfg = load_stack_config(_gated_raw(hub, TOKEN, cache=SCRATCH))
    check = weights.hub_access(cfg)
    assert check is not None and check.stdin_secret == "hf_token"
    code, out, err = _run(d, check, TOKEN + "\n")
    assert code == 0 and json.loads(out.splitlines()[-1])["hub"] == "ok", (out, err)
    code, out, err = _run(d, check, "hf_notTheToken000\n")
    assert code == 1 and "hf_token has no access" in err, (out, err)
    # The download, as the model-download NodeStep runs it (token on stdin), into a cache
    # of its own: the image's huggingface_hub fetches every file from the stand-in.
    download = weights.weights_download(cfg, cfg.head_node)
    assert download.stdin_secret == "hf_token" and TOKEN not in download.create
    code, out, err = _run(d, download, TOKEN + "\n")
    assert code == 0, err[-2000:]
    got = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    # The same files as the tiny model every node already has (the manifest is of the
    # resolved files: names and sizes).
    served = stack.run_on(d.cfg, d.access, HEAD, weights.weights_read(d.cfg))
    assert f"manifest={got['manifest']}" in served, (got, served)
    assert int(got["files"]) >= 5
    sim_log(f"gated download with the token: {got['files']} files, {got['bytes']} bytes")
    # A second run finds the weights complete and asks the hub nothing.
    code, out, _ = _run(d, check, "")
    assert code == 0 and '"hub": "not-needed"' in out
    # The token reached no container's configuration and no log on the head.
    inspect = "docker ps -aq | xargs -r docker inspect"
    assert TOKEN not in stack.run_on(d.cfg, d.access, HEAD, inspect)
    logs = f"grep -rl {shlex.quote(TOKEN)} /var/log /root/.cache 2>/dev/null || true"
    assert stack.run_on(d.cfg, d.access, HEAD, logs).strip() == ""
