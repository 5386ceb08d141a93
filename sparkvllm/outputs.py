"""A stack's outputs (the contract in docs/outputs.md), read as any script reads them:
`pulumi stack output --json` where the Pulumi CLI is installed, else the local engine's
state (`python -m localengine output --json`)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from sparkvllm.config import PROJECT_DIR


class OutputsError(Exception):
    """The stack's outputs cannot be read; the message says why."""


def stack_outputs(stack: str, project_dir: Path = PROJECT_DIR) -> dict[str, Any]:
    if shutil.which("pulumi"):
        argv = ["pulumi", "stack", "output", "--json", "--stack", stack]
    else:
        argv = [sys.executable, "-m", "localengine", "output", "--json", "--stack", stack]
    shown = subprocess.run(argv, cwd=project_dir, capture_output=True, text=True)
    if shown.returncode != 0:
        raise OutputsError(f"cannot read the outputs of stack {stack!r}: {shown.stderr.strip()}")
    try:
        outputs = json.loads(shown.stdout)
    except json.JSONDecodeError as e:
        raise OutputsError(f"stack {stack!r}: outputs are not JSON: {e}") from None
    if not isinstance(outputs, dict):
        raise OutputsError(f"stack {stack!r}: outputs are not an object")
    return outputs
