"""Probe scripts: stdlib-only Python (plus `ray` for ray_members) that run INSIDE a node's
container (piped to `python3 -` over stdin) or on the workstation, and print one JSON line.

They are data to the specs (`script(name)` returns the source), so the command a node runs
and the file a test imports are the same text.
"""

import re
from importlib import resources


def script(name: str) -> str:
    """Source text of probe `name` (e.g. "server_health")."""
    return resources.files(__package__).joinpath(f"{name}.py").read_text()


def revision(name: str) -> int:
    """What probe `name` does, as its `# revision: N` line says (0 without one): a step
    that runs it re-runs when that changes, not when its wording does (sparkvllm/scripts)."""
    found = re.search(r"^# revision: (\d+)$", script(name), re.MULTILINE)
    return int(found.group(1)) if found else 0
