"""Send only the image layers a node lacks: a filter of `docker save`'s archive.

Run on the head, on the host's python3, with the archive on stdin:

    python3 -c SRC held LAYERS_JSON TARGET_FILE
        prints how many of the image's layers the target holds, and how many it has
    docker save REF | python3 -c SRC thin-all LAYERS_JSON > thin.tar
        the archive without any layer file (the target holds them all): one read, the
        layer files known by their names, checked against manifest.json at the end
    docker save REF | python3 -c SRC paths
        prints the archive's layer files in order (manifest.json's "Layers"), as JSON
    docker save REF | python3 -c SRC thin PATHS_JSON LAYERS_JSON TARGET_FILE... > thin.tar
        the archive without the layer files the target already holds (with several
        targets, that every one of them holds: one stream for all, the image relay)

LAYERS_JSON is the image's diff IDs in order (`docker image inspect` .RootFS.Layers);
TARGET_FILE holds one such JSON list per line, for every image on the target (a file,
e.g. bash's `<(...)`: an argument is capped at 128 KB). A layer is held there
when some image on the target has the same layers up to and including it: Docker stores
a layer by its chain (the layers below it), and `docker load` reads a layer's file only
when it lacks that chain (moby image/tarexport/load.go: `lss.Get(ChainID)` first), so an
archive without those files loads to the same image. The config, manifest and every
other file are kept. A summary line goes to stderr; exit 2 on bad arguments.
"""

from __future__ import annotations

# What this probe does (sparkvllm.probes.revision): bump it when that changes, not for
# wording, comments or layout; a step that runs it re-runs then.
# revision: 1
import io
import json
import re
import sys
import tarfile
from collections.abc import Callable
from typing import IO

BUF = 1 << 20  # read and write the stream in 1 MiB blocks (the default is 10 KiB)


def held(layers: list[str], target: list[list[str]]) -> list[bool]:
    """For each layer of `layers`: does the target hold its chain (the same prefix)?"""
    prefixes = {tuple(t[: i + 1]) for t in target for i in range(len(t))}
    return [tuple(layers[: i + 1]) in prefixes for i in range(len(layers))]


def skipped_paths(paths: list[str], layers: list[str], target: list[list[str]]) -> set[str]:
    """Layer files to leave out: held at every place they appear in the image."""
    if len(paths) != len(layers):
        raise ValueError(f"{len(paths)} layer files for {len(layers)} layers")
    have = held(layers, target)  # (lengths checked above: no zip(strict=), python 3.9 runs this)
    needed = {p for i, p in enumerate(paths) if not have[i]}
    return {p for i, p in enumerate(paths) if have[i] and p not in needed}


def layer_paths(archive: IO[bytes]) -> list[str]:
    """The archive's layer files in order, from manifest.json (read to the end)."""
    found: list[str] = []
    with tarfile.open(fileobj=archive, mode="r|", bufsize=BUF) as src:
        for member in src:
            if member.name == "manifest.json":
                data = src.extractfile(member)
                assert data is not None
                found = json.loads(data.read())[0]["Layers"]
    if not found:
        raise ValueError("no manifest.json with layers in the archive")
    return found


def _copy(
    archive: IO[bytes], out: IO[bytes], leave_out: Callable[[tarfile.TarInfo], bool], every: bool
) -> tuple[int, int]:
    """Copy the archive without the files `leave_out` picks; (bytes kept, bytes left out).
    What is left out must be layer files manifest.json names (all of them with `every`);
    otherwise stop with an error before the archive is complete, so that its load fails
    and the whole image follows."""
    left_out: set[str] = set()
    named: list[str] = []
    kept = left = 0
    with (
        tarfile.open(fileobj=archive, mode="r|", bufsize=BUF) as src,
        tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT, bufsize=BUF) as dst,
    ):
        for member in src:
            if member.isfile() and leave_out(member):
                left_out.add(member.name)
                left += member.size
                continue
            data = src.extractfile(member) if member.isfile() else None
            if member.name == "manifest.json" and data is not None:
                raw = data.read()
                named = json.loads(raw)[0]["Layers"]
                data = io.BytesIO(raw)
            kept += member.size
            dst.addfile(member, data)
        if not left_out <= set(named) or (every and left_out != set(named)):
            raise ValueError(f"left out {sorted(left_out)}, the manifest names {named}")
    return kept, left


def thin(archive: IO[bytes], out: IO[bytes], skip: set[str]) -> tuple[int, int]:
    """Copy the archive without the files in `skip` (see _copy)."""
    return _copy(archive, out, lambda m: m.name in skip, every=False)


_LEGACY_LAYER = re.compile(r"[0-9a-f]{64}/layer\.tar")  # Docker < 25: <v1 id>/layer.tar


def thin_all(archive: IO[bytes], out: IO[bytes], layers: list[str]) -> tuple[int, int]:
    """Copy the archive without any layer file, known by its name before manifest.json
    comes: a legacy `<v1 id>/layer.tar`, or an OCI `blobs/sha256/<diff id>` of the image
    (see _copy)."""
    oci = {f"blobs/sha256/{d.split(':', 1)[1]}" for d in layers}
    return _copy(
        archive,
        out,
        lambda m: bool(_LEGACY_LAYER.fullmatch(m.name)) or m.name in oci,
        every=True,
    )


def _target(path: str) -> list[list[str]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv: list[str]) -> int:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    if argv[:1] == ["paths"]:
        print(json.dumps(layer_paths(stdin)))
        return 0
    if len(argv) == 3 and argv[0] == "held":
        layers = json.loads(argv[1])
        print(sum(held(layers, _target(argv[2]))), len(layers))
        return 0
    if len(argv) == 2 and argv[0] == "thin-all":
        kept, left = thin_all(stdin, stdout, json.loads(argv[1]))
        print(f"image layers: sending none ({kept} bytes; {left} left out)", file=sys.stderr)
        return 0
    if len(argv) >= 4 and argv[0] == "thin":
        paths, layers = json.loads(argv[1]), json.loads(argv[2])
        skip = set.intersection(*(skipped_paths(paths, layers, _target(f)) for f in argv[3:]))
        kept, left = thin(stdin, stdout, skip)
        print(
            f"image layers: sending {len(paths) - len(skip)} of {len(paths)} "
            f"({kept} bytes; {left} bytes the target{'s' if len(argv) > 4 else ''} "
            f"{'all hold' if len(argv) > 4 else 'holds'} are left out)",
            file=sys.stderr,
        )
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
