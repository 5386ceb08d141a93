"""One served model: which weights, how its ranks are split and launched, vLLM's options."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from sparkvllm.config.values import (
    _ENV_NAME,
    _NAME,
    _PLUGIN_NAME,
    HUB_ENDPOINT,
    MAX_CONTEXT_TOKENS,
    MAX_UNIFIED_MEMORY_UTILIZATION,
    SHELL_STARTUP_VARIABLES,
    _Closed,
    _hub_url_problem,
    _json_value_problem,
    _node_path,
    is_secret_name,
)
from sparkvllm.vllm_flags import extra_args_problems


class ModelConfig(_Closed):
    """The model to serve."""

    id: str = Field(
        description="Hugging Face model id, e.g. Qwen/Qwen3.5-122B-A10B-FP8.",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$",
    )
    revision: str = Field(
        "main",
        description="Model revision (a commit hash pins it; a branch name may move).",
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9._/-]{0,127}$",
    )
    served_name: str | None = Field(
        None,
        description="Name clients use in requests (default: the model id).",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$",
    )
    hf_cache: str = Field(
        description="Absolute path of the Hugging Face cache ON THE NODES, e.g. "
        "/home/aurora/.cache/huggingface. Mounted into every container."
    )
    offline: bool = Field(
        False,
        description="Serve from the HF cache only (HF_HUB_OFFLINE=1): no node contacts the "
        "hub; the weights must already be in the head's cache.",
    )
    hub_endpoint: str = Field(
        HUB_ENDPOINT,
        description="The hub the weights are downloaded from (huggingface_hub's "
        "HF_ENDPOINT): the Hugging Face hub, or a mirror of it.",
    )
    distribution: Literal["copy_from_head", "download_on_each_node"] = Field(
        "copy_from_head",
        description="`copy_from_head`: download once on the head, copy to the other nodes "
        "over the cluster link (verified by the sizes of the resolved files). "
        "`download_on_each_node`: every node downloads for itself.",
    )

    @field_validator("hf_cache")
    @classmethod
    def _absolute(cls, v: str) -> str:
        return _node_path(v)

    @field_validator("hub_endpoint")
    @classmethod
    def _hub_endpoint_is_a_url(cls, v: str) -> str:
        problem = _hub_url_problem(v)
        if problem:
            raise ValueError(problem)
        return v.rstrip("/")

    @field_validator("revision")
    @classmethod
    def _revision_stays_in_the_cache(cls, v: str) -> str:
        if ".." in v.split("/") or v.endswith("/"):
            raise ValueError(
                "a revision is a branch, tag or commit hash (no '..' segment or trailing "
                "'/'); fix: e.g. main or a 40-character commit hash"
            )
        return v

    @property
    def name_for_clients(self) -> str:
        return self.served_name or self.id


Launcher = Literal["auto", "ray", "native"]


class ParallelismConfig(_Closed):
    """How the model is split across GPUs: tensor x pipeline must equal the total GPUs."""

    tensor: int = Field(ge=1, description="Tensor-parallel size (--tensor-parallel-size).")
    pipeline: int = Field(1, ge=1, description="Pipeline-parallel size.")
    launcher: Launcher = Field(
        "auto",
        description="How the ranks run across the nodes. `native`: vLLM's own multi-node "
        "launcher, one `vllm serve` container per node (rank 0 on the head serves the API, "
        "the others `--headless`), no Ray; `ray`: a Ray cluster and `vllm serve "
        "--distributed-executor-backend ray` on the head (needs an image with Ray); `auto`: "
        "`ray` when the image holds Ray, else `native` (read on the head with the image's "
        "versions).",
    )


KvCacheDtype = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16"]
Dtype = Literal["auto", "float32", "bfloat16", "float16"]


class VllmConfig(_Closed):
    """`vllm serve` options (the ones a GB10 deployment sets, typed) plus extra arguments."""

    gpu_memory_utilization: float = Field(
        0.8,
        gt=0,
        allow_inf_nan=False,
        description="Fraction of (unified) memory vLLM may take. At most "
        f"{MAX_UNIFIED_MEMORY_UTILIZATION} on GB10: the OS and page cache share that memory.",
    )
    max_model_len: int | None = Field(
        None, ge=16, le=MAX_CONTEXT_TOKENS, description="Context length (--max-model-len)."
    )
    max_num_batched_tokens: int | None = Field(
        None, ge=16, le=MAX_CONTEXT_TOKENS, description="--max-num-batched-tokens."
    )
    dtype: Dtype = Field("auto", description="--dtype (weights/activations).")
    kv_cache_dtype: KvCacheDtype = Field("auto", description="--kv-cache-dtype, e.g. fp8.")
    load_format: str = Field(
        "auto",
        description="--load-format: a model loader's name, e.g. auto, safetensors, "
        "fastsafetensors (loads big models much faster), instanttensor, runai_streamer. "
        "vLLM takes any registered loader's name (plugins add loaders) and checks it at "
        "start.",
        pattern=_PLUGIN_NAME.pattern,
    )
    enable_prefix_caching: bool = Field(False, description="--enable-prefix-caching.")
    reasoning_parser: str | None = Field(
        None, description="--reasoning-parser, e.g. qwen3.", pattern=_PLUGIN_NAME.pattern
    )
    enable_auto_tool_choice: bool = Field(
        False, description="--enable-auto-tool-choice (needs tool_call_parser)."
    )
    tool_call_parser: str | None = Field(
        None, description="--tool-call-parser, e.g. qwen3_coder.", pattern=_PLUGIN_NAME.pattern
    )
    speculative_config: dict[str, Any] | None = Field(
        None,
        description='--speculative-config as an object, e.g. {"method": "mtp", '
        '"num_speculative_tokens": 1}.',
    )
    enable_expert_parallel: bool = Field(False, description="--enable-expert-parallel.")
    language_model_only: bool = Field(False, description="--language-model-only.")
    extra_args: list[str] = Field(
        default_factory=list,
        description="More `vllm serve` arguments, passed as given (one list item per argv "
        "word). Must not repeat a flag a typed field owns.",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Extra environment for the model server, e.g. "
        "{VLLM_FLASHINFER_MOE_BACKEND: latency}. Must not override per-node network variables.",
    )
    nccl_debug: Literal["WARN", "INFO", "TRACE"] | None = Field(
        "INFO",
        description="NCCL_DEBUG level. INFO lets the health check tell NET/IB from NET/Socket.",
    )

    @field_validator("gpu_memory_utilization")
    @classmethod
    def _unified_memory(cls, v: float) -> float:
        if v > MAX_UNIFIED_MEMORY_UTILIZATION:
            raise ValueError(
                f"above {MAX_UNIFIED_MEMORY_UTILIZATION}: on GB10 unified memory the OS and "
                "page cache share the GPU's memory, start-up fails or the host wedges; fix: "
                "use 0.7-0.85"
            )
        return v

    @field_validator("extra_args")
    @classmethod
    def _no_owned_flags(cls, v: list[str]) -> list[str]:
        if len(v) > 128:
            raise ValueError("more than 128 arguments; fix: keep extra_args short")
        problems = extra_args_problems(v)
        if problems:
            i, problem, fix = problems[0]
            raise ValueError(f"item {i} {v[i][:80]!r}: {problem}; fix: {fix}")
        for i, arg in enumerate(v):
            if len(arg) > 4096:
                raise ValueError(f"item {i} is longer than 4096 characters; fix: shorten it")
        return v

    @field_validator("speculative_config")
    @classmethod
    def _speculative_values(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is None:
            return v
        problem = _json_value_problem(v, "speculative_config", depth=0)
        if problem:
            raise ValueError(problem)
        method = v.get("method")
        if method is not None and not (isinstance(method, str) and _PLUGIN_NAME.match(method)):
            raise ValueError(
                f"method {str(method)[:80]!r} is not a method name; fix: e.g. mtp, eagle, ngram"
            )
        return v

    @field_validator("env")
    @classmethod
    def _env_names_and_values(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not _ENV_NAME.match(key):
                raise ValueError(
                    f"{key[:80]!r} is not a variable name (letters, digits, '_', not starting "
                    "with a digit); fix: rename it"
                )
            if key in SHELL_STARTUP_VARIABLES:
                raise ValueError(
                    f"{key} is read by the shell that starts the model server (bash "
                    "expands and runs what it names before the container's own command), "
                    "so its value could run a command; fix: remove it"
                )
            if is_secret_name(key):
                raise ValueError(
                    f"{key} names a secret, which would sit in plain text in the stack "
                    "config, the state and the container's inspect output; fix: remove it "
                    "(the API key is the api_key secret)"
                )
            if len(value) > 4096 or any(ord(c) < 32 and c != "\t" for c in value):
                raise ValueError(
                    f"the value of {key} holds a control character (newline, NUL ...) or "
                    "is longer than 4096 characters; fix: give a one-line value"
                )
        return v

    @model_validator(mode="after")
    def _tool_choice_needs_parser(self) -> VllmConfig:
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise ValueError(
                "enable_auto_tool_choice needs tool_call_parser; fix: set "
                "vllm.tool_call_parser, e.g. qwen3_coder"
            )
        return self


# Ports Ray takes on its own on every node (ray start's defaults): Ray Client on the head,
# the range its worker processes listen in, the dashboard agent, the dashboard's and the


class ModelPortsConfig(_Closed):
    """A model's own ports on its nodes (host network)."""

    api: int = Field(ge=1024, le=65535, description="Its OpenAI-compatible API port.")
    master: int = Field(
        ge=1024,
        le=65535,
        description="Its native launcher's rendezvous port (--master-port) on its first "
        "node's cluster-link address.",
    )


