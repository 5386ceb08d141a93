"""What a run shows a person, as the Pulumi CLI's live view shows it
(pkg/backend/display/progress.go): each step's line when it ends, and meanwhile the steps
in flight with their elapsed time. On a terminal (a TTY) the steps in flight are one
block redrawn below the finished lines (rich's Live); elsewhere (a CI log, a pipe) a line
every 10 s names them, so a long step never leaves the log silent. At the end, the CLI's
summary: the outputs laid out for reading (secrets masked), the counts by operation, the
duration. `--json` prints none of this (the result as JSON, unchanged).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import IO, Any

from rich.console import Console
from rich.live import Live
from rich.text import Text

from localengine.executor import Progress

# The CLI's symbols and words per operation (display/progress.go, engine/steps.go).
_SUMMARY = (
    ("create", "+", "created"),
    ("update", "~", "updated"),
    ("replace", "+-", "replaced"),
    ("delete", "-", "deleted"),
)
_PLANNED = {"created": "to create", "updated": "to update", "replaced": "to replace",
            "deleted": "to delete"}  # fmt: skip
# A log that is no terminal hears of the steps in flight this often (the variable is for
# tests, which cannot wait 10 s).
QUIET_EVERY_S = float(os.environ.get("LOCALENGINE_QUIET_EVERY_S") or 10.0)


def elapsed(seconds: float) -> str:
    """`1m23s`, `45s`, as the CLI shows a step's and a run's duration."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s"


class Display(Progress):
    """The finished lines (`log`) and the steps in flight (`begin`/`end`). Thread-safe:
    the executor's workers begin and end steps at once."""

    def __init__(
        self,
        stream: IO[str],
        *,
        tty: bool | None = None,
        every_s: float = QUIET_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self.every_s = every_s
        self.clock = clock
        self._lock = threading.Lock()
        self._inflight: dict[str, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._live: Live | None = None
        self._ticker: threading.Thread | None = None
        self.console = Console(file=stream, force_terminal=self.tty, highlight=False,
                               soft_wrap=True)  # fmt: skip

    # --- the executor's side ---------------------------------------------------------

    def log(self, line: str) -> None:
        """A finished step (or any message): printed above the steps in flight."""
        if self._live is not None:
            self._live.console.print(Text(line))
        else:
            print(line, file=self.stream, flush=True)

    def begin(self, key: str, what: str) -> None:
        with self._lock:
            self._inflight[key] = (what, self.clock())

    def end(self, key: str) -> None:
        with self._lock:
            self._inflight.pop(key, None)

    # --- showing them ----------------------------------------------------------------

    def in_flight(self) -> list[tuple[str, float]]:
        """(what, seconds so far) of each step in flight, the longest first."""
        now = self.clock()
        with self._lock:
            rows = [(what, now - since) for what, since in self._inflight.values()]
        return sorted(rows, key=lambda r: -r[1])

    def _block(self) -> Text:
        text = Text()
        for i, (what, seconds) in enumerate(self.in_flight()):
            text.append("\n" if i else "")
            text.append(f"  ... {what} ", style="bold")
            text.append(f"({elapsed(seconds)})", style="dim")
        return text

    def quiet_line(self) -> str | None:
        """The line a log that is not a terminal gets every 10 s, or None (nothing in
        flight)."""
        rows = self.in_flight()
        if not rows:
            return None
        shown = ", ".join(f"{what} ({elapsed(s)})" for what, s in rows[:6])
        more = f" and {len(rows) - 6} more" if len(rows) > 6 else ""
        return f"  ... in flight: {shown}{more}"

    def __enter__(self) -> Display:
        if self.tty:
            self._live = Live(self._block(), console=self.console, refresh_per_second=2,
                              get_renderable=self._block, transient=True)  # fmt: skip
            self._live.start()
        else:
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()
        return self

    def _tick(self) -> None:
        while not self._stop.wait(self.every_s):
            line = self.quiet_line()
            if line is not None:
                print(line, file=self.stream, flush=True)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._live is not None:
            self._live.stop()
            self._live = None


def summary_lines(
    operation: str, counts: dict[str, int], seconds: float, outputs: dict[str, Any] | None
) -> Iterator[str]:
    """The end of a run as the CLI ends it: `Outputs:` laid out (already redacted), then
    `Resources:` with a line per operation and the unchanged count, then `Duration:`."""
    if outputs:
        yield "Outputs:"
        width = max(len(k) for k in outputs)
        for key in sorted(outputs):
            yield from _laid_out(key, outputs[key], 4, width)
        yield ""
    yield "Resources:"
    said = False
    for op, sign, word in _SUMMARY:
        if counts.get(op):
            label = _PLANNED[word] if operation == "preview" else word
            yield f"    {sign} {counts[op]} {label}"
            said = True
    same = counts.get("same", 0)
    if same or not said:
        yield f"    {same} unchanged"
    yield ""
    yield f"Duration: {elapsed(seconds)}"


def _laid_out(key: str, value: Any, indent: int, width: int) -> Iterator[str]:
    """`key: value`, a mapping or list nested below its key (the CLI's outputs view)."""
    pad = " " * indent
    name = f"{key}{' ' * (width - len(key))}"
    if isinstance(value, dict) and value:
        yield f"{pad}{name}: {{"
        inner = max(len(str(k)) for k in value)
        for k in sorted(value, key=str):
            yield from _laid_out(str(k), value[k], indent + 4, inner)
        yield f"{pad}}}"
    elif isinstance(value, list) and value and any(isinstance(v, dict | list) for v in value):
        yield f"{pad}{name}: ["
        for i, item in enumerate(value):
            yield from _laid_out(f"[{i}]", item, indent + 4, len(f"[{len(value) - 1}]"))
        yield f"{pad}]"
    else:
        shown = value if value == "[secret]" else json.dumps(_whole(value), default=str)
        yield f"{pad}{name}: {shown}"


def _whole(value: Any) -> Any:
    """Numbers as the program gave them: the wire (a protobuf Struct) makes every number a
    float, so 1 arrives as 1.0."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_whole(v) for v in value]
    return value
