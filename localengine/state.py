"""The stack's state: one JSON file per stack, laid out like Pulumi's local backend
(`<backend>/.pulumi/stacks/<project>/<stack>.json`, a checkpoint of version 3 with a
`latest` deployment holding every resource's URN, type, ID, inputs, outputs, parent,
provider reference, dependencies and options).

Written after every step (atomically: a temp file renamed over the old one), so a crash
loses nothing that happened on a node. Secret values are encrypted in the file, as Pulumi
does with its passphrase secrets provider: the key is derived from
PULUMI_CONFIG_PASSPHRASE when it is set, else read from a 0600 key file beside the state.
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
import threading
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


def backend_dir(project_dir: Path) -> Path:
    """`PULUMI_BACKEND_URL=file://DIR` if set, else the project directory."""
    url = os.environ.get("PULUMI_BACKEND_URL", "")
    if url.startswith("file://"):
        return Path(url.removeprefix("file://")).expanduser()
    return project_dir


class StateFile:
    """Reads and writes one stack's checkpoint. Thread-safe: steps run in parallel."""

    def __init__(self, project_dir: Path, stack: str, project: str | None = None):
        """`project`: the project's name (default: Pulumi.yaml's in `project_dir`)."""
        self.project = project or project_name(project_dir)
        base = backend_dir(project_dir) / ".pulumi" / "stacks" / self.project
        self.path = base / f"{stack}.json"
        self.stack = stack
        self._key_file = base / f"{stack}.key"
        self._lock = threading.Lock()
        self._fernet: Fernet | None = None
        self._salt = ""

    # --- secrets --------------------------------------------------------------------

    def _cipher(self) -> Fernet:
        if self._fernet is None:
            passphrase = os.environ.get("PULUMI_CONFIG_PASSPHRASE")
            if passphrase is not None:
                salt = base64.b64decode(self._salt) if self._salt else os.urandom(16)
                self._salt = base64.b64encode(salt).decode()
                kdf = Scrypt(salt=salt, length=32, n=2**14, r=8, p=1)
                key = base64.urlsafe_b64encode(kdf.derive(passphrase.encode()))
            else:
                self._key_file.parent.mkdir(parents=True, exist_ok=True)
                if not self._key_file.exists():
                    fd = os.open(self._key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    with os.fdopen(fd, "wb") as f:
                        f.write(Fernet.generate_key())
                key = self._key_file.read_bytes().strip()
            self._fernet = Fernet(key)
        return self._fernet

    def _seal(self, value: Any) -> Any:
        if wire.is_secret(value):
            text = json.dumps(wire.plain(value))
            token = self._cipher().encrypt(text.encode()).decode()
            return {wire.SIG_KEY: wire.SECRET_SIG, "ciphertext": token}
        if isinstance(value, dict):
            return {k: self._seal(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._seal(v) for v in value]
        return value

    def _open(self, value: Any) -> Any:
        if isinstance(value, dict) and value.get(wire.SIG_KEY) == wire.SECRET_SIG:
            try:
                text = self._cipher().decrypt(str(value["ciphertext"]).encode())
            except InvalidToken:
                raise RuntimeError(
                    f"cannot decrypt the secrets in {self.path}; fix: set "
                    "PULUMI_CONFIG_PASSPHRASE to the passphrase it was written with"
                ) from None
            return wire.secret(json.loads(text))
        if isinstance(value, dict):
            return {k: self._open(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._open(v) for v in value]
        return value

    # --- file -----------------------------------------------------------------------

    def load(self) -> list[ResourceState]:
        if not self.path.exists():
            return []
        data = json.loads(self.path.read_text())
        latest = data.get("checkpoint", {}).get("latest") or {}
        self._salt = latest.get("secrets_providers", {}).get("state", {}).get("salt", "")
        resources = []
        for raw in latest.get("resources") or []:
            raw = dict(raw)
            raw["inputs"] = self._open(raw.get("inputs") or {})
            raw["outputs"] = self._open(raw.get("outputs") or {})
            # Fields the engine does not use (other ResourceV3 fields) are not carried.
            resources.append(ResourceState(**{k: v for k, v in raw.items() if k in _FIELDS}))
        return resources

    def save(self, resources: list[ResourceState]) -> None:
        with self._lock:
            records = []
            for r in resources:
                d = asdict(r)
                d["inputs"] = self._seal(r.inputs)
                d["outputs"] = self._seal(r.outputs)
                records.append(d)
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
                        "manifest": {"magic": "", "version": "localengine"},
                        "secrets_providers": provider,
                        "resources": records,
                    },
                },
            }
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".state-")
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
