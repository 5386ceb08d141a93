"""The one endpoint in front of a set of models: LiteLLM's proxy on the head."""

from __future__ import annotations

from pydantic import Field

from sparkvllm.config.image import ImageConfig
from sparkvllm.config.values import _Closed


class RouterImageConfig(ImageConfig):
    """The router's image (LiteLLM's proxy: the `litellm` command of `litellm[proxy]`),
    obtained on the head only."""

    ref: str = Field(
        description="Image reference of LiteLLM's proxy built for the head's arch, e.g. "
        "ghcr.io/berriai/litellm@sha256:... (the sim builds sparkvllm/router-sim from PyPI)."
    )


class RouterConfig(_Closed):
    """One OpenAI endpoint for every model (docs/models.md, docs/decisions/router.md): a
    LiteLLM proxy container on the head routing each request by its `model` to that
    model's server, with the stack's api_key as its key."""

    image: RouterImageConfig = Field(description="The router's image.")
    port: int = Field(
        4000, ge=1024, le=65535, description="The router's port on the head (the `endpoint`)."
    )
