"""The model's weights on every node: complete (the RESOLVED files, not just the HF cache's
symlink layout), downloaded once, copied over the cluster link, and verified by a manifest.
A copy of the symlink layout alone, or an interrupted download, leaves dangling links: they
count as missing files here, never as success. The scripts: sparkvllm/scripts/weights_*.sh
and lib/weights.sh."""

from __future__ import annotations

import json

from sparkvllm import scripts
from sparkvllm.config import HUB_ENDPOINT, NodeConfig, StackConfig
from sparkvllm.specs.commands import MAX_STREAMS, CommandSpec, peer_env, peer_values
from sparkvllm.specs.environment import HF_HOME
from sparkvllm.specs.output import last_json
from sparkvllm.specs.scope import scoped

# The suffix of a blob whose copy is in progress (scripts/lib/weights.sh).
PART = ".sparkvllm-part"


def repo_dir(cfg: StackConfig) -> str:
    """The model's folder in the HF cache on the nodes (models--ORG--NAME)."""
    return f"{cfg.model.hf_cache}/hub/models--{cfg.model.id.replace('/', '--')}"


def hub_access(cfg: StackConfig) -> CommandSpec:
    """Preflight on the head: can it download the model, and how big are its weights (the
    memory plan's figure before anything is touched, `preflight_bytes`)?
    scripts/hub_access.sh with the probe (sparkvllm/probes/hub_access.py), which prints
    the hub's verdict with the size of the revision's files and, for a bad verdict, exits 1
    with its line from `hub_problems`: a failed check records nothing, so the next `up` asks
    again. Its stdin is the hf_token secret (empty when the stack has none). Copied from
    the head: a complete snapshot there is all the nodes need, and the hub is not asked;
    downloaded by each node: every node asks the hub, so the check always runs. Offline:
    the hub is never asked, and the step (named `-weights-size`) only reads the snapshot's
    size on the head."""
    m = cfg.model
    check = scripts.render(
        "hub_access",
        HEAD_NAME=cfg.head,
        COPY_FROM_HEAD=int(m.distribution == "copy_from_head"),
        OFFLINE=int(m.offline),
        REPO_DIR=repo_dir(cfg),
        REVISION=m.revision,
        HUB_ENDPOINT=m.hub_endpoint,
        MODEL_ID=m.id,
        PROBLEMS=json.dumps(hub_problems(cfg), sort_keys=True),
        PROBE=scripts.Probe("hub_access"),
    )
    step = "weights-size" if m.offline else "hub-access"
    return CommandSpec(
        name=scoped(cfg, f"{cfg.head}-{step}"), node=cfg.head, create=check.text,
        stdin_secret="hf_token", timeout_s=120, defines=check.identity,
    )  # fmt: skip


def preflight_bytes(stdout: str) -> int:
    """The weights' size the head's preflight (`hub_access`) found: 0 when not known."""
    said = last_json(stdout).get("bytes", 0)
    return said if isinstance(said, int) and not isinstance(said, bool) and said > 0 else 0


def hub_problems(cfg: StackConfig) -> dict[str, str]:
    """verdict -> its preflight line with the fix; `{said}` is replaced by what the hub
    said (its X-Error-Message or the network error), `{status}` by the HTTP status."""
    m = cfg.model
    where = f"model {m.id}@{m.revision} on {m.hub_endpoint}"
    set_token = "`pulumi config set --secret hf_token` (it prompts for the token)"
    return {
        "gated": (
            f"{where} is gated: downloading it needs an access token, and hf_token is not "
            f"set; fix: accept the model's terms on its page, create a read token, then "
            + set_token
        ),
        "no-access": (
            f"hf_token has no access to {where}{{said}}; fix: request access on the model's "
            "page with the token's account, or set the token of an account that has it"
        ),
        "bad-token": (
            f"the hub refused hf_token for {where}{{said}}; fix: set a valid read token with "
            + set_token
        ),
        "not-found": (
            f"{where} is not found (or private){{said}}; fix: check model.id, and set "
            "hf_token for a private model"
        ),
        "no-revision": f"{where}: no such revision{{said}}; fix: check model.revision",
        "unreachable": (
            f"{cfg.head} cannot reach {m.hub_endpoint}{{said}}; fix: check the head's network "
            "or proxy, or put the weights in its cache and set model.offline: true"
        ),
        "error": (
            f"{where}: the hub answered HTTP {{status}}{{said}}; fix: retry, or check "
            "model.hub_endpoint"
        ),
    }


