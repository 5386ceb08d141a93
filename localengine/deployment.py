"""One run of the engine over a stack: refresh, the step for each registration, deletes.

The decisions follow pulumi's step generator (pkg/resource/deploy/step_generator.go; each
rule with its source in docs/engine-rules.md):

- old state is found by URN, else by one of the resource's aliases;
- `ignoreChanges` copies the old input values into the new inputs before the diff;
- the provider's diff (new inputs against the recorded state) says update or replace; a
  changed key listed in `replaceOnChanges` replaces; a provider whose config changed is
  updated in place (no modelled provider's DiffConfig asks for a replacement);
- a replacement creates the new resource first and deletes the old one after the program
  finished, unless `deleteBeforeReplace` (option or provider) deletes it first, together
  with the dependents whose diff would then replace them;
- resources in the state that the program did not register are deleted after it finished,
  dependents first; components and providers own nothing on a node;
- in preview nothing is called that changes a node, and a planned output is unknown where
  the provider says so;
- the first failure stops new steps; steps in flight finish and are recorded.

The state is saved after every step (never in preview).
"""

from __future__ import annotations

import fnmatch
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from localengine import wire
from localengine.providers import docker
from localengine.providers.base import DiffResult, Provider, ProviderError, Transport
from localengine.providers.command import CommandProvider
from localengine.providers.dynamic import DynamicProvider
from localengine.state import PROJECT, ResourceState, StateFile

STACK_TYPE = "pulumi:pulumi:Stack"
PROVIDER_PREFIX = "pulumi:providers:"
# The package of a type token, and the default provider the engine makes for it.
_PACKAGES = {"command": "command", "docker": "docker", "pulumi-python": "pulumi-python"}


class EngineError(Exception):
    """A step failed; the message names the resource and the cause."""


@dataclass
class Step:
    urn: str
    op: str  # same | create | update | replace | delete | read (refresh)
    keys: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def name(self) -> str:
        return self.urn.rsplit("::", 1)[-1]


@dataclass
class Counters:
    """Provider calls that change something on a node (create, update, delete)."""

    writes: int = 0
    reads: int = 0


def make_urn(stack: str, parent: str, typ: str, name: str) -> str:
    """source_eval.go: the parent's qualified type prefixes the type, unless the parent is
    the root stack."""
    qualified = typ
    if parent:
        parent_type = parent.split("::")[2]
        if parent_type != STACK_TYPE:
            qualified = f"{parent_type}${typ}"
    return f"urn:pulumi:{stack}::{PROJECT}::{qualified}::{name}"


def _qualified_type(urn: str) -> str:
    return urn.split("::")[2]


