"""The model on the nodes: does the image implement it, and are its weights (the RESOLVED
files, not just the symlink layout) on every node, downloaded once.

Pain points: an image that lacks the model's code found out after a 15-minute load (the
seed), a model downloaded twice, an rsync of the HF symlink layout that copied no weights
yet reported success (field notes, pain 5).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from sparkvllm.config import NodeConfig, StackConfig
from sparkvllm.probes import script
from sparkvllm.specs.commands import CommandSpec, fail, ssh_to_node_prelude
from sparkvllm.specs.environment import HF_HOME

# Architectures whose first supporting vLLM release we know (for the error message).
SUPPORTED_SINCE = {
    "Qwen3_5MoeForConditionalGeneration": "0.17.0",
    "Qwen3_5ForConditionalGeneration": "0.17.0",
}


def model_support(cfg: StackConfig) -> CommandSpec:
    """Run the vllm_support probe in the image on the head (no GPU, vLLM not imported)."""
    m = cfg.model
    args = [m.id, m.revision, HF_HOME, "1" if m.offline else "0"]
    create = (
        f"docker run --rm -i --entrypoint python3 -v {shlex.quote(m.hf_cache)}:{HF_HOME} "
        f"{'--network none ' if m.offline else ''}{shlex.quote(cfg.image.ref)} - "
        + " ".join(shlex.quote(a) for a in args)
    )
    return CommandSpec(
        name=f"image-support-{cfg.head}",
        node=cfg.head,
        create=create,
        stdin=script("vllm_support"),
        timeout_s=600,
    )


def check_model_support(cfg: StackConfig, stdout: str) -> list[str]:
    """Problems that mean this image cannot serve this model."""
    from sparkvllm.specs.health import last_json

    report: dict[str, Any] = last_json(stdout)
    ref, model = cfg.image.ref, f"{cfg.model.id}@{cfg.model.revision}"
    if not report:
        return [f"model check printed nothing usable on {cfg.head}: {stdout[-300:]!r}"]
    if "error" in report:
        return [
            (
                f"cannot read the architectures of {model}: {report['error']}; fix: check "
                "model.id and model.revision, or put the model in the HF cache (model.offline)"
            )
        ]
    if not report.get("vllm_found"):
        return [f"image {ref} contains no vLLM package; fix: use a vLLM image"]
    version = report.get("vllm_version") or "unknown"
    problems = []
    archs = report.get("architectures") or []
    if not archs:
        problems.append(f"{model} config.json lists no architectures; fix: check the model")
    for arch in archs:
        found = report.get("support", {}).get(arch, {})
        if not found.get("module"):
            since = SUPPORTED_SINCE.get(arch)
            hint = f" (supported from {since})" if since else ""
            fix = f"use an image with vLLM >= {since}" if since else "use a newer vLLM image"
            problems.append(
                f"image {ref} has vLLM {version}, which does not implement {arch}{hint}; fix: {fix}"
            )
        elif not found.get("module_file"):
            problems.append(
                f"image {ref} (vLLM {version}) registers {arch} in module {found['module']} "
                "but that file is missing from the image; fix: rebuild or use another image"
            )
    return problems


def _repo_dir(cfg: StackConfig) -> str:
    return f"{cfg.model.hf_cache}/hub/models--{cfg.model.id.replace('/', '--')}"


def _snapshot_shell(cfg: StackConfig) -> str:
    """Bash that sets $repo and $snap (the revision resolved through refs/)."""
    repo = shlex.quote(_repo_dir(cfg))
    rev = shlex.quote(cfg.model.revision)
    return (
        f'repo={repo}; rev={rev}; [ -f "$repo/refs/$rev" ] && rev=$(cat "$repo/refs/$rev"); '
        'snap="$repo/snapshots/$rev"'
    )


# Manifest of the RESOLVED files (symlinks followed): "path size" lines, sorted, hashed.
# A dangling symlink (blob missing) is not a regular file under -L: the manifest changes.
MANIFEST = (
    'manifest() { [ -d "$1" ] || return 0; (cd "$1" && find -L . -type f -printf \'%P %s\\n\' '
    "| LC_ALL=C sort | sha256sum | cut -c1-64); }"
)


# Files the snapshot needs but lacks, one per line: config.json, dangling symlinks (the
# blob is missing: an interrupted download or a copy of the symlink layout only), and any
# shard a weight index (*.index.json) names that is not there.
INCOMPLETE = "\n".join(
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
GAPS = """gaps=$(incomplete "$snap" | awk 'NR <= 5' | tr '\\n' ' ')"""


def weights_download(cfg: StackConfig, node: NodeConfig) -> CommandSpec:
    """Make the model's weights complete in `node`'s HF cache (a no-op when they are).

    Complete means config.json, every file the snapshot links to and every shard its
    weight index names are there (see INCOMPLETE). Missing files are downloaded with the
    image's own huggingface_hub into the mounted cache (it fetches only what is missing).
    Offline, an incomplete snapshot is an error naming the missing files. Prints
    `manifest=`, `files=` and `bytes=` lines.
    """
    m = cfg.model
    download = (
        f"docker run --rm --entrypoint python3 -v {shlex.quote(m.hf_cache)}:{HF_HOME} "
        f"-e HF_HOME={HF_HOME} {shlex.quote(cfg.image.ref)} -c "
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
            MANIFEST,
            INCOMPLETE,
            _snapshot_shell(cfg),
            GAPS,
            'if [ -n "$gaps" ]; then',
            f"  {fetch}",
            f"  {_snapshot_shell(cfg)}",
            f"  {GAPS}",
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
        name=f"weights-{node.name}", node=node.name, create=create, timeout_s=6 * 3600,
        read=weights_read(cfg), state_key="manifest",
    )  # fmt: skip


def weights_read(cfg: StackConfig) -> str:
    """Prints `manifest=` of the weights on the node it runs on: the manifest of resolved
    files when complete, `incomplete` when a file is missing (deleted, a dangling link)."""
    return "\n".join(
        [
            MANIFEST,
            INCOMPLETE,
            _snapshot_shell(cfg),
            GAPS,
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
            MANIFEST,
            INCOMPLETE,
            _snapshot_shell(cfg),
            GAPS,
            'echo weights.manifest=$(manifest "$snap")',
            'echo weights.gaps="$gaps"',
        ]
    )


def weights_sync(cfg: StackConfig, target: NodeConfig, host_key: str | None) -> CommandSpec:
    """Copy the model from the head to `target` over the cluster link unless the manifest of
    resolved files already matches; verify the manifest afterwards. Runs on the head with
    the SSH key on stdin. Prints `transferred=0|1` and `manifest=`."""
    repo = _repo_dir(cfg)
    hub = f"{cfg.model.hf_cache}/hub"
    name = repo.rsplit("/", 1)[1]
    remote_manifest = f'{MANIFEST}; {_snapshot_shell(cfg)}; manifest "$snap"'
    create = "\n".join(
        [
            *ssh_to_node_prelude(cfg, target, host_key),
            MANIFEST,
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
        name=f"weights-sync-{target.name}",
        node=cfg.head,
        create=create,
        stdin_secret="ssh_private_key",
        timeout_s=6 * 3600,
        read=weights_read(cfg),
        read_node=target.name,
        state_key="manifest",
    )


def describe(report_stdout: str) -> dict[str, Any]:
    """The support report as a dict for outputs (empty when unparsable)."""
    from sparkvllm.specs.health import last_json

    r = last_json(report_stdout)
    return {
        "vllm_version": r.get("vllm_version", ""),
        "ray_version": r.get("ray_version", ""),
        "architectures": r.get("architectures", []),
        "support": json.loads(json.dumps(r.get("support", {}))),
    }
