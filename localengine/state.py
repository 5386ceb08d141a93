"""The stack's state: one JSON file per stack, laid out like Pulumi's local backend but in a
folder of its own (`<backend>/.localengine/stacks/<project>/<stack>.json`): a checkpoint of
version 3 with a `latest` deployment holding every resource's URN, type, ID, inputs,
outputs, parent, provider reference, dependencies and options.

Written after every step (atomically: a temp file renamed over the old one), so a crash
loses nothing that happened on a node. Secret values are encrypted in the file (Fernet):
the key is derived from PULUMI_CONFIG_PASSPHRASE when it is set, else read from a 0600 key
file beside the state. `localengine/export.py` writes the form the Pulumi CLI imports.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from localengine import wire
from localengine.project import project_name


@dataclass
class ResourceState:
    """One resource as the engine records it (pulumi apitype.ResourceV3, the fields used)."""

    urn: str
    type: str
    custom: bool
    id: str = ""
    inputs: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)
    parent: str = ""
    provider: str = ""
    dependencies: list[str] = field(default_factory=list)
    propertyDependencies: dict[str, list[str]] = field(default_factory=dict)
    initErrors: list[str] = field(default_factory=list)
    ignoreChanges: list[str] = field(default_factory=list)
    replaceOnChanges: list[str] = field(default_factory=list)
    additionalSecretOutputs: list[str] = field(default_factory=list)
    aliases: list[str] = field(default_factory=list)
    customTimeouts: dict[str, str] = field(default_factory=dict)
    delete: bool = False  # a replaced resource awaiting deletion (pendingDelete)

    @property
    def name(self) -> str:
        return self.urn.rsplit("::", 1)[-1]

    @property
    def provider_urn(self) -> str:
        return self.provider.rsplit("::", 1)[0] if self.provider else ""

    def all_dependencies(self) -> set[str]:
        deps = set(self.dependencies)
        for urns in self.propertyDependencies.values():
            deps |= set(urns)
        if self.provider:
            deps.add(self.provider_urn)
        if self.parent:
            deps.add(self.parent)
        return deps


_FIELDS = {f.name for f in fields(ResourceState)}


def resource_state(raw: dict[str, Any]) -> ResourceState:
    """A record from a ResourceV3 object whose values are already opened; the ResourceV3
    fields the engine does not use are not carried."""
    return ResourceState(**{k: v for k, v in raw.items() if k in _FIELDS})


# A plain value that holds a secret's text (a command's stdout that echoes its secret
# stdin, say) is sealed in the file as a secret is, under this mark, and opened back to the
# plain value it was: the program sees what the provider returned (pulumi-command marks
# stdout secret only through additionalSecretOutputs), the file holds no secret in clear.
ECHO_SIG = "localengine:echoes-a-secret"

# apitype.OperationType: what a step was doing when its run ended before the step did.
CREATING, UPDATING, DELETING = "creating", "updating", "deleting"


@dataclass
class PendingOperation:
    """apitype.OperationV2: a step begun and not known to have ended. Written to the state
    before the step's provider call and removed when the call returns (pulumi
    pkg/backend/snapshot.go markOperationPending / markOperationComplete), so a run killed
    mid-step leaves a record of what may have happened on a node."""

    resource: ResourceState
    type: str


# The local engine's states live where the Pulumi CLI never looks: `.localengine/` in the
# project's folder, or under LOCALENGINE_BACKEND_URL=file://DIR. (The CLI's file backend
# reads `$PULUMI_BACKEND_URL/.pulumi/stacks/...` or ~/.pulumi: a state of another format
# there would be refused, or worse, taken for one of its own.) `python -m localengine
# export` writes a file `pulumi stack import` takes.
BACKEND_VAR = "LOCALENGINE_BACKEND_URL"
MANIFEST_VERSION = "localengine"
STATE_FOLDER = ".localengine"


def backend_dir(project_dir: Path) -> Path:
    """`LOCALENGINE_BACKEND_URL=file://DIR` if set, else the project directory. Another
    scheme (the CLI's cloud, s3://, ...) is refused: the local engine keeps files only."""
    url = os.environ.get(BACKEND_VAR, "")
    if not url:
        return project_dir
    if not url.startswith("file://") or not url.removeprefix("file://"):
        raise StateError(
            f"{BACKEND_VAR} = {url[:200]!r}: the local engine keeps its states in a folder "
            f"only. Fix: set it to file://DIR, or unset it (the project's folder)"
        )
    return Path(url.removeprefix("file://")).expanduser()


def backend_dir_hint(path: Path) -> Path:
    """The `.localengine` folder above `path` (what a user makes writable)."""
    return next((p for p in path.parents if p.name == STATE_FOLDER), path.parent)


def _earlier_location(project_dir: Path, project: str) -> Path:
    """Where the local engine kept its states before they moved apart from the CLI's."""
    url = os.environ.get("PULUMI_BACKEND_URL", "")
    base = Path(url.removeprefix("file://")).expanduser() if url.startswith("file://") else None
    return (base or project_dir) / ".pulumi" / "stacks" / project


def secret_texts_of(
    resources: list[ResourceState], pending: list[PendingOperation] | None
) -> wire.SecretFilter:
    """Every secret text held by these records (inputs and outputs), as a filter: what a
    state or an export must not hold in clear."""
    found = wire.SecretFilter()
    everything = [*resources, *(op.resource for op in pending or [])]
    found.add([[r.inputs, r.outputs] for r in everything])
    return found


class StateError(Exception):
    """The stack's state file cannot be used; the message names the file and the fix."""


class StateFile:
    """Reads and writes one stack's checkpoint. Thread-safe: steps run in parallel."""

    def __init__(self, project_dir: Path, stack: str, project: str | None = None):
        """`project`: the project's name (default: Pulumi.yaml's in `project_dir`)."""
        self.project = project or project_name(project_dir)
        base = backend_dir(project_dir) / STATE_FOLDER / "stacks" / self.project
        self.path = base / f"{stack}.json"
        self._earlier = _earlier_location(project_dir, self.project) / f"{stack}.json"
        self.stack = stack
        self._key_file = base / f"{stack}.key"
        locks = backend_dir(project_dir) / STATE_FOLDER / "locks" / self.project
        self._lock_file = locks / f"{stack}.lock"
        self._lock = threading.Lock()
        self._fernet: Fernet | None = None
        self._salt = ""
        self._kind = ""  # the loaded state's secrets provider: "keyfile" or "passphrase"
        self.pending: list[PendingOperation] = []  # the loaded state's pending operations

    # --- secrets --------------------------------------------------------------------

    def _cipher(self) -> Fernet:
        """The state's own way: a state written with a key file keeps its key file, one
        written with a passphrase needs it; a new state takes the passphrase if one is set.
        (So PULUMI_CONFIG_PASSPHRASE set for another purpose, e.g. `export`, does not
        change how an existing state opens.)"""
        if self._fernet is None:
            passphrase = os.environ.get("PULUMI_CONFIG_PASSPHRASE")
            if self._kind == "keyfile":
                passphrase = None
            elif self._kind == "passphrase" and passphrase is None:
                raise self._refuse(
                    "its secrets are sealed with a passphrase",
                    "set PULUMI_CONFIG_PASSPHRASE to the passphrase it was written with",
                )
            if passphrase is not None:
                salt = base64.b64decode(self._salt) if self._salt else os.urandom(16)
                self._salt = base64.b64encode(salt).decode()
                kdf = Scrypt(salt=salt, length=32, n=2**14, r=8, p=1)
                key = base64.urlsafe_b64encode(kdf.derive(passphrase.encode()))
            else:
                self._key_file.parent.mkdir(parents=True, exist_ok=True)
                if self._kind == "keyfile" and not self._key_file.exists():
                    # A new key cannot open the old secrets: never made in its place.
                    raise self._refuse(
                        f"its key file {self._key_file} is missing",
                        "restore that file (or the passphrase the state was written with)",
                    )
                if not self._key_file.exists():
                    fd = os.open(self._key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    with os.fdopen(fd, "wb") as f:
                        f.write(Fernet.generate_key())
                key = self._key_file.read_bytes().strip()
            self._fernet = Fernet(key)
        return self._fernet

    def _seal(self, value: Any, echoes: wire.SecretFilter) -> Any:
        if wire.is_secret(value):
            text = json.dumps(wire.plain(value))
            token = self._cipher().encrypt(text.encode()).decode()
            return {wire.SIG_KEY: wire.SECRET_SIG, "ciphertext": token}
        if isinstance(value, str) and echoes.found(value):
            token = self._cipher().encrypt(value.encode()).decode()
            return {wire.SIG_KEY: ECHO_SIG, "ciphertext": token}
        if isinstance(value, dict):
            return {k: self._seal(v, echoes) for k, v in value.items()}
        if isinstance(value, list):
            return [self._seal(v, echoes) for v in value]
        return value

    def _open(self, value: Any) -> Any:
        sig = value.get(wire.SIG_KEY) if isinstance(value, dict) else None
        if sig in (wire.SECRET_SIG, ECHO_SIG):
            try:
                text = self._cipher().decrypt(str(value["ciphertext"]).encode())
            except InvalidToken:
                raise self._refuse(
                    "its secrets do not open with this key",
                    "set PULUMI_CONFIG_PASSPHRASE to the passphrase it was written with "
                    "(or restore its key file)",
                ) from None
            return text.decode() if sig == ECHO_SIG else wire.secret(json.loads(text))
        if isinstance(value, dict):
            return {k: self._open(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._open(v) for v in value]
        return value

    # --- file -----------------------------------------------------------------------

    @property
    def earlier_path(self) -> Path:
        """Where the local engine kept this stack's state before (moved on first use)."""
        return self._earlier

    def move_from_earlier_location(self) -> str:
        """A state the local engine wrote at its earlier place (under `.pulumi/`, where the
        CLI's file backend reads) moves here, with its key file: said in the returned
        line ("" when there is nothing to move). A state there of the CLI's own is left."""
        if self.path.exists() or not self._earlier.exists():
            return ""
        try:
            data = json.loads(self._earlier.read_text())
            manifest = data["checkpoint"]["latest"]["manifest"]
        except (OSError, ValueError, KeyError, TypeError):
            return ""
        if manifest.get("version") != MANIFEST_VERSION:
            return ""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        key = self._earlier.with_suffix(".key")
        if key.exists():
            os.replace(key, self._key_file)
        os.replace(self._earlier, self.path)
        return f"moved the local engine's state of {self.stack} from {self._earlier} to {self.path}"

    def _refuse(self, problem: str, fix: str) -> StateError:
        return StateError(f"{self.path}: {problem}; nothing was done. Fix: {fix}")

    def _checked(self, data: Any) -> dict[str, Any]:
        """The file's `latest` deployment, if it is this stack's local-engine state: a
        state of another format, project or stack is refused before anything runs (acted
        on, its resources would be deleted as ones the program no longer registers)."""
        if isinstance(data, dict) and "deployment" in data and "checkpoint" not in data:
            raise self._refuse(
                "this is a `pulumi stack export` file, not a local-engine state",
                "keep it elsewhere (`pulumi stack import` reads it)",
            )
        checkpoint = data.get("checkpoint") if isinstance(data, dict) else None
        if not isinstance(checkpoint, dict):
            checkpoint = {}
        latest = checkpoint.get("latest")
        if not isinstance(latest, dict):
            raise self._refuse("not a local-engine state (no checkpoint)", "move it away")
        version = (latest.get("manifest") or {}).get("version")
        if version != MANIFEST_VERSION:
            raise self._refuse(
                f"written by {version or 'something else'}, not by the local engine",
                "move it away (a Pulumi CLI state belongs to the CLI's backend)",
            )
        want = f"organization/{self.project}/{self.stack}"
        if checkpoint.get("stack") != want:
            raise self._refuse(
                f"the state of {checkpoint.get('stack')!r}, not of {want!r}",
                "move it to that stack's place, or pick that --stack",
            )
        prefix = f"urn:pulumi:{self.stack}::{self.project}::"
        ops = [op.get("resource") if isinstance(op, dict) else None
               for op in latest.get("pending_operations") or []]  # fmt: skip
        for raw in [*(latest.get("resources") or []), *ops]:
            urn = str(raw.get("urn", "")) if isinstance(raw, dict) else ""
            if not urn.startswith(prefix):
                raise self._refuse(
                    f"holds {urn!r}, which is not a resource of stack {self.stack!r} of "
                    f"project {self.project!r}",
                    "move the file away; this stack's state is not it",
                )
        return latest

    def load(self) -> list[ResourceState]:
        if not self.path.exists():
            return []
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError) as e:
            raise self._refuse(f"cannot be read as a state ({e})", "restore it from a copy") from e
        latest = self._checked(data)
        providers = latest.get("secrets_providers") or {}
        self._kind = str(providers.get("type") or "")
        self._salt = (providers.get("state") or {}).get("salt", "")
        resources = [self._record(raw) for raw in latest.get("resources") or []]
        self.pending = [
            PendingOperation(self._record(op.get("resource") or {}), str(op.get("type")))
            for op in latest.get("pending_operations") or []
            if isinstance(op, dict)
        ]
        return resources

    def _record(self, raw: dict[str, Any]) -> ResourceState:
        opened = {"inputs": self._open(raw.get("inputs") or {}),
                  "outputs": self._open(raw.get("outputs") or {})}  # fmt: skip
        return resource_state({**raw, **opened})

    def _sealed_record(self, r: ResourceState, echoes: wire.SecretFilter) -> dict[str, Any]:
        d = asdict(r)
        d["inputs"] = self._seal(r.inputs, echoes)
        d["outputs"] = self._seal(r.outputs, echoes)
        return d

    def save(
        self, resources: list[ResourceState], pending: list[PendingOperation] | None = None
    ) -> None:
        """Write the checkpoint: `resources` and the `pending` operations (DeploymentV3
        `pending_operations`)."""
        with self._lock:
            echoes = secret_texts_of(resources, pending)
            records = [self._sealed_record(r, echoes) for r in resources]
            operations = [
                {"resource": self._sealed_record(op.resource, echoes), "type": op.type}
                for op in pending or []
            ]
            provider: dict[str, Any] = {
                "type": "passphrase" if self._salt else "keyfile",
                "state": {},
            }
            if self._salt:
                provider["state"] = {"salt": self._salt}
            data = {
                "version": 3,
                "checkpoint": {
                    "stack": f"organization/{self.project}/{self.stack}",
                    "latest": {
                        "manifest": {"magic": "", "version": MANIFEST_VERSION},
                        "secrets_providers": provider,
                        "resources": records,
                        **({"pending_operations": operations} if operations else {}),
                    },
                },
            }
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".state-")
                with os.fdopen(fd, "w") as f:
                    json.dump(data, f, indent=1, sort_keys=True)
                os.replace(tmp, self.path)
            except OSError as e:
                raise StateError(
                    f"{e.filename or self.path}: cannot be written ({e.strerror}). Fix: make "
                    f"{backend_dir_hint(self.path)} writable, then `refresh` and `up` again"
                ) from None

    @contextlib.contextmanager
    def locked(self, operation: str) -> Iterator[None]:
        """Hold the stack's lock for an `up`, `refresh` or `destroy` (pulumi diy backend:
        Update, Refresh and Destroy lock the stack, Preview does not; a second run is
        refused: "the stack is currently locked"). An flock on
        `<backend>/.localengine/locks/<project>/<stack>.lock`: the system releases it when
        the holder ends, a kill -9 included, so no lock outlives its run."""
        try:
            self._lock_file.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self._lock_file, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:  # checked before the run: a state it could not write
            raise StateError(
                f"{e.filename or self._lock_file}: cannot be written ({e.strerror}); nothing "
                f"was done. Fix: make {backend_dir_hint(self._lock_file)} writable, or set "
                f"{BACKEND_VAR}=file://DIR to keep the states in another folder"
            ) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another run"
                raise StateError(
                    f"stack {self.stack!r} is currently locked by {holder}; nothing was done. "
                    "Fix: wait for that run to end (its lock goes with it, even if it is killed)"
                ) from None
            os.ftruncate(fd, 0)
            since = time.strftime("%H:%M:%S")
            os.pwrite(fd, f"pid {os.getpid()} ({operation} since {since} on "
                      f"{socket.gethostname()})\n".encode(), 0)  # fmt: skip
            yield
        finally:
            os.close(fd)

    def remove(self) -> None:
        """Forget the stack (its state at the earlier place too, if the engine wrote it)."""
        self.move_from_earlier_location()
        self.path.unlink(missing_ok=True)