class Deployment:
    def __init__(
        self,
        state: StateFile,
        transport: Transport,
        *,
        preview: bool,
        log: Callable[[str], None] = print,
        replace_urns: frozenset[str] = frozenset(),
        provider_factory: Callable[[str, dict[str, Any]], Provider] | None = None,
    ):
        self.state_file = state
        self._factory = provider_factory
        self.stack = state.stack
        self.transport = transport
        self.preview = preview
        self.log = log
        self.replace_urns = replace_urns
        self.old: dict[str, ResourceState] = {r.urn: r for r in state.load()}
        # The state as it stands, in dependency order: what is saved after each step.
        self.current: dict[str, ResourceState] = dict(self.old)
        self.registered: set[str] = set()
        self.aliases_of: dict[str, list[str]] = {}
        self.steps: list[Step] = []
        self.refresh_steps: list[Step] = []
        self.counters = Counters()
        self.stack_outputs: dict[str, Any] = {}
        self._lock = threading.RLock()
        self._providers: dict[str, Provider] = {}
        self._failure = ""
        self._inflight = 0
        self._idle = threading.Condition(self._lock)
        self.interrupted = False

    # --- bookkeeping ----------------------------------------------------------------

    def _save(self) -> None:
        if not self.preview:
            self.state_file.save(list(self.current.values()))

    def _put(self, res: ResourceState, before: str | None = None) -> None:
        """Record `res`; a resource newly registered goes after everything registered."""
        with self._lock:
            self.current.pop(res.urn, None)
            self.current[res.urn] = res
            self._order()
            self._save()

    def _order(self) -> None:
        """Registered resources first (in registration order), then the rest of the old
        state, then pending deletes: dependencies always precede dependents."""
        reg = [u for u in self.current if u in self.registered and not self.current[u].delete]
        rest = [u for u in self.current if u not in self.registered and not self.current[u].delete]
        pending = [u for u in self.current if self.current[u].delete]
        self.current = {u: self.current[u] for u in [*reg, *rest, *pending]}

    def _drop(self, urn: str) -> None:
        with self._lock:
            self.current.pop(urn, None)
            self._save()

    def failed(self) -> str:
        return self._failure

    def _begin(self, name: str) -> None:
        with self._lock:
            if self._failure:
                raise EngineError(f"{name}: not started, an earlier step failed: {self._failure}")
            if self.interrupted:
                raise EngineError(f"{name}: not started, the run was interrupted")
            self._inflight += 1

    def _end(self, error: BaseException | None) -> None:
        with self._lock:
            self._inflight -= 1
            if error is not None and not self._failure:
                self._failure = str(error)
            self._idle.notify_all()

    def wait_idle(self, timeout: float = 4 * 3600) -> None:
        with self._idle:
            self._idle.wait_for(lambda: self._inflight == 0, timeout=timeout)

    def halt(self, reason: str) -> None:
        with self._lock:
            self._failure = self._failure or reason

    # --- providers ------------------------------------------------------------------

    def provider_for(self, res: ResourceState) -> Provider:
        if res.type.startswith("pulumi-python:dynamic:"):
            return self._provider_instance("pulumi-python", {})
        ref = res.provider
        if not ref:
            raise EngineError(f"{res.urn}: no provider")
        with self._lock:
            if ref in self._providers:
                return self._providers[ref]
            prov_state = self.current.get(ref.rsplit("::", 1)[0]) or self.old.get(
                ref.rsplit("::", 1)[0]
            )
        if prov_state is None:
            raise EngineError(f"{res.urn}: its provider {ref} is not in the state")
        pkg = prov_state.type.removeprefix(PROVIDER_PREFIX)
        instance = self._provider_instance(pkg, prov_state.inputs)
        with self._lock:
            self._providers[ref] = instance
        return instance

    def _provider_instance(self, pkg: str, inputs: dict[str, Any]) -> Provider:
        if self._factory is not None:
            key = f"factory:{pkg}:{sorted(inputs.items())!r}"
            with self._lock:
                if key not in self._providers:
                    self._providers[key] = self._factory(pkg, inputs)
                return self._providers[key]
        if pkg == "command":
            with self._lock:
                cached = self._providers.get("command")
                if cached is None:
                    cached = self._providers["command"] = CommandProvider(self.transport)
            return cached
        if pkg == "docker":
            return docker.DockerProvider(self.transport, inputs)
        if pkg == "pulumi-python":
            return DynamicProvider()
        raise EngineError(f"the local engine does not model provider package {pkg!r}")

    def _default_provider(self, typ: str, version: str) -> str:
        """The provider reference of the default provider of `typ`'s package (made once)."""
        pkg = typ.split(":", 1)[0]
        if pkg not in _PACKAGES:
            raise EngineError(
                f"the local engine does not model resources of package {pkg!r} ({typ})"
            )
        name = "default" + (f"_{version.replace('.', '_')}" if version else "")
        urn = make_urn(self.stack, "", f"{PROVIDER_PREFIX}{pkg}", name)
        with self._lock:
            existing = self.current.get(urn)
            if urn not in self.registered:
                self.registered.add(urn)
                res = existing or ResourceState(
                    urn=urn,
                    type=f"{PROVIDER_PREFIX}{pkg}",
                    custom=True,
                    id=str(uuid.uuid4()),
                    inputs={"version": version} if version else {},
                )
                res = replace(res, outputs=dict(res.inputs))
                # Default-provider steps are internal: not shown, not counted as changes.
                self._put(res)
            res = self.current[urn]
        return f"{urn}::{res.id}"

    # --- refresh --------------------------------------------------------------------

    def refresh(self) -> None:
        """Read every resource back (provider Read); a gone resource leaves the state."""
        for urn, res in list(self.current.items()):
            if not res.custom or res.type.startswith(PROVIDER_PREFIX) or res.delete:
                continue
            started = time.monotonic()
            provider = self.provider_for(res)
            self.counters.reads += 1
            try:
                got = provider.read(res.type, res.id, res.inputs, res.outputs)
            except ProviderError as e:
                raise EngineError(f"refresh {res.name}: {e}") from None
            seconds = time.monotonic() - started
            if got.id is None:
                self.refresh_steps.append(Step(urn, "delete", seconds=seconds))
                self.log(f"  refresh: {res.name} is gone")
                self._drop(urn)
                self._prune(urn)
                continue
            keys = wire.changed_keys(res.outputs, got.outputs) + [
                k for k in wire.changed_keys(res.inputs, got.inputs) if k not in res.outputs
            ]
            if keys:
                self.refresh_steps.append(Step(urn, "update", sorted(set(keys)), seconds))
                self.log(f"  refresh: {res.name} changed: {', '.join(sorted(set(keys)))}")
            else:
                self.refresh_steps.append(Step(urn, "same", seconds=seconds))
            self._put(replace(res, id=got.id, inputs=got.inputs, outputs=got.outputs))
        with self._lock:
            self.old = dict(self.current)

    def _prune(self, gone: str) -> None:
        """rebuildBaseState: dependents of a resource refresh found gone are kept, with
        their edges to it removed."""
        with self._lock:
            for urn, res in list(self.current.items()):
                deps = [d for d in res.dependencies if d != gone]
                props = {
                    k: [d for d in v if d != gone] for k, v in res.propertyDependencies.items()
                }
                if deps != res.dependencies or props != res.propertyDependencies:
                    self.current[urn] = replace(res, dependencies=deps, propertyDependencies=props)
            self._save()

    # --- registration ---------------------------------------------------------------

    def alias_urns(
        self, parent: str, typ: str, name: str, specs: list[dict[str, Any]]
    ) -> list[str]:
        """URNs the resource may have had (collapseAliasToUrn): each alias spec under its
        parent; and, when the parent itself was found by an alias, the same under each old
        parent URN with a leading parent name swapped for the old one (inheritedChildAlias)."""
        out: list[str] = []

        def add(urn: str) -> None:
            if urn not in out:
                out.append(urn)

        for spec in specs:
            p = "" if spec.get("noParent") else str(spec.get("parentUrn") or parent)
            add(make_urn(str(spec.get("stack") or self.stack), p, str(spec.get("type") or typ),
                         str(spec.get("name") or name)))  # fmt: skip
        parent_name = parent.rsplit("::", 1)[-1] if parent else ""
        for old_parent in self.aliases_of.get(parent, []):
            old_parent_name = old_parent.rsplit("::", 1)[-1]
            for alias_name in [name, *(str(s.get("name") or name) for s in specs)]:
                if parent_name and alias_name.startswith(parent_name):
                    alias_name = old_parent_name + alias_name[len(parent_name) :]
                add(make_urn(self.stack, old_parent, typ, alias_name))
        return out

    def register_component(self, typ: str, name: str, parent: str, aliases: list[str]) -> str:
        urn = make_urn(self.stack, parent, typ, name)
        with self._lock:
            old_urn = self._claim_old(urn, aliases)
            self.aliases_of[urn] = [a for a in aliases if a != urn]
            self.registered.add(urn)
            old = self.current.pop(old_urn, None) if old_urn else None
            res = ResourceState(
                urn=urn, type=typ, custom=False, parent=parent,
                outputs=old.outputs if old else {}, aliases=[a for a in aliases if a != urn],
            )  # fmt: skip
            self.steps.append(Step(urn, "same" if old else "create"))
            self._put(res)
        return urn

    def _claim_old(self, urn: str, aliases: list[str]) -> str | None:
        if urn in self.registered:
            raise EngineError(f"duplicate resource URN {urn}; fix: give each resource its own name")
        if urn in self.current and not self.current[urn].delete:
            return urn
        for a in aliases:
            if a in self.current and a not in self.registered and not self.current[a].delete:
                return a
        return None

    def component_outputs(self, urn: str, outputs: dict[str, Any]) -> None:
        with self._lock:
            if _qualified_type(urn) == STACK_TYPE:
                self.stack_outputs = outputs
            res = self.current.get(urn)
            if res is not None:
                self.current[urn] = replace(res, outputs=outputs)
                self._save()

    def register_custom(
        self,
        *,
        typ: str,
        name: str,
        parent: str,
        inputs: dict[str, Any],
        provider_ref: str,
        version: str,
        dependencies: list[str],
        property_dependencies: dict[str, list[str]],
        delete_before_replace: bool,
        ignore_changes: list[str],
        replace_on_changes: list[str],
        additional_secret_outputs: list[str],
        aliases: list[str],
        custom_timeouts: dict[str, str],
    ) -> tuple[str, str, dict[str, Any]]:
        """Decide and carry out the step for one custom resource; returns (urn, id, outputs)."""
        urn = make_urn(self.stack, parent, typ, name)
        self._begin(name)
        started = time.monotonic()
        error: BaseException | None = None
        try:
            with self._lock:
                old_urn = self._claim_old(urn, aliases)
                self.registered.add(urn)
                self.aliases_of[urn] = [a for a in aliases if a != urn]
                old = self.current.get(old_urn) if old_urn else None
            is_provider = typ.startswith(PROVIDER_PREFIX)
            if (
                not is_provider
                and not typ.startswith("pulumi-python:dynamic:")
                and not provider_ref
            ):
                provider_ref = self._default_provider(typ, version)
            new = ResourceState(
                urn=urn, type=typ, custom=True, parent=parent, provider=provider_ref,
                dependencies=dependencies, propertyDependencies=property_dependencies,
                deleteBeforeReplace=delete_before_replace, ignoreChanges=ignore_changes,
                replaceOnChanges=replace_on_changes,
                additionalSecretOutputs=additional_secret_outputs,
                aliases=[a for a in aliases if a != urn], customTimeouts=custom_timeouts,
            )  # fmt: skip
            if is_provider:
                return self._provider_step(new, inputs, old, started)
            if old is not None and ignore_changes:
                inputs = _ignore_changes(inputs, old.inputs, ignore_changes, name)
            provider = self.provider_for(new)
            try:
                news = provider.check(typ, old.inputs if old else {}, inputs)
            except ProviderError as e:
                raise EngineError(f"{name}: {e}") from None
            new.inputs = news
            op, diff = self._decide(new, old, provider)
            out = self._execute(op, diff, new, old, provider)
            step = Step(urn, op, diff.changes, time.monotonic() - started)
            with self._lock:
                self.steps.append(step)
            if op != "same":
                self.log(f"{'(preview) ' if self.preview else ''}{op} {name}"
                         f"{' [' + ', '.join(diff.changes) + ']' if diff.changes else ''}"
                         f" ({step.seconds:.1f}s)")  # fmt: skip
            outputs = _secret_outputs(out.outputs, news, additional_secret_outputs)
            return urn, out.id, outputs
        except BaseException as e:
            error = e
            raise
        finally:
            self._end(error)

    def _provider_step(
        self, new: ResourceState, inputs: dict[str, Any], old: ResourceState | None, started: float
    ) -> tuple[str, str, dict[str, Any]]:
        """A provider resource: its config is diffed (DiffConfig); a change is an update of
        the provider, which owns nothing on a node."""
        new.inputs = inputs
        new.outputs = dict(inputs)
        if old is None:
            op, keys = "create", []
            new.id = wire.UNKNOWN if self.preview else str(uuid.uuid4())
        else:
            keys = wire.changed_keys(old.inputs, inputs)
            op = "update" if keys else "same"
            new.id = old.id
        with self._lock:
            if old is not None and old.urn != new.urn:
                self.current.pop(old.urn, None)
            self._providers.pop(f"{new.urn}::{new.id}", None)  # configure with the new config
            self.steps.append(Step(new.urn, op, keys, time.monotonic() - started))
            self._put(new)
        return new.urn, new.id, new.outputs

    def _decide(
        self, new: ResourceState, old: ResourceState | None, provider: Provider
    ) -> tuple[str, DiffResult]:
        if old is None:
            return "create", DiffResult()
        if new.urn in self.replace_urns:
            return "replace", DiffResult(changes=["(--replace)"], replaces=["(--replace)"])
        # providerChanged: a different provider replaces only when its DiffConfig says so;
        # neither pulumi-docker (no ForcesProviderReplace) nor the default providers do.
        try:
            diff = provider.diff(new.type, old.id, old.inputs, old.outputs, new.inputs)
        except ProviderError as e:
            raise EngineError(f"{new.name}: diff: {e}") from None
        forced = [k for k in diff.changes if _matches_any(k, new.replaceOnChanges)]
        replaces = sorted(set(diff.replaces) | set(forced))
        diff = replace(diff, replaces=replaces)
        if replaces:
            return "replace", diff
        return ("update" if diff.changes else "same"), diff

    def _execute(
        self, op: str, diff: DiffResult, new: ResourceState, old: ResourceState | None,
        provider: Provider,
    ) -> ResourceState:  # fmt: skip
        if op == "same":
            assert old is not None
            res = replace(new, id=old.id, outputs=old.outputs)
            with self._lock:
                if old.urn != new.urn:
                    self.current.pop(old.urn, None)
                self._put(res)
            return res
        if op == "update":
            assert old is not None
            outputs = self._call("update", new, lambda: provider.update(
                new.type, new.name, old.id, old.outputs, new.inputs, self.preview))  # fmt: skip
            res = replace(new, id=old.id, outputs=outputs)
            with self._lock:
                if old.urn != new.urn:
                    self.current.pop(old.urn, None)
                self._put(res)
            return res
        if op == "replace":
            assert old is not None
            dbr = new.deleteBeforeReplace or diff.delete_before_replace
            if dbr:
                for dependent in self._dependents_to_replace(old):
                    self._delete(dependent)
                self._delete(old)
            else:
                with self._lock:
                    self.current[old.urn] = replace(old, delete=True)
                    self.current = {
                        (old.urn if u == old.urn else u): r for u, r in self.current.items()
                    }
        id_, outputs = self._call("create", new, lambda: provider.create(
            new.type, new.name, new.inputs, self.preview))  # fmt: skip
        res = replace(new, id=id_, outputs=outputs)
        if op == "replace" and old is not None and not self.preview and old.urn == new.urn:
            # The old one, pending delete, stays recorded beside the new one until deleted.
            with self._lock:
                pending = self.current.pop(old.urn, None)
                self.current[new.urn] = res
                if pending is not None and pending.delete:
                    self.current[f"{old.urn}#pending-{old.id}"] = pending
                self._order()
                self._save()
            return res
        self._put(res)
        return res

    def _call(self, what: str, res: ResourceState, fn: Callable[[], Any]) -> Any:
        if not self.preview:
            self.counters.writes += 1
        try:
            return fn()
        except ProviderError as e:
            raise EngineError(f"{res.name}: {what} failed: {e}") from None

    def _dependents_to_replace(self, old: ResourceState) -> list[ResourceState]:
        """step_generator.go calculateDependentReplacements: a dependent whose inputs take a
        value from the replaced resource is asked for a diff with those inputs unknown; if
        that diff replaces, it is deleted first (dependents before their dependencies)."""
        condemned = {old.urn}
        found: list[ResourceState] = []
        for urn, res in list(self.current.items()):
            if urn in condemned or not res.custom or res.delete or urn in self.registered:
                continue
            keys = [k for k, deps in res.propertyDependencies.items() if condemned & set(deps)]
            if not keys and not (condemned & set(res.dependencies)):
                continue
            probe = {**res.inputs, **{k: wire.UNKNOWN for k in keys}}
            try:
                d = self.provider_for(res).diff(res.type, res.id, res.inputs, res.outputs, probe)
            except ProviderError:
                continue
            if d.replaces or any(_matches_any(k, res.replaceOnChanges) for k in d.changes):
                condemned.add(urn)
                found.append(res)
        return list(reversed(found))

    def _delete(self, res: ResourceState, logical: bool = True) -> None:
        started = time.monotonic()
        if res.custom and not res.type.startswith(PROVIDER_PREFIX) and not self.preview:
            provider = self.provider_for(res)
            self._call(
                "delete", res, lambda: provider.delete(res.type, res.id, res.inputs, res.outputs)
            )
        key = next((u for u, r in self.current.items() if r is res), res.urn)
        if logical:
            with self._lock:
                self.steps.append(Step(res.urn, "delete", seconds=time.monotonic() - started))
        self.log(f"{'(preview) ' if self.preview else ''}delete {res.name}"
                 f"{'' if logical else ' (replaced)'}")  # fmt: skip
        self._drop(key)

    # --- after the program ----------------------------------------------------------

    def finish(self) -> None:
        """Delete what the program no longer registers, and replaced resources pending
        deletion: dependents first."""
        with self._lock:
            doomed = [
                (key, r) for key, r in self.current.items()
                if r.delete or (r.urn not in self.registered)
            ]  # fmt: skip
        for _key, res in reversed(doomed):  # dependents first
            if self._failure or self.interrupted:
                break
            self._begin(res.name)
            error: BaseException | None = None
            try:
                # A replaced resource's old copy is not a step of its own (not logical).
                self._delete(res, logical=not res.delete)
            except BaseException as e:
                error = e
                raise
            finally:
                self._end(error)

    def destroy_all(self) -> None:
        """Delete every resource in the state, dependents first."""
        for res in reversed(list(self.current.values())):
            self._begin(res.name)
            error: BaseException | None = None
            try:
                self._delete(res)
            except BaseException as e:
                error = e
                raise
            finally:
                self._end(error)
        if not self.preview and not self.current:
            self.state_file.save([])


