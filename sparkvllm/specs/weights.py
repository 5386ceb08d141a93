"""The model's weights on every node: complete (the RESOLVED files, not just the HF cache's
symlink layout), downloaded once, copied over the cluster link, and verified by a manifest.
A copy of the symlink layout alone, or an interrupted download, leaves dangling links: they
count as missing files here, never as success."""

from __future__ import annotations

import json
import shlex

from sparkvllm.config import HUB_ENDPOINT, NodeConfig, StackConfig
from sparkvllm.probes import script
from sparkvllm.specs.commands import (
    AVAIL_FN,
    HUMAN_FN,
    CommandSpec,
    fail,
    peer_env,
    room_check,
    say,
    ssh_to_node_prelude,
)
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


# Content check of one blob: the HF cache names an LFS file's blob by its sha256 and any
# other file's by its git blob sha1, so the name is the checksum. Prints the blob's name
# when the content does not match it (a name of neither form is checked by size only).
# The suffix of a copy in progress (PART) is not part of the name.
PART = ".sparkvllm-part"
_GIT_SHA1 = '{ printf \'blob %s\\0\' "$(stat -c %s "$f")"; cat "$f"; } | sha1sum'
_FINISHED = f"-maxdepth 1 -type f ! -name '*.incomplete' ! -name '*{PART}'"
# The sha256 of stdin, as hex: openssl's where there is one (it uses the CPU's SHA
# instructions, x86 SHA-NI or Arm's SHA2 extensions: 5x coreutils' sha256sum on this
# machine), else sha256sum.
SHA256_FN = (
    "sha256() { if command -v openssl >/dev/null 2>&1; then openssl dgst -sha256 -r; "
    "else sha256sum; fi | cut -c1-64; }"
)
VERIFY_FN = "\n".join(
    [
        SHA256_FN,
        "verify_blob() {",
        f"  local f=$1 b; b=${{1##*/}}; b=${{b%{PART}}}",
        "  if [[ $b =~ ^[0-9a-f]{64}$ ]]; then",
        '    [ "$(sha256 < "$f")" = "$b" ] || echo "$b"',
        "  elif [[ $b =~ ^[0-9a-f]{40}$ ]]; then",
        f'    [ "$({_GIT_SHA1} | cut -c1-40)" = "$b" ] || echo "$b"',
        "  fi",
        "}",
        # Every finished blob of a folder, hashed on every core: the names that differ.
        "verify_all() {",
        '  [ -d "$1" ] || return 0',
        (
            f'  find "$1" {_FINISHED} -print0 | xargs -0 -r -P "$(nproc)" -n 1 '
            'bash -c "$(declare -f sha256 verify_blob); verify_blob \\"\\$1\\"" _'
        ),
        "}",
    ]
)


def _remote(script: str, *args: str) -> str:
    """A `remote` call that runs `script` under bash on the far side, with positional
    `args` (bash words on the head): quoted once for the head's shell, once for the
    target's login shell."""
    return " ".join(["remote bash -c", shlex.quote(shlex.quote(script)), "_", *args]).strip()


B = '"$b"'  # the blob's name, as a bash word


# The token (empty when the stack has none) is the first line of the step's stdin: read into
# the environment and handed to `docker run -e HF_TOKEN` by name, on no command line.
_READ_TOKEN = "IFS= read -r HF_TOKEN || true; export HF_TOKEN"


