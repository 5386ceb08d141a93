"""Workstation side: read the key files the config names, and write what `ssh` needs.

The only local I/O of the program (plus reading which Ray the workstation has).
pulumi-docker reaches a node through the workstation's `ssh` binary, which wants an
identity FILE and a known_hosts FILE, and a NodeStep reads its key from the same file.
The program writes them on every run (preview included). But with Pulumi.yaml's
`options.refresh: always` the refresh reads every resource BEFORE the program runs, so a
workstation or CI runner that never ran the program writes them first with

    python -m sparkvllm.workstation --stack STACK

(the stack's config and secrets: `pulumi config` where the CLI is, else the stack file;
idempotent). Files are 0600 in a 0700 directory under ~/.cache/spark-vllm/<project>/<stack>/
(override the first part with SPARKVLLM_STATE_DIR): two projects with a stack of the same
name keep their keys apart. Before, the folder was ~/.cache/spark-vllm/<stack>/: it is left
as it is, since a stack deployed then names its files until its next `up` (which records the
new ones). The private key never leaves those files and Pulumi secrets.

The tools (this one, sparkvllm.drift, sparkvllm.diagnose) answer a bad config, stack file or
flag with a few lines, the last naming the file, field or flag and the fix, and exit 2;
`--debug` adds the traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sparkvllm import config_sources
from sparkvllm.config import (
    PROJECT,
    PROJECT_DIR,
    ConfigError,
    Issue,
    JumpConfig,
    NodeConfig,
    SshConfig,
    StackConfig,
)
from sparkvllm.host_keys import HOST_KEY_FIX, HostKeyError, find_host_key
from sparkvllm.probes import image_versions
from sparkvllm.specs.ssh import Jump, Reach, SshTarget, known_hosts


@dataclass(frozen=True)
class SshAccess:
    """What the components need to reach the nodes. `private_key` is secret material.

    Each node's `Reach` (its key file), `node_known_hosts_ref(node)` and `control_dir_ref`
    name the files as resource inputs do: under `~` (which ssh expands itself) when the
    state directory is the default one, so no input depends on who runs the program or
    where the checkout is."""

    identity_file: str
    known_hosts_file: str
    host_keys: dict[str, str | None]
    private_key: str = field(repr=False)
    control_dir_ref: str = ""
    hf_token_ref: str | None = None  # the hf_token file (absent when the stack has none)
    # Per node: its own key (else the stack's) and the file of it.
    node_keys: dict[str, str] = field(default_factory=dict, repr=False)
    node_identity_files: dict[str, str] = field(default_factory=dict)
    # How the workstation reaches each node (the one type, sparkvllm.specs.ssh.Reach), and
    # its ssh to it for the tools (Reach.ssh_target).
    reaches: dict[str, Reach] = field(default_factory=dict)
    targets: dict[str, SshTarget] = field(default_factory=dict)

    def node_known_hosts_ref(self, node: str) -> str:
        """The node's own known_hosts file: it outlives the node's place in the config, so
        a later run can still reach the node to delete what the stack made there."""
        return f"{self.control_dir_ref}/known_hosts.{node}"

    def key_of(self, node: str) -> str:
        return self.node_keys.get(node, self.private_key)


def workstation_versions() -> dict[str, str]:
    """Python and Ray versions of the interpreter running the program ("" if no ray),
    read the way the nodes' images are read (the same probe, run here)."""
    found = image_versions.versions()
    return {"python": found["python"], "ray": found["ray"]}


DEFAULT_STATE_DIR = "~/.cache/spark-vllm"


def state_dir_ref(stack: str, project: str = PROJECT) -> str:
    """The state directory as inputs name it: `~/.cache/spark-vllm/<project>/<stack>` by
    default (the Pulumi project's name and the stack's: a stack name alone is not unique)."""
    return f"{os.environ.get('SPARKVLLM_STATE_DIR') or DEFAULT_STATE_DIR}/{project}/{stack}"


def link_earlier_folder(folder: Path, stack: str) -> Path | None:
    """On a machine that never had it (a CI runner), the folder a stack deployed before
    the folders were keyed by project names (`~/.cache/spark-vllm/<stack>`), as a link to
    `folder`, so that the first refresh of such a state, which reads with the paths it
    recorded, finds the files. An existing folder or link there is left as it is (another
    project's, or the stack's own from before)."""
    earlier = folder.parent.parent / stack
    if earlier.exists() or earlier.is_symlink() or earlier == folder:
        return None
    try:
        earlier.symlink_to(folder, target_is_directory=True)
    except OSError:
        return None
    return earlier


def state_dir(stack: str, project: str = PROJECT) -> Path:
    return Path(state_dir_ref(stack, project)).expanduser()


def _read(path: str, base: Path, field_path: str, fix: str) -> str:
    p = Path(path).expanduser()
    p = p if p.is_absolute() else base / p
    try:
        return p.read_text()
    except OSError as e:
        raise ConfigError(
            [
                Issue(
                    path=field_path,
                    value=path,
                    problem=f"cannot read {p}: {e.strerror}",
                    fix=fix,
                )
            ]
        ) from None


