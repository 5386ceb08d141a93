"""Every ssh command line of the project, built in one place (as Ray's autoscaler builds
its own with one `SSHOptions`): the workstation's ssh to a node (local engine, NodeSteps,
drift check, sim helpers), the docker provider's `-o` options, and the head-to-worker hops
that run inside a node's bash.

pulumi-docker shells out to the workstation's `ssh` binary (`docker system dial-stdio` on
the node), so it needs an identity FILE and a known_hosts FILE; pulumi-command uses Go's SSH
library with the key and host key as values. Both verify the same configured host key.

Safety: the destination is always `-p PORT -l USER -- HOST`: after `--` ssh reads no more
options, so a host cannot become one, and the user is a separate argv word (the schema also
refuses users and hosts that start with `-`). Every word of the shell form is quoted;
only the paths the calling script holds in its own variables (`ShellVar`) expand.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from ipaddress import IPv6Address, ip_address

from sparkvllm.config import JumpConfig, NodeConfig


@dataclass(frozen=True)
class ShellVar:
    """A path held in a variable of the script an ssh line runs in (shell form only)."""

    name: str

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"not a shell variable name: {self.name!r}")


PathRef = str | ShellVar


@dataclass(frozen=True)
class SshOptions:
    """How ssh authenticates and behaves; rendered as `-o Key=Value` words.

    `known_hosts` None means the host key is not verified (the config's explicit opt-out).
    `control_dir`: reuse one connection per node through a socket in that (0700) directory,
    never the shared /tmp. `extra`: options a provider's config carries as given;
    `as_given`: those and nothing else (the docker CLI adds none of its own).
    """

    identity: PathRef | None = None
    known_hosts: PathRef | None = None
    connect_timeout_s: int = 15
    server_alive_s: int | None = 15
    server_alive_count: int | None = 4
    control_dir: PathRef | None = None
    log_level: str | None = None
    # Reach the host through a jump host: ssh runs this (`jump_command`) for the socket.
    proxy_command: str | None = None
    extra: tuple[str, ...] = field(default=())
    as_given: bool = False
    # Authenticate with the ssh-agent's keys and forward the agent to the host (the
    # head-to-worker relay: each hop reaches the next with the head's key, never a copy of
    # it on a worker's disk). Without an identity file then: IdentitiesOnly would hide them.
    agent: bool = False

    def _words(self) -> list[tuple[PathRef, ...]]:
        """Each argv word as parts (literal text and ShellVars)."""
        if self.as_given:
            return [(w,) for w in self.extra]
        opts: list[tuple[PathRef, ...]] = []

        def o(*parts: PathRef) -> None:
            opts.extend([("-o",), parts])

        if self.identity is not None:
            o("IdentityFile=", self.identity)
        if self.agent:
            o("ForwardAgent=yes")
        else:
            o("IdentitiesOnly=yes")
        o("BatchMode=yes")
        o(f"ConnectTimeout={self.connect_timeout_s}")
        if self.server_alive_s is not None:
            o(f"ServerAliveInterval={self.server_alive_s}")
        if self.server_alive_count is not None:
            o(f"ServerAliveCountMax={self.server_alive_count}")
        if self.control_dir is not None:
            # The provider opens a new ssh for every API call, and bursts of connections
            # get refused (kreuzwerker issue 262): one master connection serves them all.
            o("ControlMaster=auto")
            o("ControlPath=", self.control_dir, "/cm-%C")
            o("ControlPersist=120")
        if self.known_hosts is not None:
            o("UserKnownHostsFile=", self.known_hosts)
            o("StrictHostKeyChecking=yes")
        else:
            o("UserKnownHostsFile=/dev/null")
            o("StrictHostKeyChecking=no")
        if self.log_level is not None:
            o(f"LogLevel={self.log_level}")
        if self.proxy_command is not None:
            o(f"ProxyCommand={self.proxy_command}")
        opts.extend((w,) for w in self.extra)
        return opts

    def argv(self) -> list[str]:
        """The options as argv words (no shell variables allowed)."""
        out = []
        for parts in self._words():
            if any(isinstance(p, ShellVar) for p in parts):
                raise ValueError("an ssh option names a shell variable; use shell()")
            out.append("".join(str(p) for p in parts))
        return out

    def shell(self) -> list[str]:
        """The options as shell words: literals quoted, ShellVars as "$name"."""
        return [_shell_word(parts) for parts in self._words()]


def _shell_word(parts: tuple[PathRef, ...]) -> str:
    return "".join(
        f'"${p.name}"' if isinstance(p, ShellVar) else shlex.quote(p) if p else "" for p in parts
    )


@dataclass(frozen=True)
class SshTarget:
    """A node as ssh reaches it: user, host, port, and the options. The user and port may
    be variables of the script the line runs in (shell form only): how a node is reached
    is then a value given at run time, not part of the script's text."""

    user: str | ShellVar
    host: str
    port: int | ShellVar
    options: SshOptions

    def _destination(self) -> list[tuple[PathRef, ...]]:
        return [("-p",), (_text(self.port),), ("-l",), (self.user,), ("--",), (self.host,)]

    def destination(self) -> list[str]:
        """`-p PORT -l USER -- HOST`: after `--` ssh reads no option."""
        words = self._destination()
        if any(isinstance(p, ShellVar) for w in words for p in w):
            raise ValueError("the destination names a shell variable; use shell()")
        return ["".join(str(p) for p in w) for w in words]

    def argv(self, remote_command: str | None = None, *, send_env: Sequence[str] = ()) -> list[str]:
        """`ssh OPTIONS [-o SendEnv=NAME ...] -p PORT -l USER -- HOST [COMMAND]` as argv.
        `send_env`: variables of the ssh process's environment to pass to the node, by
        NAME only (ssh_config(5) SendEnv): their values never enter the argv."""
        tail = [remote_command] if remote_command is not None else []
        sent = [w for name in send_env for w in ("-o", f"SendEnv={_env_name(name)}")]
        return ["ssh", *self.options.argv(), *sent, *self.destination(), *tail]

    def shell(self) -> str:
        """The same line for a bash script (a remote command is appended by the caller)."""
        words = ["ssh", *self.options.shell(), *map(_shell_word, self._destination())]
        return " ".join(words)


def _env_name(name: str) -> str:
    """A variable name ssh sends as itself: SendEnv takes patterns (`*`, `?`) and a leading
    `-` removes names (ssh_config(5)), so only `[A-Za-z_][A-Za-z0-9_]*` is accepted."""
    if not (name.isascii() and name.isidentifier()):
        raise ValueError(f"not an environment variable name: {name!r}")
    return name


def _text(value: int | ShellVar) -> str | ShellVar:
    return value if isinstance(value, ShellVar) else str(value)


def known_hosts_host(host: str, port: int) -> str:
    """The host field of a known_hosts line: `[host]:port` for non-22 ports and IPv6."""
    return host if port == 22 else f"[{host}]:{port}"


def known_hosts_line(host: str, port: int, host_key: str) -> str:
    """One known_hosts line; non-22 ports use the `[host]:port` form."""
    return f"{known_hosts_host(host, port)} {host_key}"


def known_hosts(
    nodes: list[NodeConfig],
    host_keys: dict[str, str],
    jumps: Sequence[tuple[JumpConfig, str]] = (),
) -> str:
    """known_hosts for the workstation: every node by its ssh address, and every jump host
    (with its key) the nodes are reached through."""
    lines = [
        known_hosts_line(n.ssh.host, n.ssh.port, host_keys[n.name])
        for n in nodes
        if n.name in host_keys
    ]
    lines += [known_hosts_line(j.host, j.port, key) for j, key in jumps]
    return "".join(f"{line}\n" for line in dict.fromkeys(lines))


def url_host(host: str) -> str:
    """`host` as it goes into a URL: IPv6 literals in brackets."""
    try:
        return f"[{host}]" if isinstance(ip_address(host), IPv6Address) else host
    except ValueError:
        return host


def docker_host(node: NodeConfig) -> str:
    return f"ssh://{node.ssh.user}@{url_host(node.ssh.host)}:{node.ssh.port}"


def proxy_command(jump: SshTarget) -> str:
    """ssh's ProxyCommand through `jump` (what `-J` does, spelled out so the jump host gets
    its own key and host-key options: options on the command line reach only the final
    host). ssh expands %h and %p to the node and runs the line with the user's shell: every
    word is quoted."""
    return shlex.join(["ssh", *jump.options.argv(), "-W", "%h:%p", *jump.destination()])


def jump_command(jump: JumpConfig, identity: str, known_hosts_ref: str) -> str:
    """The ProxyCommand through a configured jump host, with the node's key."""
    options = SshOptions(
        identity=identity,
        known_hosts=known_hosts_ref if jump.verify_host_key else None,
        server_alive_s=None,
        server_alive_count=None,
    )
    return proxy_command(SshTarget(jump.user, jump.host, jump.port, options))


def docker_ssh_options(
    node: NodeConfig,
    identity_ref: str,
    known_hosts_ref: str,
    control_dir_ref: str,
    jump: JumpConfig | None = None,
) -> SshOptions:
    """Options for the docker provider's ssh. The paths are given as the caller names them
    (`~/...`: ssh expands `~` itself), so the provider's config is the same on every
    workstation. The control socket lives in the stack's own 0700 directory."""
    return SshOptions(
        identity=identity_ref,
        known_hosts=known_hosts_ref if node.ssh.verify_host_key else None,
        server_alive_count=None,
        control_dir=control_dir_ref,
        proxy_command=jump_command(jump, identity_ref, known_hosts_ref) if jump else None,
    )


def docker_ssh_opts(
    node: NodeConfig,
    identity_ref: str,
    known_hosts_ref: str,
    control_dir_ref: str,
    jump: JumpConfig | None = None,
) -> list[str]:
    """The docker provider's `sshOpts` (each `-o` its own argv word)."""
    return docker_ssh_options(node, identity_ref, known_hosts_ref, control_dir_ref, jump).argv()


def node_options(
    node: NodeConfig, identity: PathRef, known_hosts_ref: PathRef, jump: JumpConfig | None = None
) -> SshOptions:
    """The workstation's (or the head's) ssh to `node` with its key and host-key policy:
    the docker provider's options without connection sharing. A jump host only from the
    workstation (nodes reach each other directly)."""
    proxy = None
    if jump is not None:
        if not isinstance(identity, str) or not isinstance(known_hosts_ref, str):
            raise ValueError("a jump host is for the workstation's ssh (paths, not variables)")
        proxy = jump_command(jump, identity, known_hosts_ref)
    return SshOptions(
        identity=identity,
        known_hosts=known_hosts_ref if node.ssh.verify_host_key else None,
        proxy_command=proxy,
    )


# The head's ssh to a node from a node script (sparkvllm/scripts/lib/peer_ssh.sh,
# image_relay.sh, relay_hop.sh): its key, known_hosts and connection folder are named by
# variables the script exports, which OpenSSH (>= 8.4) expands in these options itself,
# so the words are plain values.
PEER_FILES = ("${SPARKVLLM_KEY}", "${SPARKVLLM_KH}", "${SPARKVLLM_CM}")


def peer_options(verify_host_key: bool) -> list[str]:
    """The option words of the head's ssh to a node (its key, the node's pinned host key
    unless the config opts out, one shared connection)."""
    key, known, control = PEER_FILES
    known_hosts = known if verify_host_key else None
    return SshOptions(identity=key, known_hosts=known_hosts, control_dir=control).argv()


def relay_options(verify_host_key: bool) -> list[str]:
    """The option words of one hop of the head-to-workers relay, from whichever node holds
    the stream to the next: the head's key through the forwarded agent, the next node's
    host key verified (unless the config opts out)."""
    known_hosts = PEER_FILES[1] if verify_host_key else None
    return SshOptions(known_hosts=known_hosts, agent=True).argv()


def node_target(
    node: NodeConfig, identity_file: str, known_hosts_file: str, jump: JumpConfig | None = None
) -> SshTarget:
    """ssh from the workstation to `node` (same key and host-key policy as the provider)."""
    return SshTarget(
        node.ssh.user, node.ssh.host, node.ssh.port,
        node_options(node, identity_file, known_hosts_file, jump),
    )  # fmt: skip
