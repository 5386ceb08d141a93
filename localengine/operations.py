"""The four operations, as the Pulumi CLI runs them on a stack: `up`, `preview` (`--refresh`
reads first; Pulumi.yaml `options.refresh: always` makes that the default), `refresh` and
`destroy`. Each returns what happened, step by step."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localengine import wire
from localengine.executor import Deployment, EngineError, Progress, Step
from localengine.langhost import ProgramError, Services, default_parallel
from localengine.monitor import EngineMonitor, EngineService
from localengine.program import StackConfigError, project_file, run_program
from localengine.providers.base import Provider, Transport
from localengine.providers.dynamic import PluginContext
from localengine.state import CREATING, PendingOperation, StateError, StateFile
from sparkvllm.remote import run_ssh

OPS = ("same", "create", "update", "replace", "delete")


@dataclass
class Result:
    operation: str
    steps: list[Step]
    refresh_steps: list[Step]
    outputs: dict[str, Any]
    provider_writes: int
    provider_reads: int
    seconds: float
    error: str = ""
    counts: dict[str, int] = field(default_factory=dict)
    cancelled: bool = False  # a ^C or SIGTERM stopped it (the CLI's exit code 8)

    @property
    def changed(self) -> bool:
        """update.go HasChanges: any step but same; in `refresh`, a refresh that changed
        the state."""
        if self.operation == "refresh":
            return any(s.op != "same" for s in self.refresh_steps)
        return any(s.op != "same" for s in self.steps)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "operation": self.operation,
            "steps": [{"urn": s.urn, "op": s.op, "keys": s.keys} for s in self.steps],
            "refresh": [{"urn": s.urn, "op": s.op, "keys": s.keys} for s in self.refresh_steps],
            "counts": self.counts,
            "provider_writes": self.provider_writes,
            "provider_reads": self.provider_reads,
            "seconds": round(self.seconds, 2),
        }
        if self.operation == "up":
            out["outputs"] = wire.redacted(self.outputs)
        if self.error:
            out["error"] = self.error
        return out


def refresh_default(project_dir: Path) -> bool:
    """io.go getRefreshOption: `options.refresh: always` in Pulumi.yaml."""
    options = project_file(project_dir).get("options") or {}
    return str(options.get("refresh", "")).lower() == "always"


class Terminated(BaseException):
    """A second ^C or SIGTERM: stop now, steps in flight are not waited for."""


@contextmanager
def _interruptible(deployment: Deployment) -> Iterator[None]:
    """pulumi pkg/backend/cancellation_scope.go: the first SIGINT or SIGTERM cancels (no
    new step starts; the steps in flight finish and are recorded), the second terminates
    (the provider hosts and the program are stopped, nothing more is waited for). The
    program and the provider hosts run in sessions of their own, and so do the engine's
    own ssh calls (`_engine_ssh`): a terminal's ^C reaches the engine alone, which decides."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(sig: int, _frame: Any) -> None:
        shown = "^C" if sig == signal.SIGINT else "SIGTERM"
        if not deployment.interrupted:
            deployment.interrupted = True
            again = "press ^C again" if sig == signal.SIGINT else "send SIGTERM again"
            note = "" if deployment.preview else (
                " Note that terminating immediately may lead to orphaned resources and other "
                "inconsistencies."
            )  # fmt: skip
            deployment.log(
                f"{shown} received; cancelling: steps in flight finish and are recorded. "
                f"If you would like to terminate immediately, {again}.{note}"
            )
            return
        deployment.terminated = True
        deployment.log(f"{shown} received; terminating")
        raise Terminated()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def interrupted_creates(pending: list[PendingOperation], stack: str) -> str:
    """The refusal of an `up` or `destroy` while creates of an interrupted run are pending:
    each may or may not exist on its node, and only the user can look (the CLI: "`pulumi
    refresh` will need to be run interactively to clear pending CREATE operations"; its
    `up` goes on and may create a second copy; here it stops)."""
    creates = [op.resource for op in pending if op.type == CREATING]
    names = ", ".join(f"{r.name} ({r.type})" for r in creates)
    cmd = f"python -m localengine refresh --stack {stack}"
    return (
        f"{len(creates)} resource(s) were being created when an earlier run was interrupted, "
        f"and may or may not exist: {names}. Fix: look on the node; for each "
        f"that exists, `{cmd} --import-pending-creates URN ID`; then `{cmd} "
        "--clear-pending-creates` for the rest (they are created again by the next `up`); "
        f"URNs: {' '.join(r.urn for r in creates)}"
    )


def interrupted_warning(pending: list[PendingOperation]) -> str:
    """deployment_executor.go printPendingOperationsWarning, for updates and deletes (the
    run goes on; a delete is tried again, an update re-done where the inputs differ)."""
    rest = [op for op in pending if op.type != CREATING]
    if not rest:
        return ""
    listed = "; ".join(f"{op.resource.urn}, interrupted while {op.type}" for op in rest)
    return (
        f"warning: {len(rest)} pending operation(s) from an earlier run: {listed}. These "
        "resources are in an unknown state: `refresh` reads back the ones whose provider "
        "can read and clears these operations"
    )


