"""The bench's figures against their goals, as a picture (PNG) beside its JSON: one bar per
figure that has a numeric goal, its value over the goal, the goal at 1.0, green where met.

    .venv/bin/python -m bench.chart bench/results.json   # writes bench/results.png
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_GOAL = re.compile(r"^(>=|<=|<|>)\s*([0-9]*\.?[0-9]+)")


@dataclass(frozen=True)
class Bar:
    name: str
    value: float
    unit: str
    goal: str
    ratio: float  # value over the goal's number
    met: bool


def bars(results: dict[str, Any]) -> list[Bar]:
    """Each figure whose goal is a comparison with a number (`< 3`, `>= 0.9`, `grows <
    0.3 s per node` is a prose goal and is not drawn)."""
    out = []
    for name, fig in results.items():
        if name == "run" or not isinstance(fig, dict):
            continue
        m = _GOAL.match(str(fig.get("goal", "")).strip())
        if not m or float(m.group(2)) == 0:
            continue
        op, target = m.group(1), float(m.group(2))
        value = float(fig["value"])
        met = {
            ">=": value >= target,
            ">": value > target,
            "<=": value <= target,
            "<": value < target,
        }[op]
        out.append(
            Bar(name, value, str(fig.get("unit", "")), f"{op} {m.group(2)}", value / target, met)
        )
    return out


def chart(results: dict[str, Any], path: Path) -> list[Bar]:
    """Write the PNG at `path`; returns the bars drawn."""
    import matplotlib

    matplotlib.use("Agg")  # no display: a file
    import matplotlib.pyplot as plt

    drawn = bars(results)
    height = 1.2 + 0.42 * max(1, len(drawn))
    fig, ax = plt.subplots(figsize=(10, height), dpi=110)
    names = [b.name for b in drawn][::-1]
    ratios = [b.ratio for b in drawn][::-1]
    colours = ["#2e9d4f" if b.met else "#d1492e" for b in drawn][::-1]
    ax.barh(names, ratios, color=colours)
    ax.axvline(1.0, color="#333333", linewidth=1, linestyle="--")
    for y, b in enumerate(drawn[::-1]):
        ax.text(b.ratio, y, f"  {b.value:g} {b.unit} (goal {b.goal})", va="center", fontsize=8)
    ax.set_xlabel("value / goal (the dashed line is the goal; green: met)")
    run = results.get("run") or {}
    ax.set_title(
        f"bench: each figure against its goal (commit {run.get('commit', '?')}, "
        f"{run.get('nodes', '?')} simulated nodes)",
        fontsize=10,
    )
    ax.set_xlim(0, max([1.0, *ratios]) * 1.45)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return drawn


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].endswith(".json"):
        print("usage: python -m bench.chart RESULTS.json (writes RESULTS.png)", file=sys.stderr)
        return 2
    source = Path(argv[0])
    try:
        results = json.loads(source.read_text())
    except (OSError, json.JSONDecodeError) as e:
        print(f"bench.chart: {source}: {e}; fix: give a results file bench wrote", file=sys.stderr)
        return 2
    target = source.with_suffix(".png")
    drawn = chart(results, target)
    print(
        f"bench.chart: {target} ({len(drawn)} figures against their goals, "
        f"{sum(b.met for b in drawn)} met)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
