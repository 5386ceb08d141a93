"""A stack's state in the form `pulumi stack export` writes and `pulumi stack import` reads,
so a stack deployed with the local engine moves to the Pulumi CLI without redeploying:

    PULUMI_CONFIG_PASSPHRASE=... python -m localengine export --stack spark --file spark.json
    pulumi stack init spark --secrets-provider passphrase     # or: pulumi stack select spark
    pulumi stack import --stack spark --file spark.json

The rules, read at pulumi/pulumi v3.259.0:

- the file is an UntypedDeployment of version 3 (`sdk/go/common/apitype/core.go`:
  UntypedDeployment, DeploymentV3, ManifestV1, ResourceV3; `DeploymentSchemaVersionCurrent`);
  `customTimeouts` are seconds (`sdk/go/common/resource/custom_timeouts.go`; the program's
  duration strings parsed as `time.ParseDuration`, `source_eval.go` RegisterResource);
  the manifest's magic is the sha256 of its version (`pkg/resource/deploy/manifest.go:NewMagic`);
- secrets are in the passphrase secrets manager's own format (`pkg/secrets/passphrase/
  manager.go`, `sdk/go/common/resource/config/crypt.go`): AES-256-GCM under a key made by
  PBKDF2-SHA256 of the passphrase over an 8-byte salt, 1,000,000 iterations; a value is
  `v1:<base64 nonce>:<base64 sealed>`, sealing the JSON text of the secret's value
  (`pkg/resource/stack/deployment.go:SerializePropertyValue`); the manager's state is
  `{"salt": "v1:<base64 salt>:<the encryption of \"pulumi\">"}`, which is how the CLI
  tells a wrong passphrase.

`import` reads the same form back (`deployment_resources`), with the checks of
`pkg/cmd/pulumi/stack/io.go` SaveSnapshot: every resource of this stack (here: and this
project, which the local engine's state names), dependencies before dependents
(`snapshot.VerifyIntegrity`), and the pending operations dropped, each with a warning.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from datetime import UTC, datetime
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from localengine import wire
from localengine.state import (
    MANIFEST_VERSION,
    PendingOperation,
    ResourceState,
    resource_state,
    secret_texts_of,
)

PBKDF2_ITERATIONS = 1_000_000
_CHECK = "pulumi"


class ExportError(Exception):
    """The export cannot be written (the message says what to do)."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class PassphraseCrypter:
    """The passphrase secrets manager's crypter (crypt.go symmetricCrypter)."""

    def __init__(self, passphrase: str, salt: bytes):
        self.salt = salt
        key = hashlib.pbkdf2_hmac("sha256", passphrase.encode(), salt, PBKDF2_ITERATIONS, 32)
        self._aes = AESGCM(key)

    @classmethod
    def new(cls, passphrase: str) -> PassphraseCrypter:
        """NewPassphraseSecretsManager: a fresh 8-byte salt."""
        return cls(passphrase, os.urandom(8))

    @classmethod
    def from_state(cls, passphrase: str, state: str) -> PassphraseCrypter:
        """symmetricCrypterFromPhraseAndState: `v1:<salt>:<check>`; the check must open
        to "pulumi", else the passphrase is wrong."""
        parts = state.split(":", 2)
        if len(parts) != 3:
            raise ExportError("malformed state value")
        if parts[0] != "v1":
            raise ExportError("unknown state version")
        crypter = cls(passphrase, base64.b64decode(parts[1]))
        try:
            ok = crypter.decrypt(parts[2]) == _CHECK
        except (ExportError, InvalidTag, ValueError):
            ok = False
        if not ok:
            raise ExportError("incorrect passphrase")
        return crypter

    def state(self) -> str:
        return f"v1:{_b64(self.salt)}:{self.encrypt(_CHECK)}"

    def encrypt(self, text: str) -> str:
        nonce = os.urandom(12)
        return f"v1:{_b64(nonce)}:{_b64(self._aes.encrypt(nonce, text.encode(), None))}"

    def decrypt(self, value: str) -> str:
        parts = value.split(":")
        if len(parts) != 3 or parts[0] != "v1":
            raise ExportError("bad value: not a v1 ciphertext")
        nonce, sealed = base64.b64decode(parts[1]), base64.b64decode(parts[2])
        return self._aes.decrypt(nonce, sealed, None).decode()


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration_seconds(text: str) -> float:
    """Go's time.ParseDuration, in seconds ("3600s", "1h30m", "1.5h")."""
    text = text.strip()
    if text in ("", "0"):
        return 0.0
    pos, total = 0, 0.0
    for match in _DURATION.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT_S[match.group(2)]
        pos = match.end()
    if pos != len(text):
        raise ExportError(f"invalid duration {text!r} in a resource's customTimeouts")
    return total


