"""The engine's long-lived children (the program, the dynamic provider hosts) die with it,
however it ends: a SIGKILL runs none of its cleanup (no `atexit`, no `ProviderHost.close`).

They run in sessions of their own (a terminal's ^C reaches the engine alone:
operations.py `_interruptible`), so nothing sent to the engine's process group reaches
them, and before this they outlived a killed engine forever: a provider host waits on an
Event (pulumi `sdk/python/lib/pulumi/dynamic/__main__.py` main). The CLI's Go plugins end
by themselves when the engine stops answering (`sdk/go/common/util/rpcutil/health.go`
Healthcheck); the Python host has no such check. Here the kernel ends them, by these rules:

- PR_SET_PDEATHSIG (prctl(2)): the child gets the signal when its PARENT THREAD ends, not
  the process (and one whose thread ended before it was armed passes to a sibling thread,
  unsignalled). So every child is forked by one thread that lives as long as the engine
  (`_Spawner`), never by the thread that asks: provider hosts are started from gRPC
  handler threads and refresh pool workers, which end while the engine lives on.
- The signal is armed in the child between fork and exec by util-linux `setpriv
  --pdeathsig KILL` (setpriv(1), util-linux 2.33 or later), not by a `preexec_fn` (not
  safe in a process with threads: Python's subprocess documentation). It survives execve
  (except into set-user-ID or set-group-ID programs) and is cleared in the child of a fork
  (prctl(2)).
- An engine that died before the signal was armed sends none (the child was reparented
  first): the child compares its parent with the engine's pid once armed, and ends as the
  signal would have ended it (`_ARM`).
- A child's own children are not armed, and the provider host's script runs python as a
  child of /bin/sh (the CLI's `pulumi-resource-pulumi-python`, vendored verbatim; dash
  forks for its last command, and runs a trap only after that command ends). So each
  child gets a watch in its process group, armed the same way against the child, that
  kills the whole group when the child ends (`_WATCH`; the CLI stops a plugin by its
  process group too: `cmdutil.KillChildren`). A process that leaves the group (a session
  of its own) is not covered.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from queue import SimpleQueue
from typing import Any

# `/bin/sh -c _ARM localengine-child ENGINE SETPRIV WATCH ARGV...`, run by `setpriv
# --pdeathsig KILL` in the child. dash reads $PPID at startup, after setpriv's prctl: a
# parent that is not the engine means the engine died before the signal was armed. The
# watch is started in the background (same process group, its stdio away from the
# child's pipes), then the child becomes ARGV (same pid: the watch's parent).
_ARM = """\
engine=$1 setpriv=$2 watch=$3; shift 3
[ "$PPID" = "$engine" ] || kill -KILL $$
"$setpriv" --pdeathsig URG -- /bin/sh -c "$watch" localengine-watch $$ \
  </dev/null >/dev/null 2>&1 &
exec "$@"
"""
# `/bin/sh -c _WATCH localengine-watch CHILD`, run by `setpriv --pdeathsig URG`. It acts
# only in the group CHILD leads (a child started in a session of its own), never in a group
# it shares with anything else. URG is ignored unless trapped: one that comes before the
# trap is lost, and the look at the parent that follows the trap sees that the child has
# already ended. The wait is the `wait` builtin's, which a trapped signal interrupts (POSIX,
# Shell Command Language 2.11: Signals and Error Handling).
_WATCH = """\
trap 'kill -KILL 0' URG
read -r _ _ _ parent group _ </proc/$$/stat
[ "$group" = "$1" ] || exit 0
[ "$parent" = "$1" ] || kill -KILL 0
sleep 2147483647 & wait $!
"""


# What a caller hands the spawner: the wrapped argv, Popen's other arguments, the answer.
_Request = tuple[list[str], dict[str, Any], "Future[subprocess.Popen[Any]]"]


def start(argv: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
    """`subprocess.Popen(argv, start_new_session=True, **popen)`, with the child and its
    process group armed to die with the engine. The pid, the session, the process group,
    the pipes and the exit status are the child's own (the wrappers exec it)."""
    _check_found(argv[0], popen.get("env"))
    return _SPAWNER.popen(wrapped(argv, engine=os.getpid()), popen)


def wrapped(argv: Sequence[str], *, engine: int) -> list[str]:
    """The command line that arms the signal, checks the parent is `engine`, starts the
    watch and becomes `argv`. For a process that leads its own group (`start_new_session`):
    the watch keeps out of any other group."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise FileNotFoundError(
            errno.ENOENT,
            "setpriv not found: the engine starts its children with it so they die with "
            "it; fix: install util-linux (apt-get install util-linux)",
            "setpriv",
        )
    return [
        setpriv, "--pdeathsig", "KILL", "--", "/bin/sh", "-c", _ARM, "localengine-child",
        str(engine), setpriv, _WATCH, *argv,
    ]  # fmt: skip


def _check_found(program: str, env: dict[str, str] | None) -> None:
    """A program that cannot be found fails here, as Popen's exec would have failed (the
    wrapper's exec would only exit 127), looked up on the child's PATH."""
    path = (env if env is not None else os.environ).get("PATH", os.defpath)
    if shutil.which(program, path=path) is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)


class _Spawner:
    """One daemon thread, started on first use, that forks every child: the parent-death
    signal follows the thread that forked, and this one ends only with the process."""

    def __init__(self) -> None:
        self._requests: SimpleQueue[_Request] = SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def popen(self, argv: list[str], popen: dict[str, Any]) -> subprocess.Popen[Any]:
        self._ensure_running()
        future: Future[subprocess.Popen[Any]] = Future()
        self._requests.put((argv, popen, future))
        try:
            return future.result()
        except BaseException:
            # Popen's own error, or the caller was interrupted (a second ^C) while the
            # child was being started: a child nobody holds is stopped.
            future.add_done_callback(_stop_unclaimed)
            raise

    def _ensure_running(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._serve, name="localengine-spawner", daemon=True
                )
                self._thread.start()

    def _serve(self) -> None:
        while True:
            _fork(*self._requests.get())


def _fork(argv: list[str], popen: dict[str, Any], future: Future[subprocess.Popen[Any]]) -> None:
    """One request, in the spawner thread (which keeps no reference to it afterwards)."""
    try:
        future.set_result(subprocess.Popen(argv, start_new_session=True, **popen))
    except Exception as e:  # the caller's to handle, in its own thread
        future.set_exception(e)


def _stop_unclaimed(future: Future[subprocess.Popen[Any]]) -> None:
    if future.exception() is not None:
        return
    proc = future.result()
    proc.kill()  # the watch then stops the rest of its group
    proc.wait()


_SPAWNER = _Spawner()
