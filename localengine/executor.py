"""One run of the engine over a stack: refresh, the step for each registration, deletes.

The decisions follow pulumi's step generator (pkg/resource/deploy/step_generator.go; each
rule with its source in docs/engine-rules.md):

- old state is found by URN, else by one of the resource's aliases;
- `ignoreChanges` copies the old input values into the new inputs before Check and Diff
  (not for a replacement, which is checked again on the program's own inputs);
- the provider's diff says update or replace; a changed key listed in `replaceOnChanges`
  replaces; a provider whose config changed is updated in place (no modelled provider's
  DiffConfig asks for a replacement);
- a replacement creates the new resource first and deletes the old one after the program
  finished, unless delete-before-replace (the option when set, else the provider) deletes
  it first, together with the dependents whose diff would then replace them;
- resources in the state that the program did not register are deleted after it finished,
  dependents first; components and providers own nothing on a node;
- in preview nothing is called that changes a node, and a planned output is unknown where
  the provider says so;
- the first failure stops new steps; steps in flight finish and are recorded.

The state is saved after every step (never in preview), and before each create, update and
delete with the step recorded as a pending operation (pkg/backend/snapshot.go), so a run
killed mid-step leaves word of it: the next run lists it. A pending create from an earlier
run is carried until `refresh --import-pending-creates` or `--clear-pending-creates`
settles it (snapshot.go: "these must require user intervention"); the others are dropped
by the next run that writes the state, as the CLI drops them.
"""

from __future__ import annotations

import contextlib
import fnmatch
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from localengine import wire
from localengine.export import ExportError, duration_seconds
from localengine.providers import docker
from localengine.providers.base import (
    STEP_TIMEOUT,
    DiffResult,
    PartialCreate,
    Provider,
    ProviderError,
    ReadResult,
    Transport,
)
from localengine.providers.command import CommandProvider
from localengine.providers.dynamic import DynamicProvider, PluginContext
from localengine.state import (
    CREATING,
    DELETING,
    UPDATING,
    PendingOperation,
    ResourceState,
    StateFile,
)

STACK_TYPE = "pulumi:pulumi:Stack"
PROVIDER_PREFIX = "pulumi:providers:"
DYNAMIC_PREFIX = "pulumi-python:dynamic:"
_PACKAGES = {"command", "docker", "pulumi-python"}


class EngineError(Exception):
    """A step failed; the message names the resource and the cause."""


@dataclass
class Step:
    urn: str
    op: str  # same | create | update | replace | delete (refresh: same | update | delete)
    keys: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def name(self) -> str:
        return self.urn.rsplit("::", 1)[-1]


@dataclass
class Counters:
    """Provider calls: writes change something on a node (create, update, delete)."""

    writes: int = 0
    reads: int = 0


def make_urn(stack: str, project: str, parent: str, typ: str, name: str) -> str:
    """deployment.go generateURN: the parent's qualified type prefixes the type, unless the
    parent is the root stack."""
    qualified = typ
    if parent:
        parent_type = parent.split("::")[2]
        if parent_type != STACK_TYPE:
            qualified = f"{parent_type}${typ}"
    return f"urn:pulumi:{stack}::{project}::{qualified}::{name}"


def _key(res: ResourceState) -> str:
    """Where a record sits in the state: a pending-delete copy beside the live one."""
    return f"{res.urn}#delete#{res.id}" if res.delete else res.urn


def _is_default_provider(urn: str) -> bool:
    return urn.split("::")[2].startswith(PROVIDER_PREFIX) and urn.rsplit("::", 1)[-1].startswith(
        "default"
    )


class Progress:
    """Told when a step starts and ends (by its key): nothing by default; the command
    line's live view (localengine/display.py) shows the steps in flight."""

    def begin(self, key: str, what: str) -> None:
        """A step started: `what` is `create NAME`, `update NAME`, ..."""

    def end(self, key: str) -> None:
        """The step of `key` ended (done or failed)."""


