"""The router of a set of models (config `router`): LiteLLM's proxy in a container on the
head, its image obtained there, and a readiness wait (docs/models.md,
docs/decisions/router.md).

Its model list is data, built from the config: each model's served name routed to that
model's own server (its rank 0's cluster-link address and API port), as LiteLLM's
`hosted_vllm/` provider. The list reaches the container as one environment variable that
its entrypoint writes to a file (never spliced into the command); the stack's api_key is
both the router's master key and the key it sends to every server, as secret environment.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

from sparkvllm.config import RouterConfig, StackConfig
from sparkvllm.config.stack import model_nodes, model_ports
from sparkvllm.probes import script
from sparkvllm.specs.commands import CommandSpec, image_obtain
from sparkvllm.specs.containers import ContainerSpec, container_name, labels, with_spec_label
from sparkvllm.specs.ssh import url_host

ROLE = "router"
CONFIG_VARIABLE = "SPARKVLLM_ROUTER_CONFIG"
# LiteLLM reads its config from a file; the entrypoint writes it from CONFIG_VARIABLE.
CONFIG_FILE = "/tmp/sparkvllm-router.json"
# Longest a request may take through the router (LiteLLM's own default is 6000 s).
REQUEST_TIMEOUT_S = 600
READY_BUDGET_S = 300


def router_config(cfg: StackConfig) -> str:
    """LiteLLM's config (JSON, which its YAML loader reads) for the stack's models."""
    keyed = cfg.api_key is not None
    models = []
    for m in cfg.served:
        rank0 = model_nodes(cfg, m)[0]
        api, _ = model_ports(cfg, m)
        models.append(
            {
                "model_name": m.name_for_clients,
                "litellm_params": {
                    "model": f"hosted_vllm/{m.name_for_clients}",
                    "api_base": f"http://{url_host(str(rank0.cluster_link.address))}:{api}/v1",
                    "api_key": "os.environ/VLLM_API_KEY" if keyed else "none",
                },
            }
        )
    config: dict[str, object] = {
        "model_list": models,
        # Per-model health comes from the program's own probes, not LiteLLM's (which make
        # real completions); an option a server does not take is dropped, not an error.
        "litellm_settings": {"drop_params": True, "request_timeout": REQUEST_TIMEOUT_S},
    }
    # LiteLLM refuses to start without a master key unless told that is meant: a stack
    # without api_key runs every server without one too (said by exposure_warnings).
    config["general_settings"] = (
        {"master_key": "os.environ/LITELLM_MASTER_KEY"}
        if keyed
        else {"dangerously_permit_weak_or_unset_master_key": True}
    )
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def router_container(cfg: StackConfig, router: RouterConfig, stack: str) -> ContainerSpec:
    head = cfg.head_node
    start = (
        f'printf "%s" "${CONFIG_VARIABLE}" > {CONFIG_FILE} && exec litellm --config '
        f"{CONFIG_FILE} --host 0.0.0.0 --port {router.port}"
    )
    return with_spec_label(
        ContainerSpec(
            name=container_name(stack, ROLE),
            resource_name="router-container",
            node=head.name,
            role=ROLE,
            entrypoint=("bash", "-c"),
            command=(start,),
            env={CONFIG_VARIABLE: router_config(cfg), "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
            secret_env=("LITELLM_MASTER_KEY", "VLLM_API_KEY") if cfg.api_key else (),
            labels=labels(stack, ROLE, head.name),
            ipc_mode="private",
        )
    )


def router_obtain(cfg: StackConfig, router: RouterConfig) -> CommandSpec:
    """The router's image onto the head, as the vLLM image's obtain step does it."""
    as_image = cfg.model_copy(update={"image": router.image})
    return replace(image_obtain(as_image), name=f"router-image-obtain-{cfg.head}")


def router_ready(cfg: StackConfig, router: RouterConfig, stack: str) -> CommandSpec:
    """Wait until the router lists every served name (probes/router_models.py, run inside
    its container, where its key is)."""
    names = " ".join(shlex.quote(m.name_for_clients) for m in cfg.served)
    create = (
        f"docker exec -i {container_name(stack, ROLE)} python3 - "
        f"http://127.0.0.1:{router.port} {READY_BUDGET_S} {names}"
    )
    return CommandSpec(
        name="router-ready",
        node=cfg.head,
        create=create,
        stdin=script("router_models"),
        timeout_s=READY_BUDGET_S + 60,
    )


def router_endpoint(cfg: StackConfig, router: RouterConfig) -> str:
    host = cfg.endpoint_host or cfg.head_node.ssh.host
    return f"http://{url_host(host)}:{router.port}/v1"
