"""Probe scripts: stdlib-only Python (plus `ray` for ray_members) that run INSIDE a node's
container (piped to `python3 -` over stdin) or on the workstation, and print one JSON line.

They are data to the specs (`script(name)` returns the source), so the command a node runs
and the file a test imports are the same text.
"""

from importlib import resources


def script(name: str) -> str:
    """Source text of probe `name` (e.g. "server_health")."""
    return resources.files(__package__).joinpath(f"{name}.py").read_text()