def _host_key(ssh: SshConfig | JumpConfig, base: Path, field_path: str) -> str | None:
    if not ssh.verify_host_key:
        return None
    if ssh.host_key is not None:
        return ssh.host_key
    text = _read(
        ssh.host_key_file or "",
        base,
        field_path,
        "point host_key_file at the node's public host key (e.g. from ssh-keyscan)",
    )
    try:
        return find_host_key(text)
    except HostKeyError as e:
        raise ConfigError(
            [
                Issue(
                    path=field_path,
                    value=ssh.host_key_file,
                    problem=f"no usable SSH public host key in the file: {e}",
                    fix=f"write the node's host key into it: {HOST_KEY_FIX}",
                )
            ]
        ) from None


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)


def write_whole(path: Path, text: str, mode: int) -> None:
    """`text` as the file `path`, with `mode`, written whole: a temporary file in its folder,
    renamed over it, so a reader never sees half of it and nothing is left on a failure
    (the tools' files: an exported recipe, the metrics configs)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _checked_key(text: str, field_path: str) -> str:
    if "PRIVATE KEY" not in text:
        raise ConfigError(
            [
                Issue(
                    path=field_path,
                    value="[secret]",
                    problem="does not look like an SSH private key (no PRIVATE KEY block)",
                    fix="set it from the key file itself, e.g. "
                    "`pulumi config set --secret ssh_private_key < ~/.ssh/id_ed25519`",
                )
            ]
        )
    return text if text.endswith("\n") else text + "\n"


def _node_keys(cfg: StackConfig, project_dir: Path) -> dict[str, str]:
    """The nodes that have a key of their own: the ssh_private_keys secret, else the
    node's private_key_file."""
    secrets = cfg.ssh_private_keys or {}
    keys = {}
    for i, n in enumerate(cfg.nodes):
        if n.name in secrets:
            text = secrets[n.name].get_secret_value()
            keys[n.name] = _checked_key(text, f"ssh_private_keys.{n.name}")
        elif n.ssh.private_key_file:
            field_path = f"nodes[{i}].ssh.private_key_file"
            text = _read(n.ssh.private_key_file, project_dir, field_path,
                         "point it at a readable private key")  # fmt: skip
            keys[n.name] = _checked_key(text, field_path)
    return keys


def prepare_ssh_access(
    cfg: StackConfig, stack: str, project_dir: Path, project: str | None = None
) -> SshAccess:
    """Resolve key files named in the config and write the files `ssh` needs, under the
    state directory of `project` (default: the name Pulumi.yaml in `project_dir` gives).
    Every key file is read before anything is written: a refusal writes nothing."""
    project = project or config_sources.project_name(project_dir)
    host_keys = {
        n.name: _host_key(n.ssh, project_dir, f"nodes[{i}].ssh.host_key_file")
        for i, n in enumerate(cfg.nodes)
    }
    jump_keys = {}
    for i, n in enumerate(cfg.nodes):
        jump = cfg.jump_for(n)
        if jump is not None:
            where = f"nodes[{i}].ssh.jump" if n.ssh.jump else "ssh_jump"
            jump_keys[n.name] = _host_key(jump, project_dir, f"{where}.host_key_file")
    node_keys = _node_keys(cfg, project_dir)
    if cfg.ssh_private_key is not None:
        private_key = _checked_key(cfg.ssh_private_key.get_secret_value(), "ssh_private_key")
    elif cfg.ssh_private_key_file:
        keyfile = cfg.ssh_private_key_file
        text = _read(keyfile, project_dir, "ssh_private_key_file",
                     "point it at a readable private key")  # fmt: skip
        private_key = _checked_key(text, "ssh_private_key_file")
    else:
        private_key = ""  # every node has its own (the config's rule)
    ref = state_dir_ref(stack, project)
    try:
        return _write_access(cfg, ref, host_keys, jump_keys, node_keys, private_key)
    except OSError as e:
        raise ConfigError(
            [
                Issue(
                    path="state folder",
                    value=ref,
                    problem=f"cannot write {e.filename or 'in it'}: {e.strerror}",
                    fix="make it writable (it is under HOME), or point SPARKVLLM_STATE_DIR "
                    "at a writable folder",
                )
            ],
            what="the workstation's SSH files cannot be written",
        ) from None


