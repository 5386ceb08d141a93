"""Ports on the nodes, and the ones Ray takes on its own."""

from __future__ import annotations

from pydantic import Field, model_validator

from sparkvllm.config.values import _Closed

RAY_OWN_PORTS = (
    (10001, 10001, "Ray Client server (head)"),
    (10002, 19999, "Ray's worker port range"),
    (23000, 23999, "Ray Client session servers (head)"),
    (44217, 44217, "Ray autoscaler metrics (head)"),
    (44227, 44227, "Ray dashboard metrics (head)"),
    (52365, 52365, "Ray dashboard agent"),
)


def ray_port_owner(port: int) -> str | None:
    return next((what for lo, hi, what in RAY_OWN_PORTS if lo <= port <= hi), None)


class PortsConfig(_Closed):
    """Ports on the nodes (host network): Ray GCS and dashboard (launcher ray), the
    native launcher's master port, the OpenAI API."""

    ray_gcs: int = Field(6379, ge=1024, le=65535, description="Ray GCS port on the head.")
    ray_dashboard: int = Field(8265, ge=1024, le=65535, description="Ray dashboard port.")
    master: int = Field(
        29501,
        ge=1024,
        le=65535,
        description="The native launcher's rendezvous port on the head's cluster-link "
        "address (--master-port; vLLM's default).",
    )
    api: int = Field(8000, ge=1024, le=65535, description="OpenAI-compatible API port.")

    @model_validator(mode="after")
    def _distinct(self) -> PortsConfig:
        named = {"ray_gcs": self.ray_gcs, "ray_dashboard": self.ray_dashboard,
                 "master": self.master, "api": self.api}  # fmt: skip
        if len(set(named.values())) != len(named):
            given = ", ".join(f"{k}={v}" for k, v in named.items())
            raise ValueError(f"ports must differ, got {given}; fix: give each its own port")
        for name, port in named.items():
            owner = ray_port_owner(port)
            if owner:
                raise ValueError(
                    f"{name}={port} is taken by {owner} on the nodes; fix: pick a port "
                    "outside 10001-19999, 23000-23999, 44217, 44227 and 52365 (defaults: "
                    "ray_gcs 6379, ray_dashboard 8265, master 29501, api 8000)"
                )
        return self