def _sealed(value: Any, crypter: PassphraseCrypter, echoes: wire.SecretFilter) -> Any:
    """A property value with each secret as the CLI writes it (SecretV1, ciphertext); a
    plain string that holds a secret's text is written as a secret too (the local state
    seals it at rest: state.py ECHO_SIG; the CLI's state has no other way to)."""
    if wire.is_secret(value) or (isinstance(value, str) and echoes.found(value)):
        text = json.dumps(wire.plain(value), separators=(",", ":"))
        return {wire.SIG_KEY: wire.SECRET_SIG, "ciphertext": crypter.encrypt(text)}
    if isinstance(value, dict):
        return {k: _sealed(v, crypter, echoes) for k, v in value.items()}
    if isinstance(value, list):
        return [_sealed(v, crypter, echoes) for v in value]
    return value


def resource_v3(
    res: ResourceState, crypter: PassphraseCrypter, echoes: wire.SecretFilter
) -> dict[str, Any]:
    """ResourceV3: the fields the engine keeps, empty ones left out (omitempty)."""
    out: dict[str, Any] = {"urn": res.urn, "custom": res.custom, "type": res.type}
    optional: dict[str, Any] = {
        "delete": res.delete,
        "id": res.id,
        "inputs": _sealed(res.inputs, crypter, echoes),
        "outputs": _sealed(res.outputs, crypter, echoes),
        "parent": res.parent,
        "dependencies": res.dependencies,
        "initErrors": res.initErrors,
        "provider": res.provider,
        "propertyDependencies": res.propertyDependencies,
        "additionalSecretOutputs": res.additionalSecretOutputs,
        "aliases": res.aliases,
        "ignoreChanges": res.ignoreChanges,
        "replaceOnChanges": res.replaceOnChanges,
    }
    timeouts = {
        k: duration_seconds(str(v))
        for k, v in res.customTimeouts.items()
        if k in ("create", "update", "delete", "read")
    }
    optional["customTimeouts"] = {k: v for k, v in timeouts.items() if v}
    out.update({k: v for k, v in optional.items() if v})
    return out


def untyped_deployment(
    resources: list[ResourceState], passphrase: str, pending: list[PendingOperation] | None = None
) -> dict[str, Any]:
    """The stack as `pulumi stack export` writes it; its pending operations go along
    (OperationV2), and `pulumi stack import` drops them with a warning each."""
    crypter = PassphraseCrypter.new(passphrase)
    echoes = secret_texts_of(resources, pending)
    operations = [
        {"resource": resource_v3(op.resource, crypter, echoes), "type": op.type}
        for op in pending or []
    ]
    version = f"{MANIFEST_VERSION} (spark-vllm)"
    return {
        "version": 3,
        "deployment": {
            "manifest": {
                "time": datetime.now(UTC).isoformat(),
                "magic": hashlib.sha256(version.encode()).hexdigest(),
                "version": version,
            },
            "secrets_providers": {"type": "passphrase", "state": {"salt": crypter.state()}},
            "resources": [resource_v3(r, crypter, echoes) for r in resources],
            **({"pending_operations": operations} if operations else {}),
        },
    }


# ResourceV3 fields of options the local engine does not model: a resource carrying one is
# refused, as the engine refuses the option in a program.
_UNMODELLED = ("protect", "external", "pendingReplacement", "retainOnDelete", "deletedWith",
               "importID", "refreshBeforeUpdate", "viewOf", "replaceWith")  # fmt: skip


def _opened(value: Any, crypter: PassphraseCrypter | None) -> Any:
    """A property value with each secret opened (ciphertext, or plaintext as `stack export
    --show-secrets` writes it) and kept secret."""
    if isinstance(value, dict) and value.get(wire.SIG_KEY) == wire.SECRET_SIG:
        if "plaintext" in value:
            return wire.secret(json.loads(str(value["plaintext"])))
        if crypter is None:
            raise ExportError(
                "its secrets are sealed with a passphrase; fix: set PULUMI_CONFIG_PASSPHRASE"
            )
        try:
            return wire.secret(json.loads(crypter.decrypt(str(value.get("ciphertext")))))
        except (InvalidTag, ValueError) as e:
            raise ExportError(f"a secret does not open with this passphrase ({e})") from None
    if isinstance(value, dict):
        return {k: _opened(v, crypter) for k, v in value.items()}
    if isinstance(value, list):
        return [_opened(v, crypter) for v in value]
    return value