def _engine_ssh(*args: Any, **kwargs: Any) -> Any:
    """The engine's own ssh calls (the pulumi-command and pulumi-docker models), each in a
    session of its own: a terminal's ^C goes to the engine, not to a call in flight."""
    return run_ssh(*args, own_session=True, **kwargs)


def run(
    operation: str,
    stack: str,
    project_dir: Path,
    *,
    refresh: bool | None = None,
    replace_urns: frozenset[str] = frozenset(),
    transport: Transport = _engine_ssh,
    log: Callable[[str], None] = print,
    provider_factory: Callable[[str, dict[str, Any]], Provider | None] | None = None,
    config: dict[str, Any] | None = None,
    secret_keys: list[str] | None = None,
    parallel: int | None = None,
    import_pending_creates: dict[str, str] | None = None,
    clear_pending_creates: bool = False,
    progress: Progress | None = None,
) -> Result:
    """`config`: the stack's config instead of Pulumi.<stack>.yaml (as if set with
    `pulumi config set`). `parallel`: at most this many steps at once (the CLI's
    --parallel; default its default, four per CPU). `import_pending_creates` (URN -> ID)
    and `clear_pending_creates`: a refresh settles the pending creates of an interrupted
    run (the CLI's `refresh` flags of those names)."""
    started = time.monotonic()

    def refused(error: str) -> Result:
        return Result(operation, [], [], {}, 0, 0, time.monotonic() - started, error=error)

    preview = operation == "preview"
    parallel = parallel or default_parallel()
    shown = wire.SecretFilter()  # every secret the run sees is hidden in what it shows
    unfiltered = log
    log = lambda line: unfiltered(shown(line))  # noqa: E731
    # Undone in reverse at the end, however the run ends: the provider hosts, the engine's
    # services, the stack's lock.
    with contextlib.ExitStack() as held:
        try:
            project = project_file(project_dir)
            state = StateFile(project_dir, stack)
            # Update, Refresh and Destroy hold the stack's lock for the whole run (pulumi
            # diy backend); Preview does not.
            if not preview:
                held.enter_context(state.locked(operation))
            if moved := state.move_from_earlier_location():
                log(moved)
        except (StackConfigError, StateError) as e:
            return refused(str(e))
        # The engine's gRPC services for this run: the program's resource monitor and the
        # engine service (whose address the provider hosts also get).
        monitor, engine = EngineMonitor(), EngineService(log)
        services = Services(monitor, engine)
        held.callback(services.stop)
        try:
            deployment = Deployment(
                state, transport, preview=preview, log=unfiltered, replace_urns=replace_urns,
                provider_factory=provider_factory, parallel=parallel, secrets=shown,
                progress=progress,
                plugins=PluginContext(project_dir, project, services.address),
            )  # fmt: skip
        except (EngineError, StateError) as e:
            return refused(str(e))
        held.callback(deployment.close)
        monitor.deployment = deployment
        engine.cancelled = lambda: bool(deployment.failed())
        earlier, creates = deployment.earlier_pending, deployment.carried
        if operation in ("up", "destroy") and creates:
            return refused(f"nothing was done: {interrupted_creates(creates, stack)}")
        if operation != "refresh" and (warning := interrupted_warning(earlier)):
            log(warning)
        if preview and creates:
            log(f"warning: {interrupted_creates(creates, stack)}")
        do_refresh = refresh if refresh is not None else refresh_default(project_dir)
        error = ""
        with _interruptible(deployment):
            try:
                if operation == "refresh":
                    unmatched = deployment.settle_pending_creates(
                        import_pending_creates or {}, clear_pending_creates
                    )
                    for urn in unmatched:
                        log(f"warning: {urn} did not correspond to a pending create")
                    deployment.refresh()
                    if deployment.carried:
                        log(f"warning: {interrupted_creates(deployment.carried, stack)}")
                elif operation == "destroy":
                    if do_refresh:
                        deployment.refresh()
                    deployment.destroy_all()
                else:
                    if do_refresh:
                        deployment.refresh()
                    try:
                        run_program(
                            project_dir, stack, deployment, services, engine, config,
                            secret_keys, parallel,
                        )  # fmt: skip
                    except BaseException as e:  # the program's or a step's error
                        deployment.halt(str(e))
                        raise
                    finally:
                        deployment.wait_idle()
                    deployment.finish()
            except (Exception, ProgramError) as e:  # the run's error, one line first
                error = deployment.failed() or str(e)
        if deployment.interrupted and not error:
            error = "interrupted: steps in flight finished and are recorded"
        error = deployment.secrets(error)
        counts = {op: sum(1 for s in deployment.steps if s.op == op) for op in OPS}
        return Result(
            operation=operation,
            steps=deployment.steps,
            refresh_steps=deployment.refresh_steps,
            outputs=deployment.stack_outputs,
            provider_writes=deployment.counters.writes,
            provider_reads=deployment.counters.reads,
            seconds=time.monotonic() - started,
            error=error,
            counts=counts,
            cancelled=deployment.interrupted,
        )