def _matches_any(key: str, patterns: list[str]) -> bool:
    """replaceOnChanges paths: `*` matches every key; `a[*]` and `a.b` match key `a`."""
    for p in patterns:
        top = p.split(".", 1)[0].split("[", 1)[0]
        if p == "*" or fnmatch.fnmatchcase(key, top):
            return True
    return False


def _ignore_changes(
    news: dict[str, Any], olds: dict[str, Any], paths: list[str], name: str
) -> dict[str, Any]:
    """step_generator.go processIgnoreChanges: the old value stands in for the new one."""
    out = dict(news)
    for path in paths:
        if "." in path or "[" in path:
            raise EngineError(
                f"{name}: ignoreChanges path {path!r}: the engine models top-level keys"
            )
        if path in olds:
            out[path] = olds[path]
        else:
            out.pop(path, None)
    return out


def _secret_outputs(
    outputs: dict[str, Any], inputs: dict[str, Any], additional: list[str]
) -> dict[str, Any]:
    """Outputs are secret where the input of the same name was, or where listed in
    additionalSecretOutputs (step_executor / plugin.MarshalProperties)."""
    out = {}
    for k, v in outputs.items():
        secret = (wire.contains_secret(inputs.get(k)) or k in additional) and not wire.is_secret(v)
        out[k] = wire.secret(v) if secret and v != wire.UNKNOWN else v
    return out
