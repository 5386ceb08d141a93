"""The model's weights on every node: complete (the RESOLVED files, not just the HF cache's
symlink layout), downloaded once, copied over the cluster link, and verified by a manifest.
A copy of the symlink layout alone, or an interrupted download, leaves dangling links: they
count as missing files here, never as success."""

from __future__ import annotations

import json
import shlex

from sparkvllm.config import HUB_ENDPOINT, NodeConfig, StackConfig
from sparkvllm.probes import script
from sparkvllm.specs.commands import CommandSpec, fail, ssh_to_node_prelude
from sparkvllm.specs.environment import HF_HOME


def repo_dir(cfg: StackConfig) -> str:
    """The model's folder in the HF cache on the nodes (models--ORG--NAME)."""
    return f"{cfg.model.hf_cache}/hub/models--{cfg.model.id.replace('/', '--')}"


def _snapshot_shell(cfg: StackConfig) -> str:
    """Bash that sets $repo and $snap (the revision resolved through refs/)."""
    repo = shlex.quote(repo_dir(cfg))
    rev = shlex.quote(cfg.model.revision)
    return (
        f'repo={repo}; rev={rev}; [ -f "$repo/refs/$rev" ] && rev=$(cat "$repo/refs/$rev"); '
        'snap="$repo/snapshots/$rev"'
    )


# Manifest of the RESOLVED files (symlinks followed): "path size" lines, sorted, hashed.
# A dangling symlink (blob missing) is not a regular file under -L: the manifest changes.
MANIFEST_FN = (
    'manifest() { [ -d "$1" ] || return 0; (cd "$1" && find -L . -type f -printf \'%P %s\\n\' '
    "| LC_ALL=C sort | sha256sum | cut -c1-64); }"
)


# Files the snapshot needs but lacks, one per line: config.json, dangling symlinks (the
# blob is missing: an interrupted download or a copy of the symlink layout only), and any
# shard a weight index (*.index.json) names that is not there.
INCOMPLETE_FN = "\n".join(
    [
        "incomplete() {",
        '  [ -f "$1/config.json" ] || echo config.json',
        '  [ -d "$1" ] || return 0',
        "  find \"$1\" -xtype l -printf '%P\\n'",
        '  for idx in "$1"/*.index.json; do',
        '    [ -f "$idx" ] || continue',
        '    grep -o \'"[^"]*\\.\\(safetensors\\|bin\\)"\' "$idx" | tr -d \'"\' | sort -u |',
        '      while read -r f; do [ -f "$1/$f" ] || echo "$f"; done || true',
        "  done",
        "}",
    ]
)


# The first five gaps on one line (awk reads all input: no SIGPIPE under pipefail).
SET_GAPS = """gaps=$(incomplete "$snap" | awk 'NR <= 5' | tr '\\n' ' ')"""


# The token, when the stack has one, is the first line of the step's stdin: read into the
# environment and handed to `docker run -e HF_TOKEN` by name, so it is on no command line.
_READ_TOKEN = "IFS= read -r HF_TOKEN || true; export HF_TOKEN"


def hub_access(cfg: StackConfig) -> CommandSpec | None:
    """Preflight on the head: can it download the model (None when model.offline)? The
    probe (sparkvllm/probes/hub_access.py) prints the hub's verdict and, for a bad one,
    exits 1 with its line from `hub_problems`: a failed check records nothing, so the next
    `up` asks again. The hf_token secret, when set, is the stdin."""
    m = cfg.model
    if m.offline:
        return None
    args = (m.hub_endpoint, m.id, m.revision, json.dumps(hub_problems(cfg), sort_keys=True))
    probe = " ".join(
        ["python3", "-c", shlex.quote(script("hub_access"))] + [shlex.quote(a) for a in args]
    )
    # Copied from the head: a complete snapshot there is all the nodes need from the hub.
    # Downloaded by each node: every node asks the hub, so the check always runs.
    skip_when_complete = (
        [
            INCOMPLETE_FN,
            _snapshot_shell(cfg),
            SET_GAPS,
            'if [ -z "$gaps" ]; then echo \'{"hub": "not-needed"}\'; exit 0; fi',
        ]
        if m.distribution == "copy_from_head"
        else []
    )
    create = "\n".join(
        [
            "set -euo pipefail",
            *skip_when_complete,
            "command -v python3 >/dev/null || "
            + fail(f"{cfg.head}: no python3 to ask the hub with; fix: install python3 there"),
            probe,
        ]
    )
    return CommandSpec(
        name=f"{cfg.head}-hub-access", node=cfg.head, create=create,
        stdin_secret="hf_token" if cfg.hf_token is not None else None, timeout_s=120,
    )  # fmt: skip


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
    """Make the model's weights complete in `node`'s HF cache (a no-op when they are).

    Complete means config.json, every file the snapshot links to and every shard its
    weight index names are there (see INCOMPLETE_FN). Missing files are downloaded with the
    image's own huggingface_hub into the mounted cache (it fetches only what is missing).
    Offline, an incomplete snapshot is an error naming the missing files. Prints
    `manifest=`, `files=` and `bytes=` lines.
    """
    m = cfg.model
    # The token goes in (on stdin) only where the step may download.
    token = cfg.hf_token is not None and not m.offline
    # Only what the stack uses: a stack without a token or a mirror runs the same step.
    hub_env = "".join(
        [
            " -e HF_TOKEN" if token else "",
            f" -e HF_ENDPOINT={shlex.quote(m.hub_endpoint)}"
            if m.hub_endpoint != HUB_ENDPOINT
            else "",
        ]
    )
    download = (
        f"docker run --rm --entrypoint python3 -v {shlex.quote(m.hf_cache)}:{HF_HOME} "
        f"-e HF_HOME={HF_HOME}{hub_env} {shlex.quote(cfg.image.local_ref)} -c "
        + shlex.quote(
            "from huggingface_hub import snapshot_download as d; "
            f"print(d({m.id!r}, revision={m.revision!r}))"
        )
        + " >&2"
    )
    where = f"model {m.id}@{m.revision} in {m.hf_cache} on {node.name}"
    offline = shlex.quote(
        f"{where} is incomplete and model.offline is true; fix: complete the files there "
        "(or set model.offline: false to let it download). Missing:"
    )
    still = shlex.quote(
        f"{where} is still incomplete after the download; fix: check the revision and the "
        "disk, then re-run. Missing:"
    )
    fetch = f'echo {offline} "$gaps" >&2; exit 1' if m.offline else download
    create = "\n".join(
        [
            "set -euo pipefail",
            *([_READ_TOKEN] if token else []),
            MANIFEST_FN,
            INCOMPLETE_FN,
            _snapshot_shell(cfg),
            SET_GAPS,
            'if [ -n "$gaps" ]; then',
            f"  {fetch}",
            f"  {_snapshot_shell(cfg)}",
            f"  {SET_GAPS}",
            f'  [ -z "$gaps" ] || {{ echo {still} "$gaps" >&2; exit 1; }}',
            "fi",
            'echo manifest=$(manifest "$snap")',
            'echo files=$(find -L "$snap" -type f | wc -l)',
            (
                "echo bytes=$(find -L \"$snap\" -type f -printf '%s\\n'"
                " | awk '{s+=$1} END {print s+0}')"
            ),
        ]
    )
    return CommandSpec(
        name=f"model-download-{node.name}", node=node.name, create=create, timeout_s=6 * 3600,
        stdin_secret="hf_token" if token else None,
        read=weights_read(cfg), state_key="manifest",
    )  # fmt: skip


