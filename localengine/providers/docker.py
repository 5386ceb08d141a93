"""pulumi-docker 5.2.0, i.e. kreuzwerker/terraform-provider-docker through Pulumi's
Terraform bridge (rules and sources: docs/engine-rules.md).

Provider (`pulumi:providers:docker`): `host` ssh://user@host:port and `sshOpts`; every API
call goes over the workstation's `ssh`. Here container create and start use the Engine API
over that same `ssh ... docker system dial-stdio`; inspect, update, stop and remove run the
docker CLI on the node over the same ssh command line (a stand-in: same daemon, same
answers).

Rules traced from kreuzwerker v4.5.0, the upstream pulumi-docker 5.x pins (the newer
upstream of 5.2.0 is not public in this form; its schema differs only in fields unused here).

Container: the bridge diffs the new inputs against the STATE (old outputs: what the last
create, update or read recorded); a change of a ForceNew attribute replaces, deleting
first (pulumi-docker sets DeleteBeforeReplace), any other change is an update. Read drops a
container that is gone; a stopped one gets `exitCode` and `mustRun` false in state (no wait,
no delete), so the next `up` updates it, which starts it again. `envs`, `labels` and
`volumes` are not read back. Update changes the restart policy and limits of the live
container, starts it when `mustRun` goes false -> true, and records the planned state.

RemoteImage: create uses the image already on the node, pulling only when it is absent;
read drops it when the image is gone; delete removes it unless `keepLocally`; a
replacement creates before it deletes.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from components.adapters import go_duration
from localengine import wire
from localengine.providers.base import (
    DiffResult,
    PartialCreate,
    ProviderError,
    ReadResult,
    Transport,
    refuse_unknown_inputs,
)
from sparkvllm.specs.ssh import SshOptions, SshTarget

PROVIDER = "pulumi:providers:docker"
CONTAINER = "docker:index/container:Container"
REMOTE_IMAGE = "docker:index/remoteImage:RemoteImage"

# resource_docker_container.go: attributes without ForceNew (the rest force a new container).
_CONTAINER_NOT_FORCE_NEW = {
    "restart", "maxRetryCount", "cpuShares", "memory", "memorySwap", "cpuSet", "rm",
    "mustRun", "start", "attach", "logs", "wait", "waitTimeout", "healthcheck",
    "destroyGraceSeconds", "removeVolumes", "containerReadRefreshTimeoutMilliseconds",
}  # fmt: skip
# resourceDockerContainerUpdate: what an update changes on the live container.
_CONTAINER_UPDATED_LIVE = {"restart", "maxRetryCount", "cpuShares", "memory", "memorySwap",
                           "cpuSet"}  # fmt: skip
_CONTAINER_INPUTS = {"rm",
    "name", "image", "command", "entrypoints", "envs", "labels", "networkMode", "ipcMode",
    "pidMode", "gpus", "volumes", "devices", "ulimits", "capabilities", "restart",
    "maxRetryCount", "healthcheck", "stopTimeout", "mustRun", "wait", "waitTimeout", "shmSize",
    "start", "logs", "attach", "destroyGraceSeconds", "removeVolumes",
    "containerReadRefreshTimeoutMilliseconds",
}  # fmt: skip
# Schema defaults the bridge fills in at Check.
_CONTAINER_DEFAULTS: dict[str, Any] = {
    "restart": "no", "mustRun": True, "start": True, "attach": False, "logs": False,
    "wait": False, "waitTimeout": 60, "removeVolumes": True, "rm": False,
    "networkMode": "bridge", "containerReadRefreshTimeoutMilliseconds": 15000,
}  # fmt: skip
_HEALTHCHECK_DEFAULTS = {"interval": "0s", "timeout": "0s", "startPeriod": "0s",
                         "startInterval": "0s", "retries": 0}  # fmt: skip
# Optional+Computed: a value the config no longer sets keeps the prior one (no change).
_CONTAINER_COMPUTED = {"hostname", "command", "entrypoints", "securityOpts", "runtime",
                       "platform", "stopSignal", "stopTimeout", "shmSize", "logDriver",
                       "ipcMode", "envs", "labels", "healthcheck", "init"}  # fmt: skip
# TypeSet attributes: compared as sets (order does not matter to Terraform).
_CONTAINER_SETS = {"envs", "labels", "volumes", "devices", "ulimits", "mounts"}
_IMAGE_INPUTS = {"name", "keepLocally", "forceRemove", "pullTriggers", "triggers", "platform"}
_IMAGE_NOT_FORCE_NEW = {"keepLocally", "forceRemove"}


class DockerProvider:
    def __init__(self, transport: Transport, provider_inputs: dict[str, Any]):
        self._transport = transport
        self._target = _target(provider_inputs)

    # --- engine calls ---------------------------------------------------------------

    def check(self, typ: str, olds: dict[str, Any], news: dict[str, Any]) -> dict[str, Any]:
        if typ == CONTAINER:
            out = {**_CONTAINER_DEFAULTS, **{k: v for k, v in news.items() if v is not None}}
            if isinstance(out.get("healthcheck"), dict):
                out["healthcheck"] = {**_HEALTHCHECK_DEFAULTS, **out["healthcheck"]}
            for d in out.get("devices") or []:
                if isinstance(d, dict):
                    d.setdefault("permissions", "rwm")
            return out
        if typ == REMOTE_IMAGE:
            return {k: v for k, v in news.items() if v is not None}
        raise ProviderError(f"the local engine does not model {typ} (pulumi-docker)")

    def diff(
        self, typ: str, id_: str, old_inputs: dict[str, Any], old_outputs: dict[str, Any],
        news: dict[str, Any],
    ) -> DiffResult:  # fmt: skip
        # The bridge plans against the state: outputs, which hold every attribute.
        planned = _as_sets(typ, {k: old_outputs.get(k, old_inputs.get(k)) for k in news})
        changes = [k for k in wire.changed_keys(planned, _as_sets(typ, news)) if k in news]
        computed = _CONTAINER_COMPUTED if typ == CONTAINER else set()
        # An attribute the config set before and no longer sets is a change (unless computed).
        changes += sorted(
            k for k, v in old_inputs.items()
            if k not in news and k not in computed and not wire.empty(v)
        )  # fmt: skip
        keep = _CONTAINER_NOT_FORCE_NEW if typ == CONTAINER else _IMAGE_NOT_FORCE_NEW
        replaces = [k for k in changes if k not in keep]
        # resources.go: Container is DeleteBeforeReplace; RemoteImage creates first.
        return DiffResult(
            changes, replaces, delete_before_replace=typ == CONTAINER and bool(replaces)
        )

    def create(
        self, typ: str, name: str, inputs: dict[str, Any], preview: bool
    ) -> tuple[str, dict[str, Any]]:
        if typ == CONTAINER:
            refuse_unknown_inputs(typ, name, inputs, _CONTAINER_INPUTS)
            plain = wire.plain(inputs)
            for key, modelled in (("start", True), ("wait", False), ("attach", False),
                                  ("logs", False), ("rm", False)):  # fmt: skip
                if plain.get(key, modelled) != modelled:
                    raise ProviderError(f"{name}: Container {key}={plain[key]} is not modelled")
            if preview:
                return "", {**inputs, "id": wire.UNKNOWN}
            image = str(plain["image"])
            if self._image_id(image) is None:
                self._pull(name, image)  # findImage: the local image, else a pull
            cid = self._create_container(name, plain)
            try:
                self._start(name, cid)
            except ProviderError as e:
                # The ID is set right after ContainerCreate: a failure after it is a
                # partial create, recorded with the container.
                found = self._inspect_container(cid)
                outs = _read_back({**inputs, "id": cid}, found) if found else {**inputs, "id": cid}
                raise PartialCreate(str(e), cid, outs) from None
            # Create ends with a Read (an exited container is recorded with mustRun false).
            found = self._inspect_container(cid)
            if found is None:
                raise ProviderError(f"{name}: container {cid} vanished right after it started")
            return cid, _read_back({**inputs, "id": cid}, found)
        refuse_unknown_inputs(typ, name, inputs, _IMAGE_INPUTS)
        ref = str(wire.plain(inputs["name"]))
        if preview:
            return "", {**inputs, "imageId": wire.UNKNOWN, "repoDigest": wire.UNKNOWN}
        image_id = self._image_id(ref)
        if image_id is None:
            # findImage: not on the node, so pull it from its registry.
            self._pull(name, ref)
            image_id = self._image_id(ref)
            if image_id is None:
                raise ProviderError(f"{name}: image {ref} not found after pull")
        return f"{image_id}{ref}", {**inputs, "imageId": image_id, "repoDigest": ""}

    def read(
        self, typ: str, id_: str, inputs: dict[str, Any], outputs: dict[str, Any]
    ) -> ReadResult:
        if typ == REMOTE_IMAGE:
            image_id = self._image_id(str(wire.plain(outputs.get("name") or inputs["name"])))
            if image_id is None:
                return ReadResult(None, inputs, outputs)
            return ReadResult(id_, inputs, {**outputs, "imageId": image_id})
        found = self._inspect_container(id_)
        if found is None:
            return ReadResult(None, inputs, outputs)
        outs = _read_back(outputs, found)
        # ExtractInputsFromOutputs on refresh: inputs already present take the read value.
        new_inputs = {k: outs.get(k, v) if k in _READ_INTO_INPUTS else v for k, v in inputs.items()}
        return ReadResult(id_, new_inputs, outs)

    def update(
        self, typ: str, name: str, id_: str, old_outputs: dict[str, Any], news: dict[str, Any],
        preview: bool,
    ) -> dict[str, Any]:  # fmt: skip
        if typ != CONTAINER:
            return {**old_outputs, **news}
        refuse_unknown_inputs(typ, name, news, _CONTAINER_INPUTS)
        # As in diff: only attributes the config sets (null in config, zero in state: no change).
        changed = set(wire.changed_keys({k: old_outputs.get(k) for k in news}, news))
        if not preview:
            if "mustRun" in changed and news.get("mustRun") and news.get("start", True):
                self._start(name, id_)
            if changed & _CONTAINER_UPDATED_LIVE:
                restart = str(wire.plain(news.get("restart")) or "no")
                if restart == "on-failure" and news.get("maxRetryCount"):
                    restart += f":{int(news['maxRetryCount'])}"
                self._update_restart(name, id_, restart)
        # No Read after an update: the state is the planned state.
        return {**old_outputs, **news, "id": id_}

    def delete(self, typ: str, id_: str, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
        if typ == REMOTE_IMAGE:
            if not wire.plain(outputs.get("keepLocally", inputs.get("keepLocally"))):
                ref = str(wire.plain(outputs.get("name") or inputs.get("name")))
                self._remove_image(id_, ref, bool(wire.plain(outputs.get("forceRemove"))))
            return
        # Stop with destroyGraceSeconds (default 0), then remove with force.
        grace = int(wire.plain(outputs.get("destroyGraceSeconds")) or 0)
        self._remove_container(id_, grace, bool(wire.plain(outputs.get("removeVolumes", True))))

    # --- the node's docker (the seam: each primitive is one docker CLI call over ssh) --

    def _create_container(self, name: str, inputs: dict[str, Any]) -> str:
        """ContainerCreate through the Engine API over `docker system dial-stdio` (the
        provider's own transport), so entrypoints, command and healthcheck tests reach the
        daemon exactly as given."""
        created = self._api(name, "POST", f"/containers/create?name={inputs['name']}",
                            create_body(inputs))  # fmt: skip
        return str(created["Id"])

    def _api(self, name: str, method: str, path: str, body: dict[str, Any] | None) -> Any:
        payload = json.dumps(body) if body is not None else ""
        request = (
            f"{method} /v1.41{path} HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload.encode())}\r\n\r\n"
            f"{payload}"
        )
        result = self._transport(
            self._target, "docker system dial-stdio", stdin=request, timeout=600
        )
        status, answer = _http_response(str(result.stdout))
        if status >= 300:
            raise ProviderError(f"{name}: docker API {method} {path} on {self._target.host}: "
                                f"{status} {answer.strip()[:500]}")  # fmt: skip
        return json.loads(answer) if answer.strip() else None

    def _start(self, name: str, id_: str) -> None:
        self._api(name, "POST", f"/containers/{id_}/start", None)

    def _update_restart(self, name: str, id_: str, restart: str) -> None:
        self._docker(
            name, f"docker update --restart {shlex.quote(restart)} {shlex.quote(id_)} >/dev/null"
        )

    def _remove_container(self, id_: str, grace: int, volumes: bool) -> None:
        """Stop (grace seconds), then remove with force; "No such container" is not an
        error, anything else is (resourceDockerContainerDelete)."""
        cid, vols = shlex.quote(id_), " -v" if volumes else ""
        self._docker(
            id_,
            f"{{ docker stop -t {grace} {cid} >/dev/null 2>&1 || true; }}; "
            f"out=$(docker rm -f{vols} {cid} 2>&1) || "
            f'{{ case "$out" in *"No such container"*) ;; *) echo "$out" >&2; exit 1;; esac; }}',
        )

    def _pull(self, name: str, ref: str) -> None:
        self._docker(name, f"docker pull {shlex.quote(ref)} >&2")

    def _remove_image(self, name: str, ref: str, force: bool) -> None:
        """removeImage: by name, only when present; its errors are errors."""
        if self._image_id(ref) is not None:
            flag = " --force" if force else ""
            self._docker(name, f"docker image rm{flag} {shlex.quote(ref)} >/dev/null")

    def _docker(self, name: str, command: str) -> str:
        result = self._transport(self._target, command, stdin=None, timeout=3600)
        if result.returncode != 0:
            tail = "\n".join(str(result.stderr).strip().splitlines()[-15:])
            raise ProviderError(f"{name}: docker on {self._target.host} failed:\n{tail}")
        return str(result.stdout)

    def _image_id(self, ref: str) -> str | None:
        """The local image's ID; None only when the daemon says there is no such image."""
        out = self._docker(ref, _not_found_is_empty(
            f"docker image inspect --format '{{{{.Id}}}}' {shlex.quote(ref)}", "No such image"
        )).strip()  # fmt: skip
        return out or None

    def _inspect_container(self, id_or_name: str) -> dict[str, Any] | None:
        out = self._docker(id_or_name, _not_found_is_empty(
            f"docker container inspect {shlex.quote(id_or_name)}", "No such container"
        )).strip()  # fmt: skip
        found = json.loads(out) if out else []
        return found[0] if found else None


def _not_found_is_empty(command: str, not_found: str) -> str:
    """`command`; prints nothing when the daemon answers `not_found`, fails otherwise (a
    daemon that is down or refuses is an error, not an absent resource)."""
    return (
        f"out=$({command} 2>&1) && printf '%s\\n' \"$out\" || "
        f'{{ case "$out" in *{shlex.quote(not_found)}*) ;; *) echo "$out" >&2; exit 1;; esac; }}'
    )


def _as_sets(typ: str, values: dict[str, Any]) -> dict[str, Any]:
    """TypeSet attributes in a canonical order, so that a reorder is no change."""
    if typ != CONTAINER:
        return values
    out = dict(values)
    for k in _CONTAINER_SETS:
        if isinstance(out.get(k), list) and not wire.has_unknown(out[k]):
            out[k] = sorted(out[k], key=lambda v: json.dumps(wire.plain(v), sort_keys=True))
    caps = out.get("capabilities")
    if isinstance(caps, dict) and not wire.has_unknown(caps):
        out["capabilities"] = {k: sorted(v) for k, v in caps.items() if isinstance(v, list)}
    return out


def _target(provider_inputs: dict[str, Any]) -> SshTarget:
    host = str(wire.plain(provider_inputs.get("host") or ""))
    if not host.startswith("ssh://"):
        raise ProviderError(f"docker provider host {host!r}: the local engine models ssh:// only")
    userhost, _, port = host.removeprefix("ssh://").rpartition(":")
    user, _, hostname = userhost.rpartition("@")
    opts = wire.plain(provider_inputs.get("sshOpts")) or []
    if isinstance(opts, str):  # provider config crosses the wire as a JSON string
        opts = json.loads(opts)
    options = SshOptions(extra=tuple(str(o) for o in opts), as_given=True)
    return SshTarget(user or "root", hostname.strip("[]"), int(port or 22), options)


def go_duration_ns(ns: int) -> str:
    """A duration as Go prints it ("1m30s"), which is how the provider reads it back."""
    return go_duration(ns // 1_000_000_000)


_READ_INTO_INPUTS = {"image", "name", "command", "entrypoints", "networkMode", "ipcMode",
                     "pidMode", "restart", "maxRetryCount", "capabilities", "healthcheck",
                     "stopTimeout", "mustRun"}  # fmt: skip


def _read_back(state: dict[str, Any], found: dict[str, Any]) -> dict[str, Any]:
    """`state` with the attributes resourceDockerContainerRead sets from the live container
    (env, labels and volumes keep their recorded values)."""
    config, host = found.get("Config") or {}, found.get("HostConfig") or {}
    policy = host.get("RestartPolicy") or {}
    image = str(wire.plain(state.get("image")) or "")
    out: dict[str, Any] = {
        **state,
        "id": found["Id"],
        "name": str(found.get("Name", "")).lstrip("/"),
        # A sha256 ID reads back as the container's image ID, a name as the name given.
        "image": found.get("Image", "") if image.startswith("sha256:") else config.get("Image", ""),
        "command": list(config.get("Cmd") or []),
        "entrypoints": list(config.get("Entrypoint") or []),
        "networkMode": host.get("NetworkMode", ""),
        "ipcMode": host.get("IpcMode", ""),
        "restart": policy.get("Name") or "no",
        "maxRetryCount": policy.get("MaximumRetryCount") or 0,
    }
    if not found["State"]["Running"]:
        out["exitCode"] = found["State"].get("ExitCode", 0)
        if wire.plain(state.get("mustRun", True)):
            out["mustRun"] = False
    if state.get("pidMode"):
        out["pidMode"] = host.get("PidMode", "")
    if host.get("CapAdd") or host.get("CapDrop"):
        # Strings exactly as the daemon stores them (no CAP_ normalisation).
        caps: dict[str, Any] = {"adds": list(host.get("CapAdd") or [])}
        if host.get("CapDrop"):
            caps["drops"] = list(host["CapDrop"])
        out["capabilities"] = caps
    hc = config.get("Healthcheck")
    if hc and hc.get("Test"):
        out["healthcheck"] = {
            "tests": list(hc["Test"]),
            "interval": go_duration_ns(int(hc.get("Interval") or 0)),
            "timeout": go_duration_ns(int(hc.get("Timeout") or 0)),
            "startPeriod": go_duration_ns(int(hc.get("StartPeriod") or 0)),
            "startInterval": go_duration_ns(int(hc.get("StartInterval") or 0)),
            "retries": hc.get("Retries") or 0,
        }
    if config.get("StopTimeout") is not None:
        out["stopTimeout"] = config["StopTimeout"]
    return out


def _http_response(raw: str) -> tuple[int, str]:
    """Status and body of one HTTP/1.1 response (text mode: line ends read as \\n)."""
    head, _, body = raw.replace("\r\n", "\n").partition("\n\n")
    lines = head.split("\n")
    try:
        status = int(lines[0].split()[1])
    except (IndexError, ValueError):
        raise ProviderError(f"docker API: no HTTP answer ({raw[:200]!r})") from None
    if any(line.lower() == "transfer-encoding: chunked" for line in lines[1:]):
        out, rest = [], body
        while rest:
            size_line, _, rest = rest.partition("\n")
            size = int(size_line.strip() or "0", 16)
            if size == 0:
                break
            out.append(rest[:size])
            rest = rest[size:].removeprefix("\n")
        body = "".join(out)
    return status, body


def _ns(go: str) -> int:
    """A Go duration ("1m30s", "500ms") in nanoseconds."""
    total, num = 0.0, ""
    units = {"h": 3600e9, "m": 60e9, "s": 1e9, "ms": 1e6, "us": 1e3, "ns": 1.0}
    i = 0
    while i < len(go):
        if go[i].isdigit() or go[i] == ".":
            num += go[i]
            i += 1
            continue
        unit = go[i : i + 2] if go[i : i + 2] in ("ms", "us", "ns") else go[i]
        total += float(num or 0) * units[unit]
        num, i = "", i + len(unit)
    return int(total)


def create_body(inputs: dict[str, Any]) -> dict[str, Any]:
    """The ContainerCreate request the provider builds from a Container's inputs
    (resourceDockerContainerCreate: container.Config and HostConfig)."""
    restart: dict[str, Any] = {"Name": str(inputs.get("restart") or "no")}
    if inputs.get("restart") == "on-failure":
        restart["MaximumRetryCount"] = int(inputs.get("maxRetryCount") or 0)
    host: dict[str, Any] = {
        "NetworkMode": inputs.get("networkMode") or "bridge",
        "RestartPolicy": restart,
        "Binds": [f"{v['hostPath']}:{v['containerPath']}" + (":ro" if v.get("readOnly") else "")
                  for v in inputs.get("volumes") or []],
        "Devices": [{"PathOnHost": d["hostPath"], "PathInContainer": d["containerPath"],
                     "CgroupPermissions": d.get("permissions") or "rwm"}
                    for d in inputs.get("devices") or []],
        "Ulimits": [{"Name": u["name"], "Soft": int(u["soft"]), "Hard": int(u["hard"])}
                    for u in inputs.get("ulimits") or []],
        "CapAdd": list((inputs.get("capabilities") or {}).get("adds") or []),
        "CapDrop": list((inputs.get("capabilities") or {}).get("drops") or []),
        "Init": False,
    }  # fmt: skip
    for key, api in (("ipcMode", "IpcMode"), ("pidMode", "PidMode")):
        if inputs.get(key):
            host[api] = inputs[key]
    if inputs.get("shmSize"):
        host["ShmSize"] = int(inputs["shmSize"]) * 1024 * 1024
    if inputs.get("gpus"):
        gpus = str(inputs["gpus"])
        request: dict[str, Any] = {"Driver": "", "Capabilities": [["gpu"]]}
        if gpus == "all":
            request["Count"] = -1
        else:
            request["DeviceIDs"] = gpus.removeprefix("device=").split(",")
        host["DeviceRequests"] = [request]
    config: dict[str, Any] = {
        "Image": inputs["image"],
        "Env": [str(e) for e in inputs.get("envs") or []],
        "Labels": {lb["label"]: lb["value"] for lb in inputs.get("labels") or []},
        "HostConfig": host,
    }
    if inputs.get("command"):
        config["Cmd"] = [str(c) for c in inputs["command"]]
    if inputs.get("entrypoints"):
        config["Entrypoint"] = [str(c) for c in inputs["entrypoints"]]
    if inputs.get("stopTimeout") is not None:
        config["StopTimeout"] = int(inputs["stopTimeout"])
    hc = inputs.get("healthcheck")
    if hc:
        config["Healthcheck"] = {
            "Test": list(hc["tests"]),
            "Interval": _ns(str(hc.get("interval") or "0s")),
            "Timeout": _ns(str(hc.get("timeout") or "0s")),
            "StartPeriod": _ns(str(hc.get("startPeriod") or "0s")),
            "StartInterval": _ns(str(hc.get("startInterval") or "0s")),
            "Retries": int(hc.get("retries") or 0),
        }
    return config
