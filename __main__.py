"""Pulumi program: validate the stack config, then register the deployment graph.

A bad config raises before any resource is registered, so nothing on a node is touched.
"""

from pathlib import Path

import pulumi
from pulumi.runtime import config as runtime_config

from components.deployment import deploy
from sparkvllm.config import ConfigError, load_stack_config, parse_pulumi_config
from sparkvllm.workstation import prepare_ssh_access


def _pulumi_config() -> tuple[dict[str, str], set[str]]:
    values = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    secret = set(runtime_config.get_config_secret_keys_env())
    secret |= {k for k in values if runtime_config.is_config_secret(k)}
    return values, secret


def main() -> None:
    stack = pulumi.get_stack()
    try:
        values, secret_keys = _pulumi_config()
        cfg = load_stack_config(parse_pulumi_config(values, secret_keys))
        access = prepare_ssh_access(cfg, stack, Path(__file__).resolve().parent)
    except ConfigError as e:
        raise pulumi.RunError(str(e)) from None
    for key, value in deploy(cfg, stack, access).items():
        pulumi.export(key, value)


main()