def weights_read(cfg: StackConfig) -> str:
    """Prints `manifest=` of the weights on the node it runs on: the manifest of resolved
    files when complete, `incomplete` when a file is missing (deleted, a dangling link)."""
    return "\n".join(
        [
            MANIFEST_FN,
            INCOMPLETE_FN,
            _snapshot_shell(cfg),
            SET_GAPS,
            (
                'if [ -n "$gaps" ]; then echo manifest=incomplete; '
                'else echo manifest=$(manifest "$snap"); fi'
            ),
        ]
    )


def weights_state(cfg: StackConfig) -> str:
    """Bash printing `weights.manifest=` and `weights.gaps=` for the node it runs on (for
    the drift check: a node whose weights went incomplete or differ from the head's)."""
    return "\n".join(
        [
            MANIFEST_FN,
            INCOMPLETE_FN,
            _snapshot_shell(cfg),
            SET_GAPS,
            'echo weights.manifest=$(manifest "$snap")',
            'echo weights.gaps="$gaps"',
        ]
    )


def weights_sync(cfg: StackConfig, target: NodeConfig, host_key: str | None) -> CommandSpec:
    """Copy the model from the head to `target` over the cluster link unless the manifest of
    resolved files already matches; verify the manifest afterwards. Runs on the head with
    the SSH key on stdin. Prints `transferred=0|1` and `manifest=`."""
    repo = repo_dir(cfg)
    hub = f"{cfg.model.hf_cache}/hub"
    name = repo.rsplit("/", 1)[1]
    remote_manifest = f'{MANIFEST_FN}; {_snapshot_shell(cfg)}; manifest "$snap"'
    create = "\n".join(
        [
            *ssh_to_node_prelude(cfg, target, host_key),
            MANIFEST_FN,
            _snapshot_shell(cfg),
            'src=$(manifest "$snap")',
            f'[ -n "$src" ] || {fail(f"model {cfg.model.id} missing on {cfg.head}")}',
            f"dst=$(remote bash -c {shlex.quote(shlex.quote(remote_manifest))} || true)",
            'if [ "$src" != "$dst" ]; then',
            f"  echo {shlex.quote(f'copying {cfg.model.id} {cfg.head} -> {target.name}')} >&2",
            # tar keeps the blobs/ + snapshots/ symlink layout and copies the blobs themselves.
            f"  tar -C {shlex.quote(hub)} -cf - {shlex.quote(name)} | remote "
            + shlex.quote(f"mkdir -p {shlex.quote(hub)} && tar -C {shlex.quote(hub)} -xf -"),
            f"  dst=$(remote bash -c {shlex.quote(shlex.quote(remote_manifest))})",
            (
                '  [ "$src" = "$dst" ] || { printf \'%s: %s != %s\\n\' '
                f"{shlex.quote(f'weights on {target.name} differ after copy')}"
                ' "$dst" "$src" >&2; exit 1; }'
            ),
            "  echo transferred=1",
            "else",
            "  echo transferred=0",
            "fi",
            'echo manifest="$dst"',
        ]
    )
    return CommandSpec(
        name=f"model-sync-{target.name}",
        node=cfg.head,
        create=create,
        stdin_secret="ssh_private_key",
        timeout_s=6 * 3600,
        read=weights_read(cfg),
        read_node=target.name,
        state_key="manifest",
    )
