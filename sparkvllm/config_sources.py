"""Where a stack's config comes from, in one place. Each returns a validated StackConfig
(ConfigError names every bad field, its value and the fix):

- `from_runtime()`: inside the program, what the Pulumi engine (or the local engine, which
  stands in for it) passed: `spark-vllm:key -> string`, and which keys are secret;
- `from_cli(stack)`: the Pulumi CLI's `pulumi config --json --show-secrets`;
- `from_stack_file(stack)`: Pulumi.<stack>.yaml itself, where the CLI is absent (secrets
  then come from ssh_private_key_file);
- `for_tools(stack)`: what tools outside the program (the drift check) use: the CLI when it
  is installed, else the stack file.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from sparkvllm.config import (
    PROJECT,
    PROJECT_DIR,
    ConfigError,
    Issue,
    StackConfig,
    load_stack_config,
    parse_pulumi_config,
)


def from_runtime() -> StackConfig:
    from pulumi.runtime import config as runtime_config

    values = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    secret = set(runtime_config.get_config_secret_keys_env())
    secret |= {k for k in values if runtime_config.is_config_secret(k)}
    return load_stack_config(parse_pulumi_config(values, secret))


def from_cli(stack: str, project_dir: Path = PROJECT_DIR) -> StackConfig:
    shown = subprocess.run(
        ["pulumi", "config", "--json", "--show-secrets", "--stack", stack],
        capture_output=True, text=True, check=True, cwd=project_dir,
    )  # fmt: skip
    data = json.loads(shown.stdout)
    values = {k: v["value"] if isinstance(v["value"], str) else json.dumps(v["value"])
              for k, v in data.items() if "value" in v}  # fmt: skip
    secret = [k for k, v in data.items() if v.get("secret")]
    return load_stack_config(parse_pulumi_config(values, secret))


def stack_file_raw(stack: str, project_dir: Path = PROJECT_DIR) -> dict[str, Any]:
    """The `spark-vllm:` keys of Pulumi.<stack>.yaml, namespace stripped (the raw input of
    load_stack_config, for tests and tools that change a value first)."""
    path = project_dir / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        raise ConfigError(
            [
                Issue(
                    path="stack",
                    value=stack,
                    problem=f"there is no {path.name} in {project_dir}",
                    fix="pick a stack that has one (e.g. sim or spark), or create it",
                )
            ]
        )
    data = (yaml.safe_load(path.read_text()) or {}).get("config") or {}
    prefix = f"{PROJECT}:"
    return {k.removeprefix(prefix): v for k, v in data.items() if k.startswith(prefix)}


def from_stack_file(stack: str, project_dir: Path = PROJECT_DIR) -> StackConfig:
    return load_stack_config(stack_file_raw(stack, project_dir))


def for_tools(stack: str, project_dir: Path = PROJECT_DIR) -> StackConfig:
    if shutil.which("pulumi"):
        return from_cli(stack, project_dir)
    return from_stack_file(stack, project_dir)
