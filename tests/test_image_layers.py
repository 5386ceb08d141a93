"""probes/image_layers.py, the filter that leaves out of `docker save`'s archive the layer
files a node already holds, on archives laid out as Docker writes them: the legacy layout
(`<v1 id>/layer.tar`, manifest.json last; Docker before 25) and the OCI one
(`blobs/sha256/<diff id>`). The real `docker load` of such an archive runs on the sim
(tests/test_sim_failfast.py)."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from sparkvllm.probes import image_layers, script

L = [f"sha256:{c * 64}" for c in "abcd"]  # diff IDs of a 4-layer image


def names_in(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return tar.getnames()


def archive(paths: list[str]) -> bytes:
    """A save archive: each layer file holds 1000 bytes, then config and manifest."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        for i, path in enumerate(paths):
            add(path, bytes([i]) * 1000)
        add("config.json", b"{}")
        add("manifest.json", json.dumps([{"Config": "config.json", "Layers": paths}]).encode())
    return out.getvalue()


LEGACY = [f"{c * 64}/layer.tar" for c in "1234"]


@pytest.mark.parametrize(
    ("target", "held"),
    [
        ([], [False] * 4),
        ([L[:2]], [True, True, False, False]),  # an earlier version: same base, 2 layers
        ([L], [True] * 4),
        ([[L[0], "sha256:" + "e" * 64, L[2]]], [True, False, False, False]),  # other chain
        ([L[1:]], [False] * 4),  # the same layers on another base are other chains
    ],
)
def test_a_layer_is_held_only_with_the_layers_below_it(
    target: list[list[str]], held: list[bool]
) -> None:
    assert image_layers.held(L, target) == held


def test_the_thin_archive_keeps_everything_but_the_held_layer_files() -> None:
    skip = image_layers.skipped_paths(LEGACY, L, [L[:3]])
    out = io.BytesIO()
    kept, left = image_layers.thin(io.BytesIO(archive(LEGACY)), out, skip)
    names = names_in(out.getvalue())
    assert names == [LEGACY[3], "config.json", "manifest.json"]
    assert left == 3000 and kept == 1000 + 2 + len(json.dumps([{"Config": "config.json",
                                                                "Layers": LEGACY}]))  # fmt: skip


def test_a_file_used_by_a_layer_the_target_lacks_is_kept() -> None:
    """The same layer file at two places (OCI paths are the diff ID): held at the first,
    not at the second (another chain), so it goes."""
    layers = [L[0], L[1], L[0]]
    paths = [f"blobs/sha256/{d[7:]}" for d in layers]
    assert image_layers.skipped_paths(paths, layers, [L[:2]]) == {f"blobs/sha256/{L[1][7:]}"}


def test_the_script_reads_the_layer_files_then_thins_from_stdin(
    tmp_path: Path, node_python: str
) -> None:
    """As the image sync runs it: `python3 -c SRC paths`, `held`, then `thin` (on this
    test's python and on the oldest a head may have)."""
    src, full = script("image_layers"), archive(LEGACY)

    def run(*args: str, data: bytes = b"") -> bytes:
        done = subprocess.run([node_python, "-c", src, *args], input=data,
                              capture_output=True, check=True)  # fmt: skip
        return done.stdout

    target = tmp_path / "target"
    target.write_text(json.dumps(L[:2]) + "\n" + json.dumps(["sha256:" + "f" * 64]) + "\n")
    paths = run("paths", data=full).decode().strip()
    assert json.loads(paths) == LEGACY
    assert run("held", json.dumps(L), str(target)).strip() == b"2 4"  # held, of all
    thin = run("thin", paths, json.dumps(L), str(target), data=full)
    names = names_in(thin)
    assert names == [*LEGACY[2:], "config.json", "manifest.json"]
    # Several targets (the relay's one stream): only what every one of them holds is
    # left out; here the second holds the first layer only.
    other = tmp_path / "other"
    other.write_text(json.dumps(L[:1]) + "\n")
    thin = run("thin", paths, json.dumps(L), str(target), str(other), data=full)
    assert names_in(thin) == [*LEGACY[1:], "config.json", "manifest.json"]


def test_a_manifest_that_does_not_match_the_image_is_refused() -> None:
    with pytest.raises(ValueError, match="3 layer files for 4 layers"):
        image_layers.skipped_paths(LEGACY[:3], L, [L])


@pytest.mark.parametrize(
    "paths",
    [LEGACY, [f"blobs/sha256/{d[7:]}" for d in L]],
    ids=["legacy", "oci"],
)
def test_with_every_layer_held_no_layer_file_goes(paths: list[str]) -> None:
    """One read, the layer files known by their names (no manifest needed up front)."""
    out = io.BytesIO()
    _, left = image_layers.thin_all(io.BytesIO(archive(paths)), out, L)
    assert names_in(out.getvalue()) == ["config.json", "manifest.json"]
    assert left == 4000


def test_a_layer_file_the_manifest_does_not_name_stops_the_archive() -> None:
    """An OCI blob named like a layer but not a layer of this manifest: the filter stops
    before the archive's end, so the load fails and the whole image is sent instead."""
    paths = [f"blobs/sha256/{d[7:]}" for d in L]
    data = archive([*paths[:3], "other/layer.bin"])  # the manifest names another 4th file
    with pytest.raises(ValueError, match="the manifest names"):
        image_layers.thin_all(io.BytesIO(data), io.BytesIO(), L)
