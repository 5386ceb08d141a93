"""Does the image implement the model? A probe run in the image on the head (vLLM is not
imported, no GPU needed) reads the model's architectures from its config.json and looks
each up in the image's vLLM registry and model files; an image that lacks the model's code
would otherwise be found out only after a long model load."""

from __future__ import annotations

import json
import shlex
from typing import Any

from sparkvllm.config import StackConfig
from sparkvllm.probes import script
from sparkvllm.specs.commands import CommandSpec
from sparkvllm.specs.environment import HF_HOME
from sparkvllm.specs.output import last_json
from sparkvllm.specs.scope import scoped

# Architectures whose first supporting vLLM release we know (for the error message).
SUPPORTED_SINCE = {
    "Qwen3_5MoeForConditionalGeneration": "0.17.0",
    "Qwen3_5ForConditionalGeneration": "0.17.0",
}


def model_support(cfg: StackConfig) -> CommandSpec:
    """Run the vllm_support probe in the image on the head (no GPU, vLLM not imported)."""
    m = cfg.model
    args = [m.id, m.revision, HF_HOME, "1" if m.offline else "0"]
    create = (
        f"docker run --rm -i --entrypoint python3 -v {shlex.quote(m.hf_cache)}:{HF_HOME} "
        f"{'--network none ' if m.offline else ''}{shlex.quote(cfg.image.local_ref)} - "
        + " ".join(shlex.quote(a) for a in args)
    )
    return CommandSpec(
        name=scoped(cfg, f"image-support-{cfg.head}"),
        node=cfg.head,
        create=create,
        stdin=script("vllm_support"),
        timeout_s=600,
    )


class ModelSupportError(Exception):
    """The image cannot serve the model."""


def support_verdict(cfg: StackConfig, stdout: str) -> dict[str, Any]:
    """The support summary (an output) when the image implements the model, else
    ModelSupportError listing every problem."""
    problems = check_model_support(cfg, stdout)
    if problems:
        raise ModelSupportError("model check failed:\n  - " + "\n  - ".join(problems))
    return support_summary(stdout)


def check_model_support(cfg: StackConfig, stdout: str) -> list[str]:
    """Problems that mean this image cannot serve this model."""
    report: dict[str, Any] = last_json(stdout)
    ref, model = cfg.image.ref, f"{cfg.model.id}@{cfg.model.revision}"
    if not report:
        return [f"model check printed nothing usable on {cfg.head}: {stdout[-300:]!r}"]
    if "error" in report:
        return [
            (
                f"cannot read the architectures of {model}: {report['error']}; fix: check "
                "model.id and model.revision, or put the model in the HF cache (model.offline)"
            )
        ]
    if not report.get("vllm_found"):
        return [f"image {ref} contains no vLLM package; fix: use a vLLM image"]
    version = report.get("vllm_version") or "unknown"
    problems = []
    if cfg.parallelism.launcher == "ray" and not report.get("ray_version"):
        problems.append(
            f"parallelism.launcher is ray, but image {ref} (vLLM {version}) holds no Ray "
            "(vLLM's stock images have none since 0.19); fix: set parallelism.launcher to "
            "native (vLLM's own multi-node launcher) or auto, or use an image with Ray"
        )
    archs = report.get("architectures") or []
    if not archs:
        problems.append(f"{model} config.json lists no architectures; fix: check the model")
    for arch in archs:
        found = report.get("support", {}).get(arch, {})
        if not found.get("module"):
            since = SUPPORTED_SINCE.get(arch)
            hint = f" (supported from {since})" if since else ""
            fix = f"use an image with vLLM >= {since}" if since else "use a newer vLLM image"
            problems.append(
                f"image {ref} has vLLM {version}, which does not implement {arch}{hint}; fix: {fix}"
            )
        elif not found.get("module_file"):
            problems.append(
                f"image {ref} (vLLM {version}) registers {arch} in module {found['module']} "
                "but that file is missing from the image; fix: rebuild or use another image"
            )
    return problems


def support_summary(report_stdout: str) -> dict[str, Any]:
    """The support report as a dict for outputs (empty when unparsable)."""
    r = last_json(report_stdout)
    return {
        "vllm_version": r.get("vllm_version", ""),
        "ray_version": r.get("ray_version", ""),
        "architectures": r.get("architectures", []),
        "support": json.loads(json.dumps(r.get("support", {}))),
    }