def weights_download(cfg: StackConfig, node: NodeConfig) -> CommandSpec:
    """Make the model's weights complete in `node`'s HF cache (a no-op when they are):
    scripts/weights_download.sh. Missing files are downloaded with the image's own
    huggingface_hub into the mounted cache; offline, an incomplete snapshot is an error
    naming the missing files. Prints `manifest=`, `files=` and `bytes=` lines.

    Where the step may download, it reads a token from stdin (empty when the stack has
    none: huggingface_hub takes an empty HF_TOKEN as no token), so adding or removing the
    secret changes only the step's stdin, never its definition: nothing re-runs for it.
    """
    m = cfg.model
    download = scripts.render(
        "weights_download",
        NODE_NAME=node.name,
        MODEL_ID=m.id,
        REVISION=m.revision,
        REPO_DIR=repo_dir(cfg),
        HF_CACHE=m.hf_cache,
        HF_HOME_IN=HF_HOME,
        IMAGE=cfg.image.local_ref,
        OFFLINE=int(m.offline),
        TOKEN=int(not m.offline),
        HUB_ENDPOINT="" if m.hub_endpoint == HUB_ENDPOINT else m.hub_endpoint,
    )
    read = _read(cfg)
    return CommandSpec(
        name=scoped(cfg, f"model-download-{node.name}"), node=node.name, create=download.text,
        timeout_s=6 * 3600, stdin_secret=None if m.offline else "hf_token",
        read=read.text, state_key="manifest", defines=download.identity, reads=read.identity,
    )  # fmt: skip


def _read(cfg: StackConfig) -> scripts.Rendered:
    return scripts.render("weights_read", REPO_DIR=repo_dir(cfg), REVISION=cfg.model.revision)


def weights_read(cfg: StackConfig) -> str:
    """Prints `manifest=` of the weights on the node it runs on: the manifest of resolved
    files when complete, `incomplete` when a file is missing (deleted, a dangling link)."""
    return _read(cfg).text


def weights_state(cfg: StackConfig) -> str:
    """Bash printing `weights.manifest=` and `weights.gaps=` for the node it runs on (for
    the drift check: a node whose weights went incomplete or differ from the head's)."""
    return scripts.render("weights_state", REPO_DIR=repo_dir(cfg), REVISION=cfg.model.revision).text


def weights_sync(cfg: StackConfig, target: NodeConfig, host_key: str | None) -> CommandSpec:
    """Make `target`'s copy of the model equal the head's over the cluster link, moving
    only what it lacks; a no-op when the manifests of resolved files already match
    (scripts/weights_sync.sh: blob by blob, resumed where an interrupted copy stopped,
    each checked by content on the target before it takes its name; the target's free
    space checked first). Runs on the head with the SSH key on stdin; the target's user,
    port and host key come at run time (`peer_env`)."""
    sync = scripts.render(
        "weights_sync",
        **peer_values(cfg, target),
        MODEL_ID=cfg.model.id,
        REPO_DIR=repo_dir(cfg),
        REVISION=cfg.model.revision,
        HUB_DIR=f"{cfg.model.hf_cache}/hub",
        MAX_STREAMS=MAX_STREAMS,
        STRIPE=scripts.Probe("stripe"),
    )
    read = _read(cfg)
    return CommandSpec(
        name=scoped(cfg, f"model-sync-{target.name}"),
        node=cfg.head,
        create=sync.text,
        stdin_secret="ssh_private_key",
        env=peer_env(target, host_key),
        timeout_s=6 * 3600,
        read=read.text,
        read_node=target.name,
        state_key="manifest",
        defines=sync.identity,
        reads=read.identity,
    )
