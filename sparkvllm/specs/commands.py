"""One-shot node commands, each with its lifecycle: create is idempotent, delete undoes it.

Pure: strings and data. `components/` turns a CommandSpec into a pulumi-command
remote.Command or a NodeStep on the node; the local engine (localengine/) runs the same
resource inputs over ssh.

stdin: a command gets either literal text (a probe script) or, for `stdin_secret`, a secret
the component supplies (the SSH private key for node-to-node streaming, the HF token for
the weights download and its preflight). Secrets never
appear in a command line, so they never reach a log or an error message.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from sparkvllm import scripts
from sparkvllm.config import NodeConfig, StackConfig
from sparkvllm.probes import revision, script
from sparkvllm.specs import containers
from sparkvllm.specs.health import answers_check
from sparkvllm.specs.ssh import (
    ShellVar,
    SshOptions,
    SshTarget,
    known_hosts_line,
    node_options,
    relay_options,
)


@dataclass(frozen=True)
class CommandSpec:
    """A one-shot command on `node`. `timeout_s` bounds create; `delete` undoes it."""

    name: str
    node: str
    create: str
    delete: str | None = None
    stdin: str | None = None
    stdin_secret: Literal["ssh_private_key", "hf_token"] | None = None
    timeout_s: int = 300
    # How a refresh reads the step back (components/node_step.py): `read` runs on
    # `read_node` (default: `node`), changes nothing, and prints the value of `state_key`
    # that `create` printed when it left the node as it should be.
    read: str | None = None
    read_stdin: str | None = None
    read_node: str | None = None
    state_key: str | None = None
    # A wait budget the command reads from $WAIT_S at run time (not part of the command).
    wait_s: int | None = None
    # Values the command reads from its environment at run time, not part of its text: how
    # a node is reached (PEER_USER, PEER_PORT, PEER_HOST_KEY of the node a head-to-worker
    # step reaches). A new value re-runs nothing (the step's result does not depend on it).
    env: tuple[tuple[str, str], ...] = ()
    # What the step does, apart from its wording (sparkvllm/scripts: the scripts' names and
    # revisions, and the values): a step whose `defines` is unchanged re-runs for no new
    # text; one whose `reads` changed records its new read and runs nothing. None: the
    # texts themselves define it (a step not yet made of script files).
    defines: str | None = None
    reads: str | None = None

    @property
    def shell_command(self) -> str:
        """`create` as the node runs it: under bash whatever the user's login shell is
        (pulumi-command hands the string to the login shell), `env` assigned first."""
        return f"{env_assignments(self.env)}bash -c {shlex.quote(self.create)}"

    @property
    def shell_delete(self) -> str | None:
        return f"bash -c {shlex.quote(self.delete)}" if self.delete else None


def env_assignments(env: Sequence[tuple[str, str]]) -> str:
    """`NAME='value' ` words for a command line (values quoted; names are the program's)."""
    for name, _ in env:
        if not name.isidentifier():
            raise ValueError(f"not an environment variable name: {name!r}")
    return "".join(f"{name}={shlex.quote(value)} " for name, value in env)


# Identity of an image independent of the storage driver: the content of its layers and
# the config that decides what runs. `.Id` differs between graph drivers and the
# containerd store, so comparing IDs would re-transfer a multi-GB image on every run.
_FINGERPRINT_FORMAT = (
    "{{json .RootFS.Layers}}{{json .Config.Entrypoint}}{{json .Config.Cmd}}{{json .Config.Env}}"
)


def fingerprint_script(ref: str) -> str:
    """Prints the image fingerprint (sha256 hex), or nothing if the image is absent."""
    fmt = shlex.quote(_FINGERPRINT_FORMAT)
    return (
        f"f=$(docker image inspect --format {fmt} {shlex.quote(ref)} 2>/dev/null) && "
        "printf '%s' \"$f\" | sha256sum | cut -c1-64"
    )


def say(message: str, *words: str) -> str:
    """Bash that prints `message` (one literal word, whatever it holds), then the bash
    `words` (e.g. '"$b"', expanded at run time), on one stderr line: the one way a command
    here reports a problem, so no value is ever pasted into a quoted string by hand."""
    fmt = " ".join(["%s"] * (1 + len(words)))
    return " ".join([f"printf '{fmt}\\n'", shlex.quote(message), *words, ">&2"])


def fail(message: str, *words: str) -> str:
    """Bash: `say`, then exit 1."""
    return f"{{ {say(message, *words)}; exit 1; }}"


# A byte count as people read it: `human 3145745` prints 3.1 MB.
HUMAN_FN = (
    'human() { awk -v n="$1" \'BEGIN { split("B KB MB GB TB PB", u); i = 1; '
    'while (n >= 1000 && i < 6) { n /= 1000; i++ }; printf "%.1f %s", n, u[i] }\'; }'
)

# Bytes free where $1 is or would be (df of its nearest existing folder).
# No path (e.g. a failed `docker info` in $(...)): fails, printing nothing, instead of
# measuring the folder it runs in.
AVAIL_FN = (
    'avail() { local d=$1; [ -n "$d" ] || return 1; while [ ! -d "$d" ]; do '
    'd=$(dirname "$d"); done; df -B1 --output=avail "$d" | tail -n 1 | tr -d \' \'; }'
)


def room_check(where: str, fix: str) -> str:
    """Bash (HUMAN_FN defined) that stops unless $need bytes fit in the $have free:
    `<where> needs 3.1 MB, has 1.0 MB; <fix>`."""
    return (
        f'[ "$need" -le "$have" ] || {{ printf \'%s needs %s, has %s; %s\\n\' '
        f'{shlex.quote(where)} "$(human "$need")" "$(human "$have")" {shlex.quote(fix)} >&2; '
        "exit 1; }"
    )


def _id_script(ref: str) -> str:
    return f"docker image inspect --format '{{{{.Id}}}}' {shlex.quote(ref)}"


def image_obtain(cfg: StackConfig) -> CommandSpec:
    """Get the image onto the head exactly once: pull, load a tarball, or require it. A
    digest-pinned reference is then tagged with its local name (config
    ImageConfig.local_ref) and checked to carry that digest.

    Prints `id=` and `fingerprint=` lines.
    """
    img = cfg.image
    ref = shlex.quote(img.ref)
    run = shlex.quote(img.local_ref)
    head = cfg.head_node.name
    if img.source == "pull":
        get = f"docker pull {ref} >&2"
    elif img.source == "tarball":
        tar = shlex.quote(img.tarball or "")
        unreadable = f"image tarball {img.tarball} is not readable on {head}; fix: copy it "
        unreadable += "there or correct image.tarball"
        lacks = f"tarball {img.tarball} does not contain {img.ref}; fix: set image.ref to "
        lacks += "the tag inside the tarball"
        get = "\n".join(
            [
                f"test -r {tar} || {fail(unreadable)}",
                f"docker load -i {tar} >&2",
                f"docker image inspect {ref} >/dev/null 2>&1 || {fail(lacks)}",
            ]
        )
    else:
        absent = (
            f"image {img.ref} is not present on {head}; fix: load it there or set "
            "image.source to pull or tarball"
        )
        get = (
            f"docker image inspect {ref} >/dev/null 2>&1 || {fail(absent)}"
            if img.digest
            else fail(absent)
        )
    pin: list[str] = []
    if img.digest:
        pinned = f"{img.repository}@{img.digest}"
        differs = (
            f"image {img.local_ref} on {head} is not {pinned}; fix: remove that tag there "
            "(docker rmi) and run up again"
        )
        pin = [
            f"docker tag {ref} {run}",
            "fi",
            (
                "docker image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "
                f"{run} | grep -qxF {shlex.quote(pinned)} || {fail(differs)}"
            ),
        ]
    create = "\n".join(
        [
            "set -euo pipefail",
            f"if ! docker image inspect {run} >/dev/null 2>&1; then",
            get,
            *(pin or ["fi"]),
            f"echo id=$({_id_script(img.local_ref)})",
            f"echo fingerprint=$({fingerprint_script(img.local_ref)})",
        ]
    )
    return CommandSpec(
        name=f"image-obtain-{head}", node=head, create=create, timeout_s=3600,
        read=fingerprint_read(img.local_ref), state_key="fingerprint",
    )  # fmt: skip


def image_name(cfg: StackConfig) -> CommandSpec:
    """The name the containers run the image by, on the head: the config's local name
    when this step runs, printed as `name=`, with the image's ID and each registry digest
    it carries (`digest=repo@sha256:...`). Run after the obtain step; read back by its ID,
    so a name that came to mean another image re-runs it (and the containers follow).

    A later pin of the digest this image carries keeps the step (NodeStep `keep_if`,
    `name_kept_for`): the containers keep their name, which still means the pinned image,
    and nothing is replaced."""
    ref = cfg.image.local_ref
    head = cfg.head_node.name
    digests = "{{range .RepoDigests}}{{println .}}{{end}}"
    create = "\n".join(
        [
            "set -euo pipefail",
            f"echo name={shlex.quote(ref)}",
            f"echo id=$({_id_script(ref)})",
            (
                f"docker image inspect --format '{digests}' {shlex.quote(ref)}"
                " | sed -n 's/^./digest=&/p'"
            ),
        ]
    )
    return CommandSpec(
        name=f"image-name-{head}", node=head, create=create, timeout_s=120,
        read=f"echo id=$({_id_script(ref)} 2>/dev/null || true)", state_key="id",
    )  # fmt: skip


def name_kept_for(cfg: StackConfig) -> str | None:
    """The line (as image_name prints it) that keeps the containers' name when the
    config pins a digest: the image they run carries that digest."""
    img = cfg.image
    return f"digest={img.repository}@{img.digest}" if img.digest else None


def fingerprint_read(ref: str) -> str:
    """Prints `fingerprint=` of the image on the node it runs on (empty if absent)."""
    return f"echo fingerprint=$({fingerprint_script(ref)} || true)"


def _ssh_to(node: NodeConfig, *extra: str, peer: bool = False) -> str:
    """The ssh invocation from the head to `node` over the cluster link ($key, $kh, $cm
    set): every call of one step shares one connection (a master in the 0700 folder $cm),
    so a step's many short calls cost one handshake. `extra`: more option words. `peer`:
    the user and port are $PEER_USER and $PEER_PORT (`peer_env`), given at run time."""
    options = replace(
        node_options(node, ShellVar("key"), ShellVar("kh")), control_dir=ShellVar("cm"), extra=extra
    )
    return _over_cluster_link(node, options, peer)


def _over_cluster_link(node: NodeConfig, options: SshOptions, peer: bool = False) -> str:
    """ssh with `options` to `node`'s cluster-link address, as a bash line."""
    user: str | ShellVar = ShellVar("PEER_USER") if peer else node.ssh.user
    port: int | ShellVar = ShellVar("PEER_PORT") if peer else node.ssh.port
    return SshTarget(user, str(node.cluster_link.address), port, options).shell()


def peer_env(node: NodeConfig, host_key: str | None) -> tuple[tuple[str, str], ...]:
    """How a head-to-worker step reaches `node`, as run-time values (CommandSpec.env): its
    ssh user, port and pinned host key (empty: not verified, the config's opt-out)."""
    return (
        ("PEER_USER", node.ssh.user),
        ("PEER_PORT", str(node.ssh.port)),
        ("PEER_HOST_KEY", host_key or ""),
    )


def _peer_kh(node: NodeConfig) -> str:
    """Bash writing $kh from $PEER_PORT and $PEER_HOST_KEY (ssh.known_hosts_line's form)."""
    addr = shlex.quote(str(node.cluster_link.address))
    return (
        'if [ -z "$PEER_HOST_KEY" ]; then : > "$kh"; '
        f'elif [ "$PEER_PORT" = 22 ]; then printf \'%s %s\\n\' {addr} "$PEER_HOST_KEY" > "$kh"; '
        f'else printf \'[%s]:%s %s\\n\' {addr} "$PEER_PORT" "$PEER_HOST_KEY" > "$kh"; fi'
    )


def _kh_lines(targets: Sequence[tuple[NodeConfig, str | None]]) -> str:
    """known_hosts text for the head's (and the relay hops') ssh to `targets` over the
    cluster link: their pinned host keys."""
    return "".join(
        known_hosts_line(str(n.cluster_link.address), n.ssh.port, key) + "\n"
        for n, key in targets
        if key
    )


def ssh_to_nodes_prelude(
    cfg: StackConfig, targets: Sequence[tuple[str, NodeConfig, str | None]], peer: bool = False
) -> list[str]:
    """Bash lines (run on the head, SSH key on stdin) that define one function per target,
    `<function> CMD...`: ssh to that node over the cluster link with the key in a 0600 temp
    file removed on exit and its host key verified; then check each link answers. `peer`
    (one target): its user, port and host key come from `peer_env` at run time."""
    if peer and len(targets) != 1:
        raise ValueError("run-time access is for one target")
    head = cfg.head_node.name
    # On exit: each shared connection closed, the key and the rest removed.
    close = "; ".join(
        f"{_ssh_to(n, '-O', 'exit', peer=peer)} 2>/dev/null || true" for _, n, _k in targets
    )
    lines = [
        "set -euo pipefail",
        "umask 077",
        "key=$(mktemp); kh=$(mktemp); cm=$(mktemp -d)",
        f'cleanup() {{ {close}; rm -rf "$key" "$kh" "$cm"; }}',
        "trap cleanup EXIT",
        'cat > "$key"',
        _peer_kh(targets[0][1])
        if peer
        else f"printf '%s' {shlex.quote(_kh_lines([(n, k) for _, n, k in targets]))} > \"$kh\"",
    ]
    for function, target, _key in targets:
        address = target.cluster_link.address
        where = f"{head} cannot ssh to {target.name} at {address} over the cluster link"
        fix = "fix: let sshd listen on the cluster address and authorize the key for that user"
        unreachable = (
            fail(f"{where} (user, port):", '"$PEER_USER"', '"$PEER_PORT;"', shlex.quote(fix))
            if peer
            else fail(f"{where}:{target.ssh.port} as {target.ssh.user}; {fix}")
        )
        lines += [
            f'{function}() {{ {_ssh_to(target, peer=peer)} "$@"; }}',
            f"{function} true || {unreachable}",
        ]
    return lines


def ssh_to_node_prelude(cfg: StackConfig, target: NodeConfig) -> list[str]:
    """`ssh_to_nodes_prelude` for one target, reached by `remote CMD...`, its access given
    at run time (the step's env: `peer_env`)."""
    return ssh_to_nodes_prelude(cfg, [("remote", target, None)], peer=True)


_SIZE_FMT = shlex.quote("{{.Size}}")
_LAYERS_FMT = shlex.quote("{{json .RootFS.Layers}}")
# Every image's layers on the node it runs on (one JSON list a line).
_THEIR_LAYERS = (
    f'ids=$(docker image ls -q); [ -z "$ids" ] || docker image inspect -f {_LAYERS_FMT} $ids'
)
# Free bytes in docker's data root; fails (prints nothing) when docker cannot say where.
_DOCKER_ROOT_AVAIL = f'{AVAIL_FN}; avail "$(docker info -f {shlex.quote("{{.DockerRootDir}}")})"'


def _image_here(ref: str) -> list[str]:
    """Bash (on the head) that sets size, mine (its layers) and filter (the layer
    script) for the image `ref`, for `_image_there`."""
    q_ref = shlex.quote(ref)
    return [
        f"size=$(docker image inspect -f {_SIZE_FMT} {q_ref})",
        f"mine=$(docker image inspect -f {_LAYERS_FMT} {q_ref}) || mine=",
        f"filter={shlex.quote(script('image_layers'))}",
    ]


def _image_there(ref: str, fn: str) -> list[str]:
    """Bash (on the head, after `_image_here`) that sets, for the node `fn CMD...` reaches:
    `need` (what docker load takes in its data root: it unpacks the whole archive before
    it stores the layers the node lacks, so the image's size plus what it adds), `have`
    (free there; empty if docker could not say), and `held` of the image's `total`
    layers (what it holds already: an earlier version, an image on the same base)."""
    old_size = f"docker image inspect -f {_SIZE_FMT} {shlex.quote(ref)} 2>/dev/null"
    return [
        f"old=$({fn} {shlex.quote(old_size)} || true); old=${{old:-0}}",
        "need=$((size + (size > old ? size - old : 0)))",
        f"have=$({fn} bash -c {shlex.quote(shlex.quote(_DOCKER_ROOT_AVAIL))}) || have=",
        f"theirs=$({fn} {shlex.quote(_THEIR_LAYERS)} || true)",
        "held=0; total=0",
        'if [ -n "$mine" ] && [ -n "$theirs" ] && command -v python3 >/dev/null; then',
        (
            '  read -r held total < <(python3 -c "$filter" held "$mine" '
            "<(printf '%s\\n' \"$theirs\") || echo 0 0) || true"
        ),
        "fi",
    ]


def image_sync(cfg: StackConfig, target: NodeConfig, host_key: str | None) -> CommandSpec:
    """Stream the image from the head to `target` over the cluster link, if it differs.

    Runs on the head; stdin is the SSH private key (written to a 0600 temp file that is
    removed on exit). Skips the transfer when the fingerprints already match. When the
    target holds some of the image's layers (an earlier version, the same base), only the
    others are sent (probes/image_layers.py: `docker save` read once for its layer files,
    then again without the held ones), and the whole image if that load does not give the
    head's fingerprint. The target's free space is checked first. Nothing is staged on
    disk. Prints `transferred=0|1`, `id=` (the target's image ID) and `fingerprint=`.
    """
    ref = cfg.image.local_ref
    head = cfg.head_node.name
    fp = fingerprint_script(ref)
    q_ref = shlex.quote(ref)
    thin_failed = (
        f"{ref}: loading only the missing layers on {target.name} did not give the head's "
        "image; sending it whole"
    )
    holds = say(
        f"{ref}: {target.name} holds", '"$held"', shlex.quote("of its layers; sending the others")
    )
    differ = fail(f"image {ref} on {target.name} differs after transfer:", '"$dst"', "!=", '"$src"')
    no_room = f"not enough disk on {target.name} for the image {ref}: docker's data root"
    room_fix = (
        "fix: free space there (docker image prune; or move docker's data-root to a bigger disk)"
    )
    create = "\n".join(
        [
            *ssh_to_node_prelude(cfg, target),
            HUMAN_FN,
            # `|| true`: an absent image must reach the message below, not end the script
            # silently under `set -e`.
            f"src=$({fp} || true)",
            f'[ -n "$src" ] || {fail(f"image {ref} is missing on {head}")}',
            f"dst=$(remote {shlex.quote(fp)} || true)",
            'if [ "$src" != "$dst" ]; then',
            *(f"  {line}" for line in [*_image_here(ref), *_image_there(ref, "remote")]),
            f'  [ -z "$have" ] || {room_check(no_room, room_fix)}',
            # What the target holds of the image already: then only the other layers go.
            "  dst=",
            '  if [ "$held" -gt 0 ]; then',
            # Every layer held (an untagged or re-tagged copy): one read, no layer sent.
            '    if [ "$held" -eq "$total" ]; then',
            (
                f'      docker save {q_ref} | python3 -c "$filter" thin-all "$mine" '
                "| remote docker load >&2 || true"
            ),
            "    else",
            f"      {holds}",
            f'      paths=$(docker save {q_ref} | python3 -c "$filter" paths) || paths=',
            (
                f'      [ -z "$paths" ] || docker save {q_ref} | python3 -c "$filter" thin '
                '"$paths" "$mine" <(printf \'%s\\n\' "$theirs") | remote docker load >&2 || true'
            ),
            "    fi",
            f"    dst=$(remote {shlex.quote(fp)} || true)",
            f'    [ "$src" = "$dst" ] || {say(thin_failed)}',
            "  fi",
            '  if [ "$src" != "$dst" ]; then',
            f"    echo {shlex.quote(f'streaming {ref} {head} -> {target.name}')} >&2",
            f"    docker save {q_ref} | remote docker load >&2",
            f"    dst=$(remote {shlex.quote(fp)})",
            "  fi",
            f'  [ "$src" = "$dst" ] || {differ}',
            "  echo transferred=1",
            "else",
            "  echo transferred=0",
            "fi",
            f"echo id=$(remote {shlex.quote(_id_script(ref))})",
            'echo fingerprint="$dst"',
        ]
    )
    return CommandSpec(
        name=f"image-sync-{target.name}",
        node=head,
        create=create,
        stdin_secret="ssh_private_key",
        timeout_s=3600,
        read=fingerprint_read(ref),
        read_node=target.name,
        state_key="fingerprint",
        env=peer_env(target, host_key),
    )


def _relay_send(targets: Sequence[NodeConfig]) -> list[str]:
    """Bash ($HOP and $kh set) defining `send I J K...`: stream stdin to target I (an index
    into `targets`) over the cluster link as `bash -c "$HOP" hop J K...`, so that I loads
    it and sends it on to J, which sends it on to K."""
    cases = " ".join(f'{i}) {_relay_ssh(n)} "$c";;' for i, n in enumerate(targets))
    return [
        # POSIX single quotes: the next hop's login shell may not be bash.
        "q() { printf \"'%s'\" \"$(printf '%s' \"$1\" | sed \"s/'/'\\\\\\\\''/g\")\"; }",
        (
            'send() { local i=$1 c; shift; c="bash -c $(q "$HOP") hop $*"; '
            f"case $i in {cases} esac; }}"
        ),
    ]


def _relay_ssh(node: NodeConfig) -> str:
    """ssh from one relay hop to `node` (agent forwarded, $kh set)."""
    return _over_cluster_link(node, relay_options(node, ShellVar("kh")))


def _relay_hop(targets: Sequence[NodeConfig], host_keys: Mapping[str, str | None]) -> str:
    """What a relay hop runs, as `bash -c HOP hop [J K...]`: load the stream arriving on
    stdin while sending it on to J (then K...). HOP is this very text
    (BASH_EXECUTION_STRING), so each hop passes it on unchanged."""
    kh = _kh_lines([(n, host_keys.get(n.name)) for n in targets])
    return "\n".join(
        [
            "set -uo pipefail",
            "HOP=$BASH_EXECUTION_STRING",
            "tmp=$(mktemp -d); trap 'rm -rf \"$tmp\"' EXIT",
            f"printf '%s' {shlex.quote(kh)} > \"$tmp/kh\"; kh=$tmp/kh",
            *_relay_send(targets),
            "[ $# -gt 0 ] || exec docker load >&2",
            # Load here while sending on. The fifo holds no data: the stream passes through
            # memory. tee -p keeps loading here if the next hop fails (that node's own step
            # then streams to it from the head).
            'mkfifo "$tmp/load"; docker load < "$tmp/load" >&2 & loading=$!',
            'tee -p "$tmp/load" | send "$@" >&2; rc=$?',
            'wait "$loading" || rc=1',
            "exit $rc",
        ]
    )


def image_relay(
    cfg: StackConfig, targets: Sequence[NodeConfig], host_keys: Mapping[str, str | None]
) -> CommandSpec:
    """The image to several workers, leaving the head once: the workers that lack it form a
    chain, head -> w1 -> w2 -> ..., each loading the stream while passing it on
    (`_relay_hop`), so every link carries it once and the whole takes about one transfer's
    time, not one per worker.

    Two or more workers that hold none of the image's layers get it whole; otherwise two
    or more that hold some (an update: the version before) get one thin stream, without
    the layers every one of them holds (probes/image_layers.py, as `image-sync` does for
    one). A worker with the image, one without room for it, and one of a kind when the
    chain is of the other kind, are left to their own `image-sync-*` steps; so is
    everything when fewer than two workers are alike. Those steps run after this one,
    find the image in place (or send what a worker still lacks) and check every node's
    fingerprint. Best effort: a broken chain fails nothing here. Hops authenticate
    through the head's forwarded ssh-agent (the key is never written on a worker).
    Prints `relayed=` (the workers it gave the image to, comma separated).
    """
    ref = cfg.image.local_ref
    q_ref = shlex.quote(ref)
    fp = fingerprint_script(ref)
    hop = _relay_hop(targets, host_keys)
    lines = [
        *ssh_to_nodes_prelude(
            cfg, [(f"node{i}", n, host_keys.get(n.name)) for i, n in enumerate(targets)]
        ),
        f"src=$({fp} || true)",
        f'[ -n "$src" ] || {fail(f"image {ref} is missing on {cfg.head_node.name}")}',
        *_image_here(ref),
        "bare=(); bare_names=(); holders=(); holder_names=()",
    ]
    for i, n in enumerate(targets):
        # A candidate: lacks the image, has room for it, and holds none of its layers
        # (bare) or some but not all (a holder; what it holds is kept, in the step's
        # private folder $cm, for the thin stream).
        lines += [
            f'if [ "$(node{i} {shlex.quote(fp)} || true)" != "$src" ]; then',
            *(f"  {line}" for line in _image_there(ref, f"node{i}")),
            '  if [ -n "$have" ] && [ "$have" -ge "$need" ]; then',
            f'    if [ "$held" -eq 0 ]; then bare+=({i}); bare_names+=({n.name})',
            '    elif [ "$held" -lt "$total" ]; then',
            f"      holders+=({i}); holder_names+=({n.name})",
            f'      printf \'%s\\n\' "$theirs" > "$cm/held.{i}"',
            "    fi",
            "  fi",
            "fi",
        ]
    streaming = say(
        f"streaming {ref} {cfg.head_node.name} -> (relayed hop by hop)", '"${names[*]}"'
    )
    thin = say(f"{ref}: they hold some of its layers; sending the layers not all of them hold")
    broken = say(f"{ref}: the relay did not complete; each worker's own step sends what it lacks")
    no_agent = say(
        f"{ref}: ssh-agent on {cfg.head_node.name} did not take the key (it has a passphrase?); "
        "each worker's own step streams the image from the head"
    )
    lines += [
        "chain=(); names=(); held_files=()",
        'if [ "${#bare[@]}" -ge 2 ]; then chain=("${bare[@]}"); names=("${bare_names[@]}")',
        'elif [ "${#holders[@]}" -ge 2 ]; then',
        '  chain=("${holders[@]}"); names=("${holder_names[@]}")',
        '  for i in "${holders[@]}"; do held_files+=("$cm/held.$i"); done',
        "fi",
        "relayed=",
        'if [ "${#chain[@]}" -ge 2 ]; then',
        '  eval "$(ssh-agent -s)" >/dev/null',
        "  trap 'ssh-agent -k >/dev/null 2>&1; cleanup' EXIT",
        f'  ssh-add -q "$key" 2>/dev/null || {{ {no_agent}; chain=(); }}',
        "fi",
        'if [ "${#chain[@]}" -ge 2 ]; then',
        f"  HOP={shlex.quote(hop)}",
        *(f"  {line}" for line in _relay_send(targets)),
        f"  {streaming}",
        '  if [ "${#held_files[@]}" -gt 0 ]; then',
        f"    {thin}",
        # The layers none of them lacks are left out; a failed read sends nothing (the
        # workers' own steps then do).
        f'    paths=$(docker save {q_ref} | python3 -c "$filter" paths) || paths=',
        (
            f'    [ -n "$paths" ] && docker save {q_ref} | python3 -c "$filter" thin '
            '"$paths" "$mine" "${held_files[@]}" | send "${chain[@]}" >&2 || ' + broken
        ),
        "  else",
        f'    docker save {q_ref} | send "${{chain[@]}}" >&2 || {broken}',
        "  fi",
        '  for k in "${!chain[@]}"; do',
        f"    got=$(node${{chain[$k]}} {shlex.quote(fp)} || true)",
        '    [ "$got" != "$src" ] || relayed+="${relayed:+,}${names[$k]}"',
        "  done",
        "fi",
        'echo relayed="$relayed"',
    ]
    return CommandSpec(
        name="image-relay",
        node=cfg.head_node.name,
        create="\n".join(lines),
        stdin_secret="ssh_private_key",
        timeout_s=3600,
    )


RAY_SETTLE_S = 30


def ray_ready(cfg: StackConfig, ray_head: str) -> CommandSpec:
    """Wait until Ray reports every node (by its cluster IP) and every GPU, draining any
    other node (probes/ray_members.py: one just removed from the config still runs its
    Ray worker until this `up` ends, and the server must not be placed on it).

    Runs on the head, probing from inside the Ray head container (named `ray_head`):
    scripts/ray_ready.sh. Prints the membership JSON (nodes, gpus, missing, unexpected).
    """
    head = cfg.head_node.name
    # Sorted: the order of the node list is not a change.
    ips = ",".join(sorted(str(n.cluster_link.address) for n in cfg.nodes))
    wait = scripts.render(
        "ray_ready",
        CONTAINER=ray_head,
        PROBE_ARGS=[ips, str(cfg.total_gpus), "drain"],
        SETTLE_S=RAY_SETTLE_S,
    )
    read = scripts.render(
        "ray_members_read", CONTAINER=ray_head, PROBE_ARGS=[ips, str(cfg.total_gpus)]
    )
    return CommandSpec(
        name="model-server-ray-ready",
        node=head,
        create=wait.text,
        stdin=script("ray_members"),
        timeout_s=cfg.timeouts.ray_ready_s + 120,
        wait_s=cfg.timeouts.ray_ready_s,
        # Read back: the raylets Ray reports now, by ID (a restarted head or node has new
        # ones, and vLLM's Ray workers died with the old ones).
        read=read.text,
        read_stdin=script("ray_members"),
        state_key="json:node_ids",
        defines=scripts.identity(wait.identity, "ray_members", revision("ray_members")),
        reads=scripts.identity(read.identity, "ray_members", revision("ray_members")),
    )


def server_guard(cfg: StackConfig, server: str, launcher: str = containers.RAY) -> CommandSpec:
    """The model server's liveness, read back by refresh (scripts/server_guard.sh):
    `health=ok` while its container runs and generates a token (or while it is still
    loading), `health=bad` when it stopped, gave up starting, or once served and no longer
    generates within timeouts.answer_s (a stuck engine: its /health may still say 200). A
    bad reading replaces the guard and, through its generation label, the server
    container (named `server`). Native launcher: the server is rank 0 of a group that
    cannot take a rank back, so a rank 0 gone or started again is bad too."""
    answer_s = cfg.timeouts.answer_s
    read = scripts.render(
        "server_guard",
        CONTAINER=server,
        NATIVE=int(launcher == containers.NATIVE),
        ANSWER_S=answer_s,
        PROBE=answers_check(cfg.ports.api, cfg.model.name_for_clients, answer_s),
        GAVE_UP_MARK=containers.GAVE_UP,
    )
    return CommandSpec(
        name="model-server-guard", node=cfg.head, create="echo health=ok",
        read=read.text, state_key="health", timeout_s=60, reads=read.identity,
    )  # fmt: skip


def rank_guard(cfg: StackConfig, node: NodeConfig, rank: str) -> CommandSpec:
    """A worker rank's liveness (native launcher), read back by refresh on its node
    (scripts/rank_guard.sh): `health=bad` when its container (named `rank`) is gone,
    stopped or started again since it joined the group. A bad reading replaces this
    guard; its generation is a label of rank 0, so the whole group is replaced."""
    read = scripts.render("rank_guard", CONTAINER=rank)
    return CommandSpec(
        name=f"rank-guard-{node.name}", node=node.name, create="echo health=ok",
        read=read.text, state_key="health", timeout_s=60, reads=read.identity,
    )  # fmt: skip


PROBE_TRY_S = 360


def server_ready(cfg: StackConfig, server: str) -> CommandSpec:
    """Wait for the model server (the container named `server`) to load and answer; then
    print its health JSON (scripts/server_ready.sh).

    Bounded by timeouts.server_ready_s; logs progress (the server's last log line) every
    30 s so a 15-minute model load is visible in `pulumi up`.
    """
    wait = scripts.render(
        "server_ready",
        CONTAINER=server,
        PROBE_ARGS=[f"http://127.0.0.1:{cfg.ports.api}", cfg.model.name_for_clients],
        BUDGET=cfg.timeouts.server_ready_s,
        TRY_S=PROBE_TRY_S,
        GAVE_UP_MARK=containers.GAVE_UP,
    )
    return CommandSpec(
        name="model-server-health",
        node=cfg.head_node.name,
        create=wait.text,
        stdin=script("server_health"),
        timeout_s=cfg.timeouts.server_ready_s + 300,
        defines=scripts.identity(wait.identity, "server_health", revision("server_health")),
    )


def drop_page_cache(node: NodeConfig) -> CommandSpec:
    """Free the page cache on `node` (as root, or through passwordless sudo)."""
    drop = scripts.render("drop_page_cache", NODE=node.name, LOGIN_USER=node.ssh.user)
    return CommandSpec(
        name=f"model-server-drop-caches-{node.name}", node=node.name, create=drop.text,
        timeout_s=300, defines=drop.identity,
    )  # fmt: skip
