"""Every ssh command line of the project, built in one place (as Ray's autoscaler builds
its own with one `SSHOptions`): the workstation's ssh to a node (local engine, NodeSteps,
drift check, sim helpers), the docker provider's `-o` options, and the option words of the
head-to-worker ssh that the node scripts run (sparkvllm/scripts). How the workstation
reaches a node is one type, `Reach`, from the config to the command line.

pulumi-docker shells out to the workstation's `ssh` binary (`docker system dial-stdio` on
the node), so it needs an identity FILE and a known_hosts FILE; pulumi-command uses Go's SSH
library with the key and host key as values. Both verify the same configured host key.

Safety: the destination is always `-p PORT -l USER -- HOST`: after `--` ssh reads no more
options, so a host cannot become one, and the user is a separate argv word (the schema also
refuses users and hosts that start with `-`). A node script takes the words as values
(quoted, never pasted into its text); the files they name are variables OpenSSH expands.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv6Address, ip_address
from pathlib import Path
from typing import Any

from sparkvllm.config import JumpConfig, NodeConfig


@dataclass(frozen=True)
class SshOptions:
    """How ssh authenticates and behaves; rendered as `-o Key=Value` words.

    `known_hosts` None means the host key is not verified (the config's explicit opt-out).
    `control_dir`: reuse one connection per node through a socket in that (0700) directory,
    never the shared /tmp, named `control_name` (ssh's own `cm-%C` by default).
    `extra`: options a provider's config carries as given;
    `as_given`: those and nothing else (the docker CLI adds none of its own).
    """

    identity: str | None = None
    known_hosts: str | None = None
    connect_timeout_s: int = 15
    server_alive_s: int | None = 15
    server_alive_count: int | None = 4
    control_dir: str | None = None
    control_name: str = "cm-%C"
    log_level: str | None = None
    # Reach the host through a jump host: ssh runs this (`jump_command`) for the socket.
    proxy_command: str | None = None
    extra: tuple[str, ...] = field(default=())
    as_given: bool = False
    # Authenticate with the ssh-agent's keys and forward the agent to the host (the
    # head-to-worker relay: each hop reaches the next with the head's key, never a copy of
    # it on a worker's disk). Without an identity file then: IdentitiesOnly would hide them.
    agent: bool = False

    def argv(self) -> list[str]:
        """The options as argv words."""
        if self.as_given:
            return list(self.extra)
        opts: list[str] = []

        def o(*parts: str) -> None:
            opts.extend(["-o", "".join(parts)])

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
            o("ControlPath=", self.control_dir, "/", self.control_name)
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
        opts.extend(self.extra)
        return opts


@dataclass(frozen=True)
class SshTarget:
    """A node as ssh reaches it: user, host, port, and the options."""

    user: str
    host: str
    port: int
    options: SshOptions

    def destination(self) -> list[str]:
        """`-p PORT -l USER -- HOST`: after `--` ssh reads no option."""
        return ["-p", str(self.port), "-l", self.user, "--", self.host]

    def argv(self, remote_command: str | None = None, *, send_env: Sequence[str] = ()) -> list[str]:
        """`ssh OPTIONS [-o SendEnv=NAME ...] -p PORT -l USER -- HOST [COMMAND]` as argv.
        `send_env`: variables of the ssh process's environment to pass to the node, by
        NAME only (ssh_config(5) SendEnv): their values never enter the argv."""
        tail = [remote_command] if remote_command is not None else []
        sent = [w for name in send_env for w in ("-o", f"SendEnv={_env_name(name)}")]
        return ["ssh", *self.options.argv(), *sent, *self.destination(), *tail]


def _env_name(name: str) -> str:
    """A variable name ssh sends as itself: SendEnv takes patterns (`*`, `?`) and a leading
    `-` removes names (ssh_config(5)), so only `[A-Za-z_][A-Za-z0-9_]*` is accepted."""
    if not (name.isascii() and name.isidentifier()):
        raise ValueError(f"not an environment variable name: {name!r}")
    return name


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


def proxy_command(jump: SshTarget) -> str:
    """ssh's ProxyCommand through `jump` (what `-J` does, spelled out so the jump host gets
    its own key and host-key options: options on the command line reach only the final
    host). ssh expands %h and %p to the node and runs the line with the user's shell: every
    word is quoted."""
    return shlex.join(["ssh", *jump.options.argv(), "-W", "%h:%p", *jump.destination()])


@dataclass(frozen=True)
class Jump:
    """A jump host the workstation reaches a node through: its own user, port and pinned
    host key (None: not verified, the config's opt-out)."""

    host: str
    port: int
    user: str
    host_key: str | None


@dataclass(frozen=True)
class Reach:
    """How the workstation reaches one node: the one type from the config to the ssh
    command line. Built once per node from the config and the workstation's files
    (sparkvllm.workstation.prepare_ssh_access); every consumer takes it: the NodeSteps
    (their inputs, `props`, and their ssh, `target`), pulumi-command (`connection`), the
    docker provider (`docker_host`, `docker_ssh_opts`) and the tools (`ssh_target`). No
    secret inside: the key stays in its file.

    `host_key` None: the host key is not verified (the config's explicit opt-out).
    `identity_file` as inputs name it (under `~`, which ssh expands itself)."""

    host: str
    port: int
    user: str
    host_key: str | None
    identity_file: str
    jump: Jump | None = None

    def connection(self) -> dict[str, Any]:
        """pulumi-command's connection fields (its camelCase names), without the key."""
        conn: dict[str, Any] = {
            "host": self.host, "port": self.port, "user": self.user, "hostKey": self.host_key
        }  # fmt: skip
        if (j := self.jump) is not None:
            conn["proxy"] = {"host": j.host, "port": j.port, "user": j.user, "hostKey": j.host_key}
        return conn

    def target(self, files: Any) -> SshTarget:
        """ssh to the node as pulumi-command dials it, its host keys written as files into
        `files` (sparkvllm.remote.ConnectionFiles), the key from its file."""
        return files.target(self.connection(), key_file=str(Path(self.identity_file).expanduser()))

    def _proxy(self, identity: str, known_hosts_ref: str) -> str | None:
        """ssh's ProxyCommand through the jump host (with the node's key), if any."""
        if (j := self.jump) is None:
            return None
        options = SshOptions(
            identity=identity,
            known_hosts=known_hosts_ref if j.host_key else None,
            server_alive_s=None,
            server_alive_count=None,
        )
        return proxy_command(SshTarget(j.user, j.host, j.port, options))

    def ssh_target(self, known_hosts_file: str) -> SshTarget:
        """ssh from the workstation (the tools: drift check, diagnostics, the sim's
        helpers), verifying the host keys in `known_hosts_file`."""
        identity = str(Path(self.identity_file).expanduser())
        options = SshOptions(
            identity=identity,
            known_hosts=known_hosts_file if self.host_key else None,
            proxy_command=self._proxy(identity, known_hosts_file),
        )
        return SshTarget(self.user, self.host, self.port, options)

    def docker_host(self) -> str:
        return f"ssh://{self.user}@{url_host(self.host)}:{self.port}"

    def docker_ssh_opts(self, known_hosts_ref: str, control_dir_ref: str) -> list[str]:
        """The docker provider's `sshOpts` (each `-o` its own argv word). The paths as the
        caller names them (`~/...`), so the provider's config is the same on every
        workstation; the control socket in the stack's own 0700 directory (the provider
        opens a new ssh for every API call), named by the node's user, host, port and jump
        host in 15 characters where ssh's %C takes 43: a socket's path, with the
        17-character suffix ssh adds while it makes it, must stay under 108 bytes, and the
        directory is ~/.cache/spark-vllm/<project>/<stack>."""
        return SshOptions(
            identity=self.identity_file,
            known_hosts=known_hosts_ref if self.host_key else None,
            server_alive_count=None,
            control_dir=control_dir_ref,
            control_name=self.control_name(),
            proxy_command=self._proxy(self.identity_file, known_hosts_ref),
        ).argv()

    def control_name(self) -> str:
        """The docker provider's control socket for this node: `cm-` and 12 hex digits."""
        j = self.jump
        via = (j.host, j.port, j.user) if j is not None else None
        node = repr((self.user, self.host, self.port, via)).encode()
        return f"cm-{hashlib.sha256(node).hexdigest()[:12]}"

    def props(self, prefix: str = "") -> dict[str, Any]:
        """As a NodeStep's inputs (`read_` ones for the node it reads back): the jump only
        when there is one (an existing step's inputs stay as they were)."""
        out: dict[str, Any] = {
            f"{prefix}host": self.host,
            f"{prefix}port": self.port,
            f"{prefix}user": self.user,
            f"{prefix}host_key": self.host_key,
        }
        if (j := self.jump) is not None:
            out[f"{prefix}jump"] = [j.host, j.port, j.user, j.host_key]
        return out

    @classmethod
    def from_props(cls, props: Mapping[str, Any], prefix: str = "") -> Reach:
        """The Reach a NodeStep's inputs (`props(prefix)`) hold, with its key file (a read
        node's own, else the step's)."""
        jump = props.get(f"{prefix}jump")
        return cls(
            host=str(props[f"{prefix}host"]),
            port=int(props[f"{prefix}port"]),
            user=str(props[f"{prefix}user"]),
            host_key=props.get(f"{prefix}host_key") or None,
            identity_file=str(props.get(f"{prefix}identity_file") or props["identity_file"]),
            jump=Jump(str(jump[0]), int(jump[1]), str(jump[2]), jump[3] or None) if jump else None,
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
