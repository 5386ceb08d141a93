"""Progress lines with durations (the timings the README reports come from here)."""

from __future__ import annotations

import time


class Timer:
    """Prints one line per step with its duration; keeps the durations for the summary."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self.durations: dict[str, float] = {}

    def step(self, label: str) -> _Step:
        return _Step(self, label)

    def say(self, message: str) -> None:
        if not self.quiet:
            print(message, flush=True)


class _Step:
    def __init__(self, timer: Timer, label: str) -> None:
        self.timer, self.label, self.start = timer, label, 0.0

    def __enter__(self) -> None:
        self.start = time.monotonic()
        self.timer.say(f"sim: {self.label} ...")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        elapsed = time.monotonic() - self.start
        self.timer.durations[self.label] = elapsed
        status = "done" if exc_type is None else "FAILED"
        self.timer.say(f"sim: {self.label}: {status} in {elapsed:.1f}s")
