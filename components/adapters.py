"""Spec -> resource adapters shared by the components: the only place that maps a
CommandSpec to a remote.Command and a ContainerSpec to a docker.Container (each named by
its spec), and the one way to hold a resource back until a check passed (`gated`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import pulumi
import pulumi_command as command
import pulumi_docker as docker

from sparkvllm.specs.commands import CommandSpec
from sparkvllm.specs.containers import ContainerSpec

R = TypeVar("R", bound=pulumi.Resource)


def go_duration(seconds: int) -> str:
    """Docker reads durations back as Go durations ("1m30s"); writing the same form keeps
    refresh from reporting a permanent diff (pulumi-docker healthcheck round-trip)."""
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h}h{m}m{s}s"
    if m:
        return f"{m}m{s}s"
    return f"{s}s"


def gated(check: pulumi.Output[Any], resource: R) -> pulumi.Output[R]:
    """`resource`, resolved only once `check` resolved: depend on it to run after the check
    passed (an apply that raised blocks everything that waits on it)."""
    return check.apply(lambda _: resource)


def remote_command(
    spec: CommandSpec,
    *,
    connection: command.remote.ConnectionArgsDict | command.remote.ConnectionArgs,
    parent: pulumi.Resource,
    secrets: Mapping[str, pulumi.Output[str]],
    depends_on: Sequence[pulumi.Input[pulumi.Resource]] = (),
    triggers: Sequence[pulumi.Input[object]] | None = None,
) -> command.remote.Command:
    """A remote.Command named `spec.name`; a `stdin_secret` is looked up in `secrets`."""
    stdin: pulumi.Input[str] | None = spec.stdin
    if spec.stdin_secret is not None:
        stdin = secrets[spec.stdin_secret]
    timeout = f"{spec.timeout_s}s"
    return command.remote.Command(
        spec.name,
        connection=connection,
        create=spec.shell_command,
        delete=spec.shell_delete,
        stdin=stdin,
        triggers=list(triggers) if triggers is not None else None,
        # stdout may echo what a node said; never a secret (secrets go in via stdin only).
        add_previous_output_in_env=False,
        opts=pulumi.ResourceOptions(
            parent=parent,
            depends_on=list(depends_on),
            custom_timeouts=pulumi.CustomTimeouts(create=timeout, update=timeout),
        ),
    )


def container(
    spec: ContainerSpec,
    *,
    image: pulumi.Input[str],
    provider: docker.Provider,
    parent: pulumi.Resource,
    depends_on: Sequence[pulumi.Input[pulumi.Resource]] = (),
    secret_env: Mapping[str, pulumi.Output[str]] | None = None,
    extra_labels: Mapping[str, pulumi.Input[str]] | None = None,
) -> docker.Container:
    """A docker.Container named `spec.resource_name` on the node's provider.

    Fixed container names mean a replacement must delete first (delete_before_replace).
    """
    env: list[pulumi.Input[str]] = [f"{k}={v}" for k, v in sorted(spec.env.items())]
    for key in spec.secret_env:
        if not secret_env or key not in secret_env:
            raise ValueError(f"container {spec.name}: secret {key} was not supplied")
        value: pulumi.Output[str] = secret_env[key]
        env.append(pulumi.Output.secret(pulumi.Output.concat(key, "=", value)))
    hc = spec.healthcheck
    return docker.Container(
        spec.resource_name,
        name=spec.name,
        image=image,
        command=list(spec.command),
        entrypoints=list(spec.entrypoint) if spec.entrypoint else None,
        envs=env,
        labels=[
            docker.ContainerLabelArgs(label=k, value=v)
            for k, v in sorted({**spec.labels, **(extra_labels or {})}.items())
        ],
        network_mode=spec.network_mode,
        ipc_mode=spec.ipc_mode,
        pid_mode=spec.pid_mode,
        gpus=spec.gpus,
        volumes=[
            docker.ContainerVolumeArgs(
                host_path=m.host_path,
                container_path=m.container_path,
                read_only=m.read_only,
            )
            for m in spec.mounts
        ],
        devices=[
            docker.ContainerDeviceArgs(
                host_path=d.host_path,
                container_path=d.container_path,
                permissions=d.permissions,
            )
            for d in spec.devices
        ]
        or None,
        ulimits=[
            docker.ContainerUlimitArgs(name=u.name, soft=u.soft, hard=u.hard) for u in spec.ulimits
        ]
        or None,
        capabilities=docker.ContainerCapabilitiesArgs(adds=list(spec.cap_add))
        if spec.cap_add
        else None,
        restart=spec.restart,
        max_retry_count=spec.max_retry_count,
        healthcheck=docker.ContainerHealthcheckArgs(
            tests=list(hc.test),
            interval=go_duration(hc.interval_s),
            timeout=go_duration(hc.timeout_s),
            start_period=go_duration(hc.start_period_s),
            retries=hc.retries,
        )
        if hc
        else None,
        stop_timeout=spec.stop_timeout_s,
        must_run=True,
        # Readiness is awaited by our own bounded, progress-logging wait, not the provider's.
        wait=False,
        opts=pulumi.ResourceOptions(
            parent=parent,
            provider=provider,
            depends_on=list(depends_on),
            delete_before_replace=True,
        ),
    )