def hub_access(cfg: StackConfig) -> CommandSpec | None:
    """Preflight on the head: can it download the model (None when model.offline)? The
    probe (sparkvllm/probes/hub_access.py) prints the hub's verdict and, for a bad one,
    exits 1 with its line from `hub_problems`: a failed check records nothing, so the next
    `up` asks again. Its stdin is the hf_token secret (empty when the stack has none)."""
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
        stdin_secret="hf_token", timeout_s=120,
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
    # Where the step may download, it reads a token from stdin (empty when the stack has
    # none: huggingface_hub takes an empty HF_TOKEN as no token), so adding or removing
    # the secret changes only the step's stdin, never its text: nothing re-runs for it.
    token = not m.offline
    # Only what the stack uses: a stack without a mirror runs the same step.
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
    # A blob whose content does not match its name: offline, an error naming it (kept for
    # the user to look at); else removed, so that it counts as missing and comes again.
    corrupt = (
        fail(
            f"{where}: blobs do not match their names (checksums) and model.offline is true; "
            "fix: restore them (or set model.offline: false to download them again):",
            '"${bad[*]}"',
        )
        if m.offline
        else (
            f"{{ echo {shlex.quote(f'{where}: removing blobs that do not match their checksums:')}"
            ' "${bad[*]}" >&2; (cd "$repo/blobs" && rm -f -- "${bad[@]}"); }'
        )
    )
    still_bad = shlex.quote(
        f"{where}: downloaded blobs do not match their names (checksums); fix: check the "
        "hub endpoint and the disk, then re-run:"
    )
    create = "\n".join(
        [
            "set -euo pipefail",
            *([_READ_TOKEN] if token else []),
            MANIFEST_FN,
            INCOMPLETE_FN,
            VERIFY_FN,
            _snapshot_shell(cfg),
            'mapfile -t bad < <(verify_all "$repo/blobs")',
            f'[ "${{#bad[@]}}" -eq 0 ] || {corrupt}',
            SET_GAPS,
            'if [ -n "$gaps" ]; then',
            f"  {fetch}",
            f"  {_snapshot_shell(cfg)}",
            f"  {SET_GAPS}",
            f'  [ -z "$gaps" ] || {{ echo {still} "$gaps" >&2; exit 1; }}',
            '  mapfile -t bad < <(verify_all "$repo/blobs")',
            f'  [ "${{#bad[@]}}" -eq 0 ] || {{ echo {still_bad} "${{bad[*]}}" >&2; exit 1; }}',
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


def weights_copy(cfg: StackConfig, target: NodeConfig) -> list[str]:
    """Bash lines, run on the head with `remote CMD...` reaching `target`, that make
    `target`'s copy of the model equal the head's, moving only what it lacks (see
    weights_sync). Prints `transferred=`, `sent=` (bytes) and `manifest=`."""
    m = cfg.model
    repo = repo_dir(cfg)
    hub = f"{m.hf_cache}/hub"
    name = shlex.quote(repo.rsplit("/", 1)[1])
    blobs = shlex.quote(f"{repo}/blobs")
    part = f'{blobs}/"$1"{PART}'
    remote_manifest = f'{MANIFEST_FN}; {_snapshot_shell(cfg)}; manifest "$snap"'
    listing = f"cd {blobs} 2>/dev/null && find . -maxdepth 1 -type f -printf '%f %s\\n' || true"
    # On the target, as a blob's bytes arrive: appended to its part, and the sha256 of the
    # whole part (the bytes already there, then the new ones) computed on the way, so the
    # check costs no second read and runs alongside the transfer. Args: name, offset.
    receive = (
        f'{SHA256_FN}; p={part}; {{ head -c "$2" "$p" 2>/dev/null || true; tee -a "$p"; }} | sha256'
    )

    # Then: its size, its content (that sha256 for an LFS name, else verify_blob), and
    # only then its name. Args: name, size, the sha256 computed on arrival.
    finish = "\n".join(
        [
            "set -euo pipefail",
            VERIFY_FN,
            f"p={part}",
            '[ "$(stat -c %s "$p")" = "$2" ] || { echo "$1: short copy" >&2; exit 1; }',
            'if [[ $1 =~ ^[0-9a-f]{64}$ ]]; then [ "$3" = "$1" ] || { rm -f "$p"; exit 3; }',
            'elif [ -n "$(verify_blob "$p")" ]; then rm -f "$p"; exit 3; fi',
            f'mv -f "$p" {blobs}/"$1"',
        ]
    )
    unpack = f"mkdir -p {shlex.quote(hub)} && tar -C {shlex.quote(hub)} -xf -"
    no_room = f"not enough disk on {target.name} for {m.id}: {hub}"
    room_fix = "fix: free space there (or set model.hf_cache to a bigger disk)"
    head_bad = (
        f"a blob of {m.id} on {cfg.head} does not match its name (its checksum): the head's "
        "copy is corrupt; fix: delete it there and re-run `up` (the download fetches it again):"
    )
    link_bad = (
        f"a blob of {m.id} arrived corrupt on {target.name} (the head's copy is good); fix: "
        "re-run `up` (only that blob is sent again) and check the cluster link:"
    )
    not_blob = fail(f"not a blob name in {repo}/blobs:", B)
    clear = _remote(f'rm -f {blobs}/"$1" {part}', B)
    append = _remote(receive, B, '"$off"')
    check = _remote(finish, B, '"$s"', '"$got"')
    say_head_bad = say(head_bad, '"$repo/blobs/$b"')
    say_link_bad = say(link_bad, B)
    differ = fail(f"weights on {target.name} differ after copy:", '"$dst"', "!=", '"$src"')
    return [
        MANIFEST_FN,
        VERIFY_FN,
        HUMAN_FN,
        _snapshot_shell(cfg),
        'src=$(manifest "$snap")',
        f'[ -n "$src" ] || {fail(f"model {m.id} missing on {cfg.head}")}',
        f"dst=$({_remote(remote_manifest)} || true)",
        "sent=0",
        'if [ "$src" != "$dst" ]; then',
        f"  echo {shlex.quote(f'copying {m.id} {cfg.head} -> {target.name} (what it lacks)')} >&2",
        # What the target holds: finished blobs and the parts of interrupted copies.
        "  declare -A has=()",
        f'  while read -r f s; do [ -n "$f" ] && has[$f]=$s; done < <({_remote(listing)})',
        # The plan: each blob the target lacks, from the offset its part reached.
        "  plan=(); need=0",
        "  while read -r b s; do",
        f"    [[ $b =~ ^[0-9a-f]+$ ]] || {not_blob}",
        '    [ "${has[$b]:-}" = "$s" ] && continue',
        f'    off=${{has[$b{PART}]:-0}}; [ "$off" -le "$s" ] || off=0',
        '    plan+=("$b $s $off"); need=$((need + s - off))',
        f"  done < <(find \"$repo/blobs\" {_FINISHED} -printf '%f %s\\n')",
        f"  have=$({_remote(f'{AVAIL_FN}; avail {blobs}')})",
        f"  {room_check(no_room, room_fix)}",
        f"  {_remote(f'mkdir -p {blobs}')}",
        '  for item in "${plan[@]}"; do',
        '    read -r b s off <<< "$item"',
        '    if [ "$off" -gt 0 ]; then echo "resuming blob $b at byte $off of $s" >&2',
        f"    else {clear}; fi",
        f'    got=$(tail -c +$((off + 1)) "$repo/blobs/$b" | {append})',
        "    sent=$((sent + s - off))",
        f"    rc=0; {check} || rc=$?",
        '    if [ "$rc" -eq 3 ]; then',
        '      if [ -n "$(verify_blob "$repo/blobs/$b")" ]; then',
        f"        {say_head_bad}",
        f"      else {say_link_bad}; fi",
        "      exit 1",
        '    elif [ "$rc" -ne 0 ]; then exit "$rc"; fi',
        "  done",
        # Then the layout (the snapshot's symlinks and the refs): a few KB.
        f'  layout=({name}/snapshots/"$rev"); [ -d "$repo/refs" ] && layout+=({name}/refs)',
        f'  tar -C {shlex.quote(hub)} -cf - "${{layout[@]}}" | {_remote(unpack)}',
        f"  dst=$({_remote(remote_manifest)})",
        f'  [ "$src" = "$dst" ] || {differ}',
        "  echo transferred=1",
        "else",
        "  echo transferred=0",
        "fi",
        'echo sent="$sent"',
        'echo manifest="$dst"',
    ]


def weights_sync(cfg: StackConfig, target: NodeConfig, host_key: str | None) -> CommandSpec:
    """Make `target`'s copy of the model equal the head's over the cluster link, moving
    only what it lacks; a no-op when the manifests of resolved files already match.

    Blob by blob: a blob the target holds whole is not sent; one cut off by an interrupted
    copy (`<blob>.sparkvllm-part`) is resumed where it stopped; each is checked by content
    on the target (its name is its sha256, hashed as the bytes arrive, or its git sha1)
    before it takes its name, so a named
    blob on a node is a verified one. The target's free space is checked first (node,
    need, have). The snapshot's symlink layout and refs follow, and the manifests must then
    agree. Runs on the head with the SSH key on stdin.
    """
    return CommandSpec(
        name=f"model-sync-{target.name}",
        node=cfg.head,
        create="\n".join([*ssh_to_node_prelude(cfg, target), *weights_copy(cfg, target)]),
        stdin_secret="ssh_private_key",
        env=peer_env(target, host_key),
        timeout_s=6 * 3600,
        read=weights_read(cfg),
        read_node=target.name,
        state_key="manifest",
    )