def _write_access(
    cfg: StackConfig,
    ref: str,
    host_keys: dict[str, str | None],
    jump_keys: dict[str, str | None],
    node_keys: dict[str, str],
    private_key: str,
) -> SshAccess:
    d = Path(ref).expanduser()
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(d, 0o700)
    # The keys always go into the state directory (also when the config names a key file),
    # so the identity every input names is the same file on every workstation: `id` for
    # the stack's key, `id.<node>` for a node's own.
    identity = d / "id"
    if private_key:
        _write_private(identity, private_key)
    identity_files, identity_refs = {}, {}
    for n in cfg.nodes:
        own = n.name in node_keys
        if own:
            _write_private(d / f"id.{n.name}", node_keys[n.name])
        identity_files[n.name] = str(d / f"id.{n.name}") if own else str(identity)
        identity_refs[n.name] = f"{ref}/id.{n.name}" if own else f"{ref}/id"
    kh = d / "known_hosts"
    present = {k: v for k, v in host_keys.items() if v is not None}

    def jumps_of(nodes: list[NodeConfig]) -> list[tuple[JumpConfig, str]]:
        out = []
        for n in nodes:
            jump, key = cfg.jump_for(n), jump_keys.get(n.name)
            if jump is not None and key is not None:
                out.append((jump, key))
        return out

    _write_private(kh, known_hosts(cfg.nodes, present, jumps_of(cfg.nodes)))
    reaches, targets = {}, {}
    for n in cfg.nodes:
        node_kh = d / f"known_hosts.{n.name}"
        if n.name in present:
            _write_private(node_kh, known_hosts([n], present, jumps_of([n])))
        jump = cfg.jump_for(n)
        reaches[n.name] = Reach(
            host=n.ssh.host,
            port=n.ssh.port,
            user=n.ssh.user,
            host_key=host_keys[n.name],
            identity_file=identity_refs[n.name],
            jump=Jump(jump.host, jump.port, jump.user, jump_keys.get(n.name)) if jump else None,
        )
        targets[n.name] = reaches[n.name].ssh_target(str(node_kh))
    # The weights download's token (a NodeStep reads it from here: never a resource input).
    token = d / "hf_token"
    if cfg.hf_token is not None:
        _write_private(token, cfg.hf_token.get_secret_value() + "\n")
    else:
        token.unlink(missing_ok=True)
    return SshAccess(
        identity_file=str(identity),
        known_hosts_file=str(kh),
        host_keys=host_keys,
        private_key=private_key,
        control_dir_ref=ref,
        hf_token_ref=f"{ref}/hf_token",  # absent when the stack has none: empty stdin
        node_keys={n.name: node_keys.get(n.name, private_key) for n in cfg.nodes},
        node_identity_files=identity_files,
        reaches=reaches,
        targets=targets,
    )


def prepare_command(stack: str) -> str:
    """The command that writes a stack's files on this workstation (the fix a step names
    when one is missing)."""
    return f"python -m sparkvllm.workstation --stack {stack}"


def tool_inputs(stack: str, project_dir: Path = PROJECT_DIR) -> tuple[StackConfig, SshAccess]:
    """The stack's config and the workstation's way to its nodes, for a tool run outside
    the program (its files written). Raises ConfigError (run_tool prints it)."""
    cfg = config_sources.for_tools(stack, project_dir)
    return cfg, prepare_ssh_access(cfg, stack, project_dir)


def add_tool_flags(parser: argparse.ArgumentParser) -> None:
    """The flags every tool takes beside --stack."""
    parser.add_argument(
        "--cwd",
        type=Path,
        default=PROJECT_DIR,
        help="the project's folder (its Pulumi.yaml and Pulumi.<stack>.yaml; default: this "
        "checkout)",
    )
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")


def run_tool(prog: str, debug: bool, body: Callable[[], int]) -> int:
    """A tool's body, its errors as lines: a bad config, stack file or workstation folder is
    its message (the last line names what and the fix) and exit 2; anything else one line
    and exit 1. `debug`: the traceback first."""
    try:
        return body()
    except ConfigError as e:
        if debug:
            traceback.print_exc()
        print(e, file=sys.stderr)
        return 2
    except Exception as e:
        if debug:
            traceback.print_exc()
        print(f"{prog}: {type(e).__name__}: {e} (--debug shows where)", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sparkvllm.workstation",
        description="Write what the providers read outside the state (the SSH key and "
        "known_hosts files) for a stack, from its config and secrets. Run it first on a "
        "machine that never ran the program (a CI runner): refresh reads before the program. "
        "Exit status: 0 written, 2 a bad config, stack file or folder (nothing written).",
    )
    parser.add_argument("--stack", required=True, help="stack name, e.g. spark or sim")
    add_tool_flags(parser)
    args = parser.parse_args(argv)

    def body() -> int:
        cfg, access = tool_inputs(args.stack, args.cwd)
        folder = Path(access.control_dir_ref).expanduser()
        written = sorted(p.name for p in folder.iterdir())
        print(
            f"workstation: {folder} holds {', '.join(written)} "
            f"(0600, for {len(cfg.nodes)} node(s) of the {args.stack} stack)"
        )
        if linked := link_earlier_folder(folder, args.stack):
            print(f"workstation: {linked} -> {folder} (a state deployed before the folder "
                  "was keyed by project names it until its next `up`)")  # fmt: skip
        return 0

    return run_tool(parser.prog, args.debug, body)


if __name__ == "__main__":
    sys.exit(main())