class ServedModel(ModelConfig):
    """One model of the set the stack serves (an entry of `models`): the weights (what
    `model` holds), how its ranks are split and launched (`parallelism`), vLLM's options
    (`vllm`), the nodes its ranks run on and its own ports. Its memory on each of its
    nodes is `vllm.gpu_memory_utilization` (vLLM's limit is per server, not per GPU)."""

    name: str | None = Field(
        None,
        description="Short name of the model's resources and containers (lowercase letters, "
        "digits, inner dashes), e.g. coder. At most one model may go without: that one keeps "
        "the names a single-model stack has, so a stack's model is not replaced when a "
        "second one is added.",
    )
    parallelism: ParallelismConfig = Field(description="Tensor/pipeline parallel sizes.")
    vllm: VllmConfig = Field(default_factory=lambda: VllmConfig(), description="vLLM options.")
    nodes: list[str] | None = Field(
        None,
        min_length=1,
        description="The nodes its ranks run on, rank 0 first (default: every node, the "
        "head first). tensor x pipeline must equal their GPUs.",
    )
    ports: ModelPortsConfig | None = Field(
        None,
        description="Its own API and rendezvous ports (default: the stack's ports.api and "
        "ports.master, which one model at most may use).",
    )

    @field_validator("name")
    @classmethod
    def _name_shape(cls, v: str | None) -> str | None:
        if v is not None and (not _NAME.match(v) or len(v) > 20):
            raise ValueError(
                "model names are 1-20 lowercase letters, digits and inner dashes (they end "
                "up in container names); fix: use a name like coder"
            )
        return v

    @field_validator("nodes")
    @classmethod
    def _each_node_once(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and len(set(v)) != len(v):
            raise ValueError("a node is listed twice; fix: list each node once")
        return v
