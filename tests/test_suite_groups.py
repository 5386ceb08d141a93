"""The sim's suites are found by their test ids where xdist's controller groups them
(tests/conftest.py is_sim_suite): that rule must name exactly the tests marked `sim`, or a
sim test would run beside the sim's group on another worker (two stories on one cluster),
or a plain test would wait for the sim's warm-up."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT, is_sim_suite


def collected(*args: str) -> set[str]:
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist",
         "-p", "no:cacheprovider", *args],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return {line for line in run.stdout.splitlines() if "::" in line}


def test_the_sim_group_is_exactly_the_tests_marked_sim() -> None:
    everything = collected()
    marked = collected("-m", "sim")
    assert marked and len(everything) > len(marked)
    assert {i for i in everything if is_sim_suite(i)} == marked
