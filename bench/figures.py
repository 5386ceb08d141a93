"""Figures a bench run measured: name -> value, unit, how it was measured, the goal."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class Figure:
    value: float
    unit: str
    how: str
    goal: str = ""


@dataclass
class Figures:
    """The figures of one run, in the order measured, and what the run was."""

    figures: dict[str, Figure] = field(default_factory=dict)
    run: dict[str, object] = field(default_factory=dict)

    def add(self, name: str, value: float, unit: str, how: str, goal: str = "") -> None:
        self.figures[name] = Figure(round(value, 3), unit, how, goal)
        print(f"  {name} = {self.figures[name].value} {unit}", flush=True)

    def table(self) -> str:
        rows = [("figure", "value", "unit", "goal")]
        rows += [(n, f"{f.value:g}", f.unit, f.goal) for n, f in self.figures.items()]
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        return "\n".join(
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows
        )

    def write(self, path: Path) -> None:
        data = {"run": self.run, **{n: asdict(f) for n, f in self.figures.items()}}
        path.write_text(json.dumps(data, indent=2) + "\n")


@contextmanager
def stopwatch() -> Iterator[list[float]]:
    """Yields a one-item list that holds the elapsed seconds once the block ends."""
    elapsed = [0.0]
    start = time.monotonic()
    try:
        yield elapsed
    finally:
        elapsed[0] = time.monotonic() - start


def git_commit(root: Path) -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                          capture_output=True, text=True, check=False)  # fmt: skip
    return done.stdout.strip()