class Deployment:
    def __init__(
        self,
        state: StateFile,
        transport: Transport,
        *,
        preview: bool,
        log: Callable[[str], None] = print,
        replace_urns: frozenset[str] = frozenset(),
        provider_factory: Callable[[str, dict[str, Any]], Provider | None] | None = None,
        plugins: PluginContext | None = None,
        parallel: int = 8,
        secrets: wire.SecretFilter | None = None,
        progress: Progress | None = None,
    ):
        self.state_file = state
        # Who is told of each step in flight (the live view: localengine/display.py).
        self.progress = progress or Progress()
        self.plugins = plugins
        # step_executor.go: `parallel` workers carry out the steps (create, update, delete,
        # and a refresh's reads); Check and Diff run in the step generator, unbounded.
        self.parallel = max(1, parallel)
        self._workers = threading.BoundedSemaphore(self.parallel)
        self._elided = True  # writes elided since the last one (a run writes at least once)
        self._factory = provider_factory
        self.stack = state.stack
        self.project = state.project
        self.transport = transport
        self.preview = preview
        # What the run shows passes the secret filter: every secret it has seen is hidden.
        self.secrets = secrets or wire.SecretFilter()
        self.log: Callable[[str], None] = lambda line: log(self.secrets(line))
        self.replace_urns = replace_urns
        # The state as it stands, in dependency order: what is saved after each step.
        self.current: dict[str, ResourceState] = {_key(r): r for r in state.load()}
        # The earlier run's pending operations; its pending creates are carried over until
        # the user settles them, and this run's own steps in flight are written with them.
        self.earlier_pending = list(state.pending)
        self.carried = [op for op in state.pending if op.type == CREATING]
        self._ops: dict[int, PendingOperation] = {}
        unknown = sorted(replace_urns - {r.urn for r in self.current.values()})
        if unknown:
            raise EngineError(f"--replace {unknown[0]}: no such resource in the stack's state")
        self.registered: set[str] = set()
        self.aliases_of: dict[str, list[str]] = {}
        self.recreating: set[str] = set()  # deleted first as dependents of a replacement
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
        self.terminated = False  # a second ^C: nothing more is waited for

    # --- bookkeeping ----------------------------------------------------------------

    def _save(self) -> None:
        # Never in preview; never after a second ^C: the steps then cut short stay pending
        # (their calls fail as the hosts are stopped, and must not clear their records).
        self._elided = False
        if not self.preview and not self.terminated:
            pending = [*self.carried, *self._ops.values()]
            self.state_file.save(list(self.current.values()), pending)

    @contextlib.contextmanager
    def _slot(self, kind: str, res: ResourceState) -> Iterator[PendingOperation | None]:
        """One of the `parallel` workers (step_executor.go), then `res` written as pending
        `kind` before its provider call (only a step that runs is pending; None in
        preview). The caller ends it in the write that records the result (`done=`); a
        failure ends it with nothing recorded."""
        with self._workers:
            op = None if self.preview else PendingOperation(res, kind)
            if op is not None:
                with self._lock:
                    self._ops[id(op)] = op
                    self._save()
            try:
                yield op
            except BaseException:
                if op is not None:
                    with self._lock:
                        self._ops.pop(id(op), None)
                        self._save()
                raise

    def _put(
        self, res: ResourceState, replacing: str | None = None,
        done: PendingOperation | None = None, condemned: ResourceState | None = None,
        write: bool = True,
    ) -> None:  # fmt: skip
        """Record `res` (in place of the record at `replacing`, e.g. its aliased URN); in
        the same write the pending operation `done` ends and `condemned` (the old copy of
        a create-before-delete replacement) is kept beside it, to be deleted.

        The checkpoint is written only when the record changed (pkg/backend/snapshot.go
        sameSnapshotMutation.mustWrite: a same step whose URN, type, inputs, outputs,
        dependencies, parent, provider and options are all as they were elides its write),
        and not at all with `write=False` (a refresh's reads: refreshSnapshotMutation
        elides them; `refresh` writes once after all of them)."""
        with self._lock:
            unchanged = (
                replacing in (None, _key(res)) and done is None and condemned is None
                and _same_record(self.current.get(_key(res)), res)
            )  # fmt: skip
            if done is not None:
                self._ops.pop(id(done), None)
            if replacing is not None:
                self.current.pop(replacing, None)
            self.current.pop(_key(res), None)
            if condemned is not None:
                doomed = replace(condemned, delete=True)
                self.current[_key(doomed)] = doomed
            self.current[_key(res)] = res
            self._order()
            if write and not unchanged:
                self._save()
            else:
                self._elided = True

    def _order(self) -> None:
        """snapshot.go Snap: registered resources in operation order, then the rest of the
        old state; pending deletes after them. Dependencies precede dependents."""
        recs = self.current
        reg = [k for k, r in recs.items() if r.urn in self.registered and not r.delete]
        rest = [k for k, r in recs.items() if r.urn not in self.registered and not r.delete]
        pending = [k for k, r in recs.items() if r.delete]
        self.current = {k: recs[k] for k in [*reg, *rest, *pending]}

    def _drop(self, key: str, done: PendingOperation | None = None) -> None:
        with self._lock:
            if done is not None:
                self._ops.pop(id(done), None)
            self.current.pop(key, None)
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
        if self.terminated:
            return
        with self._idle:
            self._idle.wait_for(lambda: self._inflight == 0, timeout=timeout)

    def halt(self, reason: str) -> None:
        with self._lock:
            self._failure = self._failure or reason

    def _step(self, step: Step) -> None:
        with self._lock:
            self.steps.append(step)

    # --- providers ------------------------------------------------------------------

    def provider_for(self, res: ResourceState) -> Provider:
        ref = res.provider
        if not ref:
            raise EngineError(f"{res.urn}: no provider")
        with self._lock:  # one instance per provider (one plugin process: registry.go)
            if ref in self._providers:
                return self._providers[ref]
            prov_state = self.current.get(ref.rsplit("::", 1)[0])
            if prov_state is None:
                raise EngineError(f"{res.urn}: its provider {ref} is not in the state")
            instance = self._provider_instance(
                prov_state.type.removeprefix(PROVIDER_PREFIX), prov_state.inputs
            )
            self._providers[ref] = instance
            return instance

    def _provider_instance(self, pkg: str, inputs: dict[str, Any]) -> Provider:
        if self._factory is not None:
            made = self._factory(pkg, inputs)
            if made is not None:  # None: the engine's own provider for this package
                return made
        if pkg == "command":
            return CommandProvider(self.transport)
        if pkg == "docker":
            return docker.DockerProvider(self.transport, inputs)
        if pkg == "pulumi-python":
            if self.plugins is None:
                raise EngineError(
                    "a dynamic provider needs the program's folder (no plugin context)"
                )
            return DynamicProvider(self.plugins)
        raise EngineError(f"the local engine does not model provider package {pkg!r}")

    def _default_provider(self, typ: str, version: str) -> str:
        """default_providers.go: the package's default provider (`default[_x_y_z]`, no
        parent), registered by the engine on first use. Its steps are internal."""
        pkg = "pulumi-python" if typ.startswith(DYNAMIC_PREFIX) else typ.split(":", 1)[0]
        if pkg not in _PACKAGES:
            raise EngineError(
                f"the local engine does not model resources of package {pkg!r} ({typ})"
            )
        name = "default" + (f"_{version.replace('.', '_')}" if version else "")
        urn = make_urn(self.stack, self.project, "", f"{PROVIDER_PREFIX}{pkg}", name)
        with self._lock:
            existing = self.current.get(urn)
            if urn not in self.registered:
                self.registered.add(urn)
                res = existing or ResourceState(
                    urn=urn, type=f"{PROVIDER_PREFIX}{pkg}", custom=True,
                    id=wire.UNKNOWN if self.preview else str(uuid.uuid4()),
                    inputs={"version": version} if version else {},
                )  # fmt: skip
                self._put(replace(res, outputs=dict(res.inputs)))
            res = self.current[urn]
        return f"{urn}::{res.id}"

    # --- refresh --------------------------------------------------------------------

    def refresh(self) -> None:
        """Read every resource back, `parallel` reads at a time (the engine runs a
        refresh's steps in parallel: deployment_executor.go refresh, one RefreshStep per
        resource through the step executor); the results are applied in state order. A
        gone one leaves the state (its dependents stay, with the edges to it pruned). A read
        error does not stop the other reads; the refresh fails at the end (ignoreErrors)."""
        targets = [
            (key, res)
            for key, res in list(self.current.items())
            if res.custom and not res.type.startswith(PROVIDER_PREFIX)
        ]

        def read(res: ResourceState) -> tuple[ReadResult | ProviderError, float]:
            started = time.monotonic()
            with self._workers:
                with self._lock:
                    self.counters.reads += 1
                try:
                    got: ReadResult | ProviderError = self.provider_for(res).read(
                        res.type, res.id, res.inputs, res.outputs
                    )
                except ProviderError as e:
                    got = e
            return got, time.monotonic() - started

        pool = ThreadPoolExecutor(max_workers=self.parallel)
        try:
            results = list(pool.map(lambda kr: read(kr[1]), targets))
        finally:  # terminated: the reads in flight are not waited for
            pool.shutdown(wait=not self.terminated, cancel_futures=True)
        errors = []
        moved = False
        for (key, res), (got, seconds) in zip(targets, results, strict=True):
            if isinstance(got, ProviderError):
                errors.append(f"refresh {res.name}: {got}")
                continue
            if got.id is None:
                self.refresh_steps.append(Step(res.urn, "delete", seconds=seconds))
                self.log(f"  refresh: {res.name} is gone")
                self._drop(key)
                self._prune(res.urn)
                continue
            keys = sorted(
                set(wire.changed_keys(res.outputs, got.outputs))
                | {k for k in wire.changed_keys(res.inputs, got.inputs) if k not in res.outputs}
            )
            self.refresh_steps.append(Step(res.urn, "update" if keys else "same", keys, seconds))
            if keys:
                self.log(f"  refresh: {res.name} changed: {', '.join(keys)}")
            now = replace(res, id=got.id, inputs=got.inputs, outputs=got.outputs)
            moved = moved or now != res
            self._put(now, write=False)
        if moved:  # one write for all the reads (a refresh that changed nothing writes none)
            with self._lock:
                self._save()
        if errors:
            raise EngineError("; ".join(errors))

    def settle_pending_creates(self, imports: dict[str, str], clear: bool) -> list[str]:
        """`refresh --import-pending-creates URN ID` and `--clear-pending-creates` (pulumi
        pkg/cmd/pulumi/operations/refresh.go pendingCreatesToImports, filterMapPendingCreates):
        a pending create the user says exists is recorded with the ID given (its inputs as
        its outputs until the refresh that follows reads it back, where its provider can
        read), one the user says does not exist is forgotten; the rest stay pending.
        Returns the URNs given that matched no pending create."""
        unmatched = set(imports)
        kept = []
        with self._lock:
            for op in self.carried:
                res = op.resource
                if res.urn in imports:
                    unmatched.discard(res.urn)
                    live = self.current.pop(res.urn, None)
                    if live is not None:  # a replacement's create was cut short: the old
                        doomed = replace(live, delete=True)  # one is deleted by the next up
                        self.current[_key(doomed)] = doomed
                    outputs = res.outputs or dict(res.inputs)
                    self.current[_key(res)] = replace(res, id=imports[res.urn], outputs=outputs)
                    self.log(f"  pending create of {res.name}: recorded as {imports[res.urn]}")
                elif clear:
                    self.log(f"  pending create of {res.name}: cleared")
                else:
                    kept.append(op)
            # Anything settled, or earlier updates and deletes to drop (earlier >= kept).
            changed = len(self.earlier_pending) != len(kept)
            self.carried = kept
            if changed:
                self._order()
                self._save()
        return sorted(unmatched)

    def close(self) -> None:
        """Write what the run elided (snapshot.go defaultServiceLoop: elided writes are
        flushed by the next write or at Close; `_elided` starts true, so every run writes
        at least once), then stop the provider hosts this run started (the engine closes
        its plugins)."""
        with self._lock:
            if self._elided:
                self._save()
        with self._lock:
            providers, self._providers = list(self._providers.values()), {}
        for provider in providers:
            close = getattr(provider, "close", None)
            if close is not None:
                close()

    def _prune(self, gone: str) -> None:
        with self._lock:
            for key, res in list(self.current.items()):
                deps = [d for d in res.dependencies if d != gone]
                props = {
                    k: [d for d in v if d != gone] for k, v in res.propertyDependencies.items()
                }
                if deps != res.dependencies or props != res.propertyDependencies:
                    self.current[key] = replace(res, dependencies=deps, propertyDependencies=props)
            self._save()

    # --- registration ---------------------------------------------------------------

    def alias_urns(
        self, parent: str, typ: str, name: str, specs: list[dict[str, Any]]
    ) -> list[str]:
        """URNs the resource may have had (collapseAliasToUrn): each alias spec under its
        parent; and, when the parent itself was found by an alias, the same under the old
        parent URN with a leading parent name swapped for the old one (inheritedChildAlias)."""
        out: list[str] = []

        def add(urn: str) -> None:
            if urn not in out:
                out.append(urn)

        for spec in specs:
            p = "" if spec.get("noParent") else str(spec.get("parentUrn") or parent)
            stack = str(spec.get("stack") or self.stack)
            add(make_urn(stack, self.project, p, str(spec.get("type") or typ),
                         str(spec.get("name") or name)))  # fmt: skip
        parent_name = parent.rsplit("::", 1)[-1] if parent else ""
        for old_parent in self.aliases_of.get(parent, []):
            old_parent_name = old_parent.rsplit("::", 1)[-1]
            for alias_name in [name, *(str(s.get("name") or name) for s in specs)]:
                if parent_name and alias_name.startswith(parent_name):
                    alias_name = old_parent_name + alias_name[len(parent_name) :]
                add(make_urn(self.stack, self.project, old_parent, typ, alias_name))
        return out

    def _claim_old(self, urn: str, aliases: list[str]) -> ResourceState | None:
        """getOldResource: by URN first, then by alias; pending deletes excluded."""
        if urn in self.registered:
            raise EngineError(f"duplicate resource URN {urn}; fix: give each resource its own name")
        self.registered.add(urn)
        if urn in self.current:
            self.aliases_of[urn] = []
            return self.current[urn]
        for a in aliases:
            if a in self.current and a not in self.registered:
                self.aliases_of[urn] = [a]
                return self.current[a]
        self.aliases_of[urn] = []
        return None

    def register_component(self, typ: str, name: str, parent: str, aliases: list[str]) -> str:
        urn = make_urn(self.stack, self.project, parent, typ, name)
        with self._lock:
            old = self._claim_old(urn, aliases)
            was = [old.urn] if old and old.urn != urn else []
            res = ResourceState(
                urn=urn, type=typ, custom=False, parent=parent,
                outputs=old.outputs if old else {}, aliases=was,
            )  # fmt: skip
            self._step(Step(urn, "same" if old else "create"))
            self._put(res, replacing=old.urn if old else None)
        return urn

    def component_outputs(self, urn: str, outputs: dict[str, Any]) -> None:
        with self._lock:
            if urn.split("::")[2] == STACK_TYPE:
                self.stack_outputs = outputs
            res = self.current.get(urn)
            if res is not None and res.outputs != outputs:
                self.current[urn] = replace(res, outputs=outputs)
                self._save()
            elif res is not None:
                self._elided = True

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
        delete_before_replace: bool | None,
        ignore_changes: list[str],
        replace_on_changes: list[str],
        additional_secret_outputs: list[str],
        aliases: list[str],
        custom_timeouts: dict[str, str],
    ) -> tuple[str, str, dict[str, Any]]:
        """Decide and carry out the step for one custom resource; returns (urn, id, outputs).
        `delete_before_replace` None: the option is not set (the provider decides)."""
        urn = make_urn(self.stack, self.project, parent, typ, name)
        for key, text in custom_timeouts.items():  # resmon: time.ParseDuration
            try:
                duration_seconds(str(text))
            except ExportError as e:
                raise EngineError(f"{name}: customTimeouts.{key}: {e}") from None
        self.secrets.add(inputs)
        self._begin(name)
        started = time.monotonic()
        error: BaseException | None = None
        try:
            with self._lock:
                old = self._claim_old(urn, aliases)
            is_provider = typ.startswith(PROVIDER_PREFIX)
            if not is_provider and not provider_ref:
                provider_ref = self._default_provider(typ, version)
            new = ResourceState(
                urn=urn, type=typ, custom=True, parent=parent, provider=provider_ref,
                dependencies=dependencies, propertyDependencies=property_dependencies,
                ignoreChanges=ignore_changes,
                replaceOnChanges=replace_on_changes,
                additionalSecretOutputs=additional_secret_outputs,
                aliases=[old.urn] if old and old.urn != urn else [], customTimeouts=custom_timeouts,
            )  # fmt: skip
            if is_provider:
                return self._provider_step(new, inputs, old, started)
            provider = self.provider_for(new)
            checked = inputs
            if old is not None and ignore_changes:
                checked = _ignore_changes(inputs, old.inputs, ignore_changes, name)
            new.inputs = self._check(provider, new, old.inputs if old else {}, checked)
            op, diff = self._decide(new, old, provider)
            if op == "replace":
                # continueStepsFromDiff: a replacement is checked again without olds, on the
                # program's own inputs (ignoreChanges does not carry over).
                new.inputs = self._check(provider, new, {}, inputs)
            if old is None and urn in self.recreating:
                op = "replace"  # deleted earlier in this run as a dependent of a replacement
            dbr = (
                delete_before_replace
                if delete_before_replace is not None
                else diff.delete_before_replace
            )
            if op != "same":
                self.progress.begin(urn, f"{op} {name}")
            try:
                out = self._execute(op, bool(dbr), new, old, provider)
            finally:
                self.progress.end(urn)
            step = Step(urn, op, diff.changes, time.monotonic() - started)
            self._step(step)
            if op != "same":
                keys = f" [{', '.join(diff.changes)}]" if diff.changes else ""
                self.log(
                    f"{'(preview) ' if self.preview else ''}{op} {name}{keys} ({step.seconds:.1f}s)"
                )
            outputs = _secret_outputs(out.outputs, new.inputs, additional_secret_outputs)
            self.secrets.add(outputs)
            return urn, out.id, outputs
        except BaseException as e:
            error = e
            raise
        finally:
            self._end(error)

    def _check(
        self, provider: Provider, new: ResourceState, olds: dict[str, Any], news: dict[str, Any]
    ) -> dict[str, Any]:
        try:
            return provider.check(new.type, olds, news)
        except ProviderError as e:
            raise EngineError(f"{new.name}: {e}") from None

    def _provider_step(
        self, new: ResourceState, inputs: dict[str, Any], old: ResourceState | None, started: float
    ) -> tuple[str, str, dict[str, Any]]:
        """A provider resource (registry.go): its config is diffed; a change is an update
        of the provider, which owns nothing on a node; the ID is a UUID made at create."""
        new.inputs, new.outputs = inputs, dict(inputs)
        if old is None:
            op, keys = "create", []
            new.id = wire.UNKNOWN if self.preview else str(uuid.uuid4())
        else:
            keys = wire.changed_keys(old.inputs, inputs)
            op, new.id = ("update" if keys else "same"), old.id
        with self._lock:
            stale = self._providers.pop(f"{new.urn}::{new.id}", None)  # the new config
            if stale is not None and hasattr(stale, "close"):
                stale.close()
            self._step(Step(new.urn, op, keys, time.monotonic() - started))
            self._put(new, replacing=old.urn if old else None)
        return new.urn, new.id, new.outputs

    def _decide(
        self, new: ResourceState, old: ResourceState | None, provider: Provider
    ) -> tuple[str, DiffResult]:
        if old is None:
            return "create", DiffResult()
        if new.urn in self.replace_urns or old.urn in self.replace_urns:
            # isTargetedReplace: no provider diff; replace on "id".
            return "replace", DiffResult(changes=["id"], replaces=["id"])
        # providerChanged: a different provider replaces only when its DiffConfig says so;
        # neither pulumi-docker (no ForcesProviderReplace) nor a default provider does.
        try:
            diff = provider.diff(new.type, old.id, old.inputs, old.outputs, new.inputs)
        except ProviderError as e:
            raise EngineError(f"{new.name}: diff: {e}") from None
        forced = [k for k in diff.changes if _matches_any(k, new.replaceOnChanges)]
        diff = replace(diff, replaces=sorted(set(diff.replaces) | set(forced)))
        if diff.replaces:
            return "replace", diff
        if diff.changes or old.initErrors:
            # An earlier create that failed part-way is updated even without a diff.
            return "update", diff
        return "same", diff

    def _execute(
        self, op: str, dbr: bool, new: ResourceState, old: ResourceState | None, provider: Provider
    ) -> ResourceState:
        replacing = old.urn if old is not None and old.urn != new.urn else None
        if op == "same":
            assert old is not None
            res = replace(new, id=old.id, outputs=old.outputs)
            self._put(res, replacing=replacing)
            return res
        if op == "update":
            assert old is not None
            with self._slot(UPDATING, replace(new, id=old.id, outputs=old.outputs)) as pending:
                outputs = self._call("update", new, lambda: provider.update(
                    new.type, new.name, old.id, old.outputs, new.inputs, self.preview))  # fmt: skip
                res = replace(new, id=old.id, outputs=outputs)
                self._put(res, replacing=replacing, done=pending)
            return res
        if op == "replace" and old is not None and dbr:
            for dependent in self._dependents_to_replace(old):
                self._delete(dependent, logical=False)
                self.recreating.add(dependent.urn)
            self._delete(old, logical=False)
            replacing = None
        # CreateStep.Apply: once the create returned (a partial failure too), the old one
        # is condemned, in the same write that records the new one.
        condemned = old if op == "replace" and not dbr and not self.preview else None
        return self._create(new, provider, replacing, condemned)

    def _create(
        self, new: ResourceState, provider: Provider, replacing: str | None,
        condemned: ResourceState | None,
    ) -> ResourceState:  # fmt: skip
        with self._slot(CREATING, new) as pending:
            try:
                id_, outputs = self._call("create", new, lambda: provider.create(
                    new.type, new.name, new.inputs, self.preview))  # fmt: skip
                res = replace(new, id=id_, outputs=outputs, initErrors=[])
            except PartialCreate as partial:
                # A create that failed after the resource came to exist is recorded with
                # its initErrors (the next `up` updates it), then the step fails.
                res = replace(new, id=partial.id, outputs=partial.outputs,
                              initErrors=[str(partial)])  # fmt: skip
                self._put(res, replacing, done=pending, condemned=condemned)
                raise EngineError(f"{new.name}: create failed: {partial}") from None
            # The live record gives way to the new one.
            self._put(res, replacing, done=pending, condemned=condemned)
        return res

    def _call(self, what: str, res: ResourceState, fn: Callable[[], Any]) -> Any:
        if not self.preview:
            with self._lock:
                self.counters.writes += 1
        # The step's customTimeouts go with the call (step.go: the request's `timeout`).
        token = STEP_TIMEOUT.set(duration_seconds(str(res.customTimeouts.get(what) or "")))
        try:
            return fn()
        except PartialCreate:
            raise
        except ProviderError as e:
            raise EngineError(f"{res.name}: {what} failed: {e}") from None
        finally:
            STEP_TIMEOUT.reset(token)

    def _dependents_to_replace(self, old: ResourceState) -> list[ResourceState]:
        """calculateDependentReplacements: a resource is replaced with `old` when its
        provider is being replaced, or when an input whose property dependencies include a
        replaced resource, set to unknown, makes its diff replace. Plain dependsOn edges do
        not cascade. Returned dependents first."""
        condemned = {old.urn}
        found: list[ResourceState] = []
        for res in list(self.current.values()):
            if res.urn in condemned or not res.custom or res.delete or res.urn in self.registered:
                continue
            keys = [k for k, deps in res.propertyDependencies.items() if condemned & set(deps)]
            if res.provider_urn in condemned:
                condemned.add(res.urn)
                found.append(res)
                continue
            if not keys:
                continue
            probe = {**res.inputs, **{k: wire.UNKNOWN for k in keys}}
            try:
                d = self.provider_for(res).diff(res.type, res.id, res.inputs, res.outputs, probe)
            except ProviderError as e:
                raise EngineError(f"{res.name}: diff: {e}") from None
            if d.replaces or any(_matches_any(k, res.replaceOnChanges) for k in d.changes):
                condemned.add(res.urn)
                found.append(res)
        return list(reversed(found))

    def _delete(self, res: ResourceState, logical: bool = True) -> None:
        """DeleteStep.Apply: a provider call for custom resources (none in preview);
        components and providers are only removed from the state."""
        started = time.monotonic()
        if res.custom and not res.type.startswith(PROVIDER_PREFIX) and not self.preview:
            provider = self.provider_for(res)
            self.progress.begin(f"{res.urn}#delete", f"delete {res.name}")
            try:
                with self._slot(DELETING, res) as pending:
                    try:
                        self._call(
                            "delete", res,
                            lambda: provider.delete(res.type, res.id, res.inputs, res.outputs),
                        )  # fmt: skip
                    except EngineError as e:
                        raise EngineError(
                            f"{e}; fix: if it is already gone from the node, forget it with "
                            f"`python -m localengine state delete --stack {self.stack} "
                            f"'{res.urn}'`"
                        ) from None
                    self._drop(_key(res), done=pending)
            finally:
                self.progress.end(f"{res.urn}#delete")
        else:
            self._drop(_key(res))
        internal = _is_default_provider(res.urn)
        if logical and not internal:
            self._step(Step(res.urn, "delete", seconds=time.monotonic() - started))
        if not internal:
            what = "" if logical else " (replaced)"
            self.log(f"{'(preview) ' if self.preview else ''}delete {res.name}{what}")

    # --- after the program ----------------------------------------------------------

    def finish(self) -> None:
        """GenerateDeletes: what the program no longer registers, and the replaced copies
        pending deletion, dependents first (reverse state order)."""
        with self._lock:
            doomed = [r for r in self.current.values() if r.delete or r.urn not in self.registered]
        for res in reversed(doomed):  # dependents first
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
        if not self.current:
            self._save()


def _same_record(old: ResourceState | None, new: ResourceState) -> bool:
    """mustWrite's "nothing changed": every field equal, the dependencies as sets (sorted
    before they are compared)."""
    return old is not None and replace(old, dependencies=sorted(old.dependencies)) == replace(
        new, dependencies=sorted(new.dependencies)
    )


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
    additionalSecretOutputs (step_executor.go)."""
    out = {}
    for k, v in outputs.items():
        secret = (wire.contains_secret(inputs.get(k)) or k in additional) and not wire.is_secret(v)
        out[k] = wire.secret(v) if secret and v != wire.UNKNOWN else v
    return out
