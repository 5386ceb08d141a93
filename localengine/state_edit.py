"""Edits of a stack's state that run no program and call no provider, as the CLI's `pulumi
state delete` and `pulumi stack import` make them. Each holds the stack's lock.

- `state delete URN...` (pkg/cmd/pulumi/state/state_delete.go, pkg/resource/edit/
  operations.go DeleteResource): the resource leaves the state; its object on the node is
  not touched. Refused while other resources depend on it (dependencies, property
  dependencies, parent or provider), unless `--target-dependents` deletes those too.
  For a resource whose delete was interrupted and whose object is already gone.
- `import --file F` (pkg/cmd/pulumi/stack/io.go SaveSnapshot): the stack's state becomes
  the deployment in F, a `stack export` file (ours or the CLI's), checked as
  `localengine/export.py` deployment_resources says; its pending operations are dropped.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from localengine.export import ExportError, deployment_resources
from localengine.state import ResourceState, StateError, StateFile


class EditError(Exception):
    """The edit is refused; the message names what and the fix. Nothing was written."""


def _dependents(resources: list[ResourceState], urns: set[str]) -> list[ResourceState]:
    """Every resource depending on one of `urns`, directly or through others."""
    found: list[ResourceState] = []
    condemned = set(urns)
    grew = True
    while grew:  # until nothing more is found (a state in any order)
        grew = False
        for res in resources:
            if res.urn not in condemned and res.all_dependencies() & condemned:
                condemned.add(res.urn)
                found.append(res)
                grew = True
    return found


def delete_resources(
    state: StateFile, urns: list[str], target_dependents: bool, log: Callable[[str], None]
) -> int:
    """`state delete`: returns how many records left the state."""
    with state.locked("state delete"):
        resources = state.load()
        known = {r.urn for r in resources}
        unknown = [u for u in urns if u not in known]
        if unknown:
            raise EditError(
                f"no resource {unknown[0]!r} in the state of stack {state.stack!r}; fix: "
                "copy the URN from `python -m localengine export` or the state file"
            )
        dependents = _dependents(resources, set(urns))
        if dependents and not target_dependents:
            listed = ", ".join(f"{r.name} ({r.urn})" for r in dependents)
            raise EditError(
                f"{urns[0]} can't be safely deleted because these resources depend on it: "
                f"{listed}; fix: delete those first, or pass --target-dependents"
            )
        doomed = set(urns) | {r.urn for r in dependents}
        kept = [r for r in resources if r.urn not in doomed]
        state.save(kept, state.pending)
        for res in resources:
            if res.urn in doomed:
                log(f"deleted {res.urn} from the state (nothing on its node was touched)")
        return len(resources) - len(kept)


def import_deployment(
    state: StateFile, file: Path, passphrase: str | None, log: Callable[[str], None]
) -> int:
    """`import`: the stack's state becomes the deployment in `file`; returns the count of
    resources. The secrets are sealed again as this stack's state seals them."""
    with state.locked("import"):
        try:
            data = json.loads(file.read_text())
        except (OSError, ValueError) as e:
            raise EditError(f"{file}: cannot be read as a `stack export` file ({e})") from None
        try:
            resources, warnings = deployment_resources(data, passphrase, state.stack, state.project)
        except ExportError as e:
            raise EditError(f"{file}: {e}; nothing was imported") from None
        try:
            state.load()  # an existing state keeps its own way of sealing secrets
        except StateError as e:
            raise EditError(str(e)) from None
        for warning in warnings:
            log(f"warning: {warning}")
        state.save(resources, [])
        return len(resources)