def _record(raw: Any, crypter: PassphraseCrypter | None) -> ResourceState:
    if not isinstance(raw, dict) or not raw.get("urn") or not raw.get("type"):
        raise ExportError(f"not a resource (no urn or type): {str(raw)[:120]}")
    options = [k for k in _UNMODELLED if raw.get(k)]
    if options:
        raise ExportError(f"{raw['urn']}: sets {options[0]}, which the local engine does not model")
    # ResourceV3 leaves empty fields out (omitempty) and gives customTimeouts in seconds;
    # the engine keeps the program's duration strings.
    timeouts = raw.get("customTimeouts") or {}
    return resource_state({
        **raw, "custom": bool(raw.get("custom")),
        "inputs": _opened(raw.get("inputs") or {}, crypter),
        "outputs": _opened(raw.get("outputs") or {}, crypter),
        "customTimeouts": {k: f"{float(v):.9f}".rstrip("0").rstrip(".") + "s"
                           for k, v in timeouts.items() if v},
    })  # fmt: skip


def deployment_resources(
    data: Any, passphrase: str | None, stack: str, project: str
) -> tuple[list[ResourceState], list[str]]:
    """The resources of an UntypedDeployment of version 3, secrets opened; and the warnings
    (one per pending operation dropped). Refused: another form, a resource of another
    stack or project, a dependency after its dependent."""
    if not isinstance(data, dict) or "deployment" not in data:
        raise ExportError("not a `stack export` file (no deployment)")
    if data.get("version") != 3:
        raise ExportError(f"deployment version {data.get('version')!r}; this reads version 3")
    deployment = data["deployment"] if isinstance(data["deployment"], dict) else {}
    providers = deployment.get("secrets_providers") or {}
    crypter = None
    if providers.get("type") == "passphrase" and passphrase is not None:
        salt = (providers.get("state") or {}).get("salt")
        if not salt:
            raise ExportError("its passphrase secrets provider has no salt")
        crypter = PassphraseCrypter.from_state(passphrase, str(salt))
    elif providers and providers.get("type") != "passphrase":
        raise ExportError(f"secrets provider {providers.get('type')!r}; this reads passphrase")
    resources = [_record(raw, crypter) for raw in deployment.get("resources") or []]
    prefix = f"urn:pulumi:{stack}::{project}::"
    seen: set[str] = set()
    for res in resources:
        if not res.urn.startswith(prefix):
            raise ExportError(
                f"resource {res.urn!r} is not of stack {stack!r} of project {project!r}; "
                "importing this file could be dangerous"
            )
        missing = sorted(d for d in res.all_dependencies() if d not in seen)
        if missing:
            raise ExportError(
                f"state file contains errors: {res.urn} refers to {missing[0]}, which does "
                "not come before it"
            )
        seen.add(res.urn)
    warnings = [
        f"removing pending operation '{op.get('type')}' on "
        f"'{(op.get('resource') or {}).get('urn')}' from snapshot"
        for op in deployment.get("pending_operations") or []
        if isinstance(op, dict)
    ]
    return resources, warnings


def passphrase_from_env() -> str:
    """PULUMI_CONFIG_PASSPHRASE, or the file PULUMI_CONFIG_PASSPHRASE_FILE names, as the CLI
    reads them (manager.go readPassphrase)."""
    if "PULUMI_CONFIG_PASSPHRASE" in os.environ:
        return os.environ["PULUMI_CONFIG_PASSPHRASE"]
    path = os.environ.get("PULUMI_CONFIG_PASSPHRASE_FILE")
    if path:
        try:
            with open(os.path.abspath(path)) as f:
                return f.read().strip()  # strings.TrimSpace
        except OSError as e:
            raise ExportError(f"PULUMI_CONFIG_PASSPHRASE_FILE={path}: {e.strerror}") from None
    raise ExportError(
        "the export's secrets are sealed with the passphrase the Pulumi CLI stack will use; "
        "fix: set PULUMI_CONFIG_PASSPHRASE (or PULUMI_CONFIG_PASSPHRASE_FILE)"
    )
