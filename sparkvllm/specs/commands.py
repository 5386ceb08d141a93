"""One-shot node commands, each with its lifecycle: create is idempotent, delete undoes it.

Pure: strings and data. `components/` turns a CommandSpec into a pulumi-command
remote.Command or a NodeStep on the node; the local engine (localengine/) runs the same
resource inputs over ssh.

stdin: a command gets either literal text (a probe script) or, for `stdin_secret`, a secret
the component supplies (the SSH private key for node-to-node streaming). Secrets never
appear in a command line, so they never reach a log or an error message.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Literal

from sparkvllm.config import NodeConfig, StackConfig
from sparkvllm.probes import script
from sparkvllm.specs.containers import container_name
from sparkvllm.specs.ssh import ShellVar, SshTarget, known_hosts_line, node_options


@dataclass(frozen=True)
class CommandSpec:
    """A one-shot command on `node`. `timeout_s` bounds create; `delete` undoes it."""

    name: str
    node: str
    create: str
    delete: str | None = None
    stdin: str | None = None
    stdin_secret: Literal["ssh_private_key"] | None = None
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

    @property
    def shell_command(self) -> str:
        """`create` as the node runs it: under bash whatever the user's login shell is
        (pulumi-command hands the string to the login shell)."""
        return f"bash -c {shlex.quote(self.create)}"

    @property
    def shell_delete(self) -> str | None:
        return f"bash -c {shlex.quote(self.delete)}" if self.delete else None


# Identity of an image independent of the storage driver: the content of its layers and
# the config that decides what runs. `.Id` differs between graph drivers and the
# containerd store, which made tools re-transfer multi-GB images every run (pain 7).
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


def fail(message: str) -> str:
    """Bash that prints `message` on stderr (one literal word, whatever it holds) and exits
    1: the one way a command here reports a problem, so no value is ever pasted into a
    quoted string by hand."""
    return f"{{ printf '%s\\n' {shlex.quote(message)} >&2; exit 1; }}"


def _id_script(ref: str) -> str:
    return f"docker image inspect --format '{{{{.Id}}}}' {shlex.quote(ref)}"


def image_obtain(cfg: StackConfig) -> CommandSpec:
    """Get the image onto the head exactly once: pull, load a tarball, or require it.

    Prints `id=` and `fingerprint=` lines.
    """
    img = cfg.image
    ref = shlex.quote(img.ref)
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
        get = fail(
            f"image {img.ref} is not present on {head}; fix: load it there or set "
            "image.source to pull or tarball"
        )
    create = "\n".join(
        [
            "set -euo pipefail",
            f"if ! docker image inspect {ref} >/dev/null 2>&1; then",
            get,
            "fi",
            f"echo id=$({_id_script(img.ref)})",
            f"echo fingerprint=$({fingerprint_script(img.ref)})",
        ]
    )
    return CommandSpec(
        name=f"image-obtain-{head}", node=head, create=create, timeout_s=3600,
        read=fingerprint_read(img.ref), state_key="fingerprint",
    )  # fmt: skip


def fingerprint_read(ref: str) -> str:
    """Prints `fingerprint=` of the image on the node it runs on (empty if absent)."""
    return f"echo fingerprint=$({fingerprint_script(ref)} || true)"


def _ssh_to(node: NodeConfig) -> str:
    """The ssh invocation from the head to `node` over the cluster link ($key, $kh set)."""
    options = node_options(node, ShellVar("key"), ShellVar("kh"))
    return SshTarget(node.ssh.user, str(node.cluster_link.address), node.ssh.port, options).shell()


def ssh_to_node_prelude(cfg: StackConfig, target: NodeConfig, host_key: str | None) -> list[str]:
    """Bash lines (run on the head, SSH key on stdin) that define `remote CMD...`: ssh to
    `target` over the cluster link with the key in a 0600 temp file removed on exit and
    the host key verified; then check the link answers."""
    head = cfg.head_node.name
    kh_line = (
        known_hosts_line(str(target.cluster_link.address), target.ssh.port, host_key)
        if host_key
        else ""
    )
    unreachable = (
        f"{head} cannot ssh to {target.name} at {target.cluster_link.address}:"
        f"{target.ssh.port} over the cluster link; fix: let sshd listen on the cluster "
        f"address and authorize the key for {target.ssh.user}"
    )
    return [
        "set -euo pipefail",
        "umask 077",
        'key=$(mktemp); kh=$(mktemp); trap \'rm -f "$key" "$kh"\' EXIT',
        'cat > "$key"',
        f"printf '%s\\n' {shlex.quote(kh_line)} > \"$kh\"",
        f'remote() {{ {_ssh_to(target)} "$@"; }}',
        f"remote true || {fail(unreachable)}",
    ]


def image_sync(cfg: StackConfig, target: NodeConfig, host_key: str | None) -> CommandSpec:
    """Stream the image from the head to `target` over the cluster link, if it differs.

    Runs on the head; stdin is the SSH private key (written to a 0600 temp file that is
    removed on exit). Skips the transfer when the fingerprints already match. Prints
    `transferred=0|1`, `id=` (the target's image ID) and `fingerprint=` lines.
    """
    ref = cfg.image.ref
    head = cfg.head_node.name
    fp = fingerprint_script(ref)
    create = "\n".join(
        [
            *ssh_to_node_prelude(cfg, target, host_key),
            # `|| true`: an absent image must reach the message below, not end the script
            # silently under `set -e`.
            f"src=$({fp} || true)",
            f'[ -n "$src" ] || {fail(f"image {ref} is missing on {head}")}',
            f"dst=$(remote {shlex.quote(fp)} || true)",
            'if [ "$src" != "$dst" ]; then',
            f"  echo {shlex.quote(f'streaming {ref} {head} -> {target.name}')} >&2",
            f"  docker save {shlex.quote(ref)} | remote docker load >&2",
            f"  dst=$(remote {shlex.quote(fp)})",
            (
                '  [ "$src" = "$dst" ] || { printf \'%s: %s != %s\\n\' '
                f"{shlex.quote(f'image {ref} on {target.name} differs after transfer')}"
                ' "$dst" "$src" >&2; exit 1; }'
            ),
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
    )


class NodesDisagreeError(Exception):
    """Nodes report different values for something that must be the same everywhere."""


def same_on_every_node(by_node: dict[str, str], subject: str) -> str:
    """The one value every node reported, else NodesDisagreeError naming each node's.

    >>> same_on_every_node({"spark-1": "ab", "spark-2": "ab"}, "image differs")
    'ab'
    """
    distinct = set(by_node.values())
    if len(distinct) != 1 or "" in distinct:
        detail = ", ".join(f"{n}={v[:12] or 'missing'}" for n, v in sorted(by_node.items()))
        raise NodesDisagreeError(f"{subject} across nodes: {detail}")
    return distinct.pop()


def parse_kv(stdout: str) -> dict[str, str]:
    """`key=value` lines of a command's output (later lines win)."""
    out: dict[str, str] = {}
    for line in stdout.splitlines():
        k, sep, v = line.partition("=")
        if sep and k.isidentifier():
            out[k] = v.strip()
    return out


def _probe_loop(
    *,
    container: str,
    args: list[str],
    timeout_s: int,
    what: str,
    on_fail_logs_of: str | None = None,
    on_success: str = "",
    settle_s: int = 0,
    budget_from_env: bool = False,
) -> str:
    """Bash that feeds the probe on stdin to `python3 -` in `container` until it exits 0.

    Progress every 30 s on stderr; on timeout, the probe's last answer and the last log
    lines; bounded by `timeout_s`. The probe's last JSON line is the command's stdout.
    With `settle_s`, the probe must give the same passing answer for that long first.
    """
    argv = " ".join(shlex.quote(a) for a in args)
    logs = on_fail_logs_of or container
    # With `budget_from_env`, the bound comes from $WAIT_S at run time (NodeStep passes it),
    # so a new budget is not a new command.
    budget = "${WAIT_S:?the wait budget}" if budget_from_env else str(timeout_s)
    return "\n".join(
        [
            "set -uo pipefail",
            'probe=$(mktemp); trap \'rm -f "$probe"\' EXIT; cat > "$probe"',
            f"budget={budget}; deadline=$((SECONDS + budget)); next=$((SECONDS + 30))",
            "while :; do",
            (
                f'  state=$(docker inspect -f "{{{{.State.Status}}}}" {container} 2>/dev/null'
                " || echo absent)"
            ),
            '  if [ "$state" != running ]; then',
            f'    echo {shlex.quote(f"{container} is not running")} "($state); last logs:" >&2',
            f"    docker logs --tail 40 {container} >&2 2>&1 || true",
            "    exit 1",
            "  fi",
            f'  out=$(docker exec -i {container} python3 - {argv} < "$probe" 2>/dev/null)',
            "  rc=$?",
            "  if [ $rc -eq 0 ]; then",
            '    if [ "$out" != "${settled:-}" ]; then settled=$out; since=$SECONDS; fi',
            f"    if [ $((SECONDS - since)) -ge {settle_s} ]; then",
            "      printf '%s\\n' \"$out\" | tail -n 1",
            *(f"      {line}" for line in on_success.splitlines()),
            "      exit 0",
            "    fi",
            "  else",
            "    settled=",
            "  fi",
            "  if [ $SECONDS -ge $deadline ]; then",
            (
                f'    echo {shlex.quote(f"{what}: not ready after")} "${{budget}}s; last answer:'
                ' $out; last logs:" >&2'
            ),
            f"    docker logs --tail 40 {logs} >&2 2>&1 || true",
            "    exit 1",
            "  fi",
            "  if [ $SECONDS -ge $next ]; then",
            (
                f'    echo "{what}: waiting ($SECONDS s): '
                f'$(docker logs --tail 1 {logs} 2>&1 | cut -c1-160)" >&2'
            ),
            "    next=$((SECONDS + 30))",
            "  fi",
            "  sleep 3",
            "done",
        ]
    )


def nccl_transport_script(container: str) -> str:
    """Prints `nccl_transport=ib|socket|unknown` from the server's logs (NCCL_DEBUG=INFO:
    "via NET/IB" is RDMA; "via NET/Socket" or "NET/IB : No device found" is the silent TCP
    fallback). vLLM's Ray workers log through the driver, so the server's logs hold both."""
    return "\n".join(
        [
            f"logs=$(docker logs {container} 2>&1 || true)",
            'if grep -q "via NET/IB" <<<"$logs"; then echo nccl_transport=ib',
            (
                'elif grep -qE "via NET/Socket|NET/IB : No device found" <<<"$logs";'
                " then echo nccl_transport=socket"
            ),
            "else echo nccl_transport=unknown; fi",
        ]
    )


RAY_SETTLE_S = 30


def ray_ready(cfg: StackConfig, stack: str) -> CommandSpec:
    """Wait until Ray reports every node (by its cluster IP) and every GPU.

    Runs on the head, probing from inside the Ray head container. Prints the membership
    JSON (nodes, gpus, missing, unexpected).
    """
    head = cfg.head_node.name
    # Sorted: the order of the node list is not a change.
    ips = ",".join(sorted(str(n.cluster_link.address) for n in cfg.nodes))
    name = container_name(stack, "ray-head")
    return CommandSpec(
        name=f"ray-ready-{head}",
        node=head,
        create=_probe_loop(
            container=name,
            args=[ips, str(cfg.total_gpus)],
            timeout_s=cfg.timeouts.ray_ready_s,
            what="ray cluster",
            budget_from_env=True,
            # A raylet that died (a replaced or restarted Ray container) still counts as
            # alive until the GCS misses its health checks (about 20 s with Ray's
            # defaults), and its replacement registers a few seconds after its container
            # starts: only an answer unchanged for 30 s names the raylets that will last.
            settle_s=RAY_SETTLE_S,
        ),
        stdin=script("ray_members"),
        timeout_s=cfg.timeouts.ray_ready_s + 120,
        wait_s=cfg.timeouts.ray_ready_s,
        # Read back: the raylets Ray reports now, by ID (a restarted head or node has new
        # ones, and vLLM's Ray workers died with the old ones).
        read=f"docker exec -i {name} python3 - {shlex.quote(ips)} {cfg.total_gpus} || true",
        read_stdin=script("ray_members"),
        state_key="json:node_ids",
    )


def server_guard(cfg: StackConfig, stack: str) -> CommandSpec:
    """The model server's liveness, read back by refresh: `health=ok` while its container
    runs and /health answers, or while it is still loading (it has not yet logged that its
    API server started: the readiness wait bounds that); `health=bad` when it stopped, or
    when it once served and /health no longer answers (a hung engine or API server). A bad
    reading replaces the guard and, through its generation label, the server container."""
    name = container_name(stack, "model-server")
    probe = shlex.quote(
        "import urllib.request as u; "
        f"u.urlopen('http://127.0.0.1:{cfg.ports.api}/health', timeout=10)"
    )
    read = "\n".join(
        [
            f"s=$(docker inspect -f '{{{{.State.Status}}}}' {name} 2>/dev/null || echo absent)",
            'case "$s" in',
            # No container: the docker resource's own read reports it.
            "  absent) echo health=ok;;",
            "  running)",
            f"    if timeout 20 docker exec {name} python3 -c {probe} >/dev/null 2>&1; then",
            "      echo health=ok",
            f"    elif docker logs {name} 2>&1 | grep -q 'Application startup complete'; then",
            "      echo health=bad",
            "    else echo health=ok; fi;;",
            "  *) echo health=bad;;",
            "esac",
        ]
    )
    return CommandSpec(
        name=f"server-guard-{cfg.head}", node=cfg.head, create="echo health=ok",
        read=read, state_key="health", timeout_s=60,
    )  # fmt: skip


def server_ready(cfg: StackConfig, stack: str) -> CommandSpec:
    """Wait for the model server to load and answer; then print its health JSON.

    Bounded by timeouts.server_ready_s; logs progress (the server's last log line) every
    30 s so a 15-minute model load is visible in `pulumi up`.
    """
    head = cfg.head_node.name
    name = container_name(stack, "model-server")
    return CommandSpec(
        name=f"server-ready-{head}",
        node=head,
        create=_probe_loop(
            container=name,
            args=[f"http://127.0.0.1:{cfg.ports.api}", cfg.model.name_for_clients],
            timeout_s=cfg.timeouts.server_ready_s,
            what="model server",
            on_success=nccl_transport_script(name),
        ),
        stdin=script("server_health"),
        timeout_s=cfg.timeouts.server_ready_s + 300,
    )


def drop_page_cache(node: NodeConfig) -> CommandSpec:
    """Free the page cache on `node` (as root, or through passwordless sudo)."""
    fail = shlex.quote(
        f"cannot drop the page cache on {node.name}: needs root or passwordless sudo for "
        f"{node.ssh.user}; fix: allow it, or set drop_page_cache: false"
    )
    create = "\n".join(
        [
            "set -uo pipefail",
            "sync",
            'if [ "$(id -u)" = 0 ]; then echo 3 > /proc/sys/vm/drop_caches',
            "else sudo -n sh -c 'echo 3 > /proc/sys/vm/drop_caches' ||",
            f"  {{ echo {fail} >&2; exit 1; }}",
            "fi",
            "echo mem_available_kb=$(awk '/^MemAvailable:/{print $2}' /proc/meminfo)",
        ]
    )
    return CommandSpec(
        name=f"drop-caches-{node.name}", node=node.name, create=create, timeout_s=300
    )
