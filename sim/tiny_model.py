"""The SIMULATION's tiny model: generated in the vllm-sim image, laid out as a HF hub cache.

Layout (what huggingface_hub itself writes, so `HF_HUB_OFFLINE=1 vllm serve
sparkvllm/tiny-qwen3` resolves it):
    models--sparkvllm--tiny-qwen3/
        blobs/<sha256 of file>
        refs/main                        -> "<revision>"
        snapshots/<revision>/<file>      -> ../../blobs/<sha256>   (relative symlinks)
The revision is a sha1 over the files' names and hashes: same files, same revision.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sim.build import DOCKER, MODEL_GENERATOR, hash_inputs
from sim.runner import Runner
from sim.settings import MODEL_ID, NODE_HF_HUB_DIR, SECOND_MODEL_ID, StatePaths


@dataclass(frozen=True)
class HubModel:
    """A model in HF hub cache layout on the host."""

    model_id: str
    repo_dir: Path  # .../models--sparkvllm--tiny-qwen3
    revision: str

    @property
    def snapshot_dir(self) -> Path:
        return self.repo_dir / "snapshots" / self.revision

    def node_snapshot_path(self) -> str:
        return f"{NODE_HF_HUB_DIR}/{self.repo_dir.name}/snapshots/{self.revision}"

    def record(self) -> dict[str, object]:
        """What `.sim/model.json` records: id, revision and where it is on every node, and
        the repos the nodes hold it under (`NODE_REPOS`)."""
        return {
            "model_id": self.model_id,
            "revision": self.revision,
            "node_repo_dir": f"{NODE_HF_HUB_DIR}/{self.repo_dir.name}",
            "node_snapshot_dir": self.node_snapshot_path(),
            "files": sorted(p.name for p in self.snapshot_dir.iterdir()),
            "repos": list(NODE_REPOS),
        }


# The repos every node's cache holds the tiny model's files under (SECOND_MODEL_ID: a copy).
NODE_REPOS = (MODEL_ID, SECOND_MODEL_ID)


def repo_folder_name(model_id: str) -> str:
    """`org/name` -> `models--org--name` (huggingface_hub's cache folder name)."""
    return "models--" + model_id.replace("/", "--")


def file_hashes(flat_dir: Path) -> dict[str, str]:
    """sha256 of every regular file directly in flat_dir, by file name."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(flat_dir.iterdir())
        if p.is_file()
    }


def revision_of(hashes: dict[str, str]) -> str:
    """A deterministic 40-hex revision for a set of files."""
    listing = "".join(f"{name}\0{digest}\n" for name, digest in sorted(hashes.items()))
    return hashlib.sha1(listing.encode()).hexdigest()


def write_hub_layout(flat_dir: Path, repo_dir: Path) -> str:
    """Lay the files of flat_dir out as a hub cache repo folder; return the revision."""
    hashes = file_hashes(flat_dir)
    revision = revision_of(hashes)
    (repo_dir / "blobs").mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    snapshot = repo_dir / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for name, digest in hashes.items():
        shutil.copyfile(flat_dir / name, repo_dir / "blobs" / digest)
        (snapshot / name).symlink_to(f"../../blobs/{digest}")
    (repo_dir / "refs" / "main").write_text(revision)
    return revision


def read_hub_model(repo_dir: Path, model_id: str = MODEL_ID) -> HubModel | None:
    ref = repo_dir / "refs" / "main"
    if not ref.exists():
        return None
    return HubModel(model_id, repo_dir, ref.read_text().strip())


def host_snapshot(paths: StatePaths, revision: str) -> Path:
    """The cached snapshot folder (on this host) of the tiny model at `revision`."""
    pattern = f"model-*/{repo_folder_name(MODEL_ID)}/snapshots/{revision}"
    found = sorted(paths.cache_dir.glob(pattern))
    if not found:
        raise FileNotFoundError(f"no cached tiny model {revision} under {paths.cache_dir}")
    return found[0]


def ensure_model(runner: Runner, paths: StatePaths, vllm_image: str) -> HubModel:
    """Generate the tiny model once per (generator, image); reuse the cached copy after."""
    key = hash_inputs([("generator", MODEL_GENERATOR.read_bytes()), ("image", vllm_image.encode())])
    repo_dir = paths.cache_dir / f"model-{key}" / repo_folder_name(MODEL_ID)
    cached = read_hub_model(repo_dir)
    if cached is not None:
        return cached
    paths.cache_dir.mkdir(parents=True, exist_ok=True)  # a fresh checkout has no cache yet
    with tempfile.TemporaryDirectory(prefix="model-", dir=paths.cache_dir) as tmp:
        flat, staged = Path(tmp) / "flat", Path(tmp) / repo_dir.name
        flat.mkdir()
        generate_flat_model(runner, paths, vllm_image, flat)
        write_hub_layout(flat, staged)
        repo_dir.parent.mkdir(parents=True, exist_ok=True)
        staged.rename(repo_dir)
    model = read_hub_model(repo_dir)
    assert model is not None
    return model


def generate_flat_model(runner: Runner, paths: StatePaths, vllm_image: str, out: Path) -> None:
    """Run make_tiny_model.py inside the vllm-sim image, without network."""
    gen_dir = MODEL_GENERATOR.parent
    argv = [
        DOCKER, "run", "--rm", "--network", "none",
        "-v", f"{gen_dir}:/gen:ro", "-v", f"{out}:/out",
        vllm_image, "python", f"/gen/{MODEL_GENERATOR.name}", "/out",
    ]  # fmt: skip
    runner.run(argv, log_path=paths.logs_dir / "model.log")


def node_tarball(model: HubModel) -> bytes:
    """A tar (for `docker cp - CONTAINER:/`) that puts the repo folder in a node's hub cache,
    once under each of NODE_REPOS."""
    buffer = io.BytesIO()
    hub = NODE_HF_HUB_DIR.lstrip("/")
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        parts = hub.split("/")
        for depth in range(2, len(parts) + 1):  # root/.cache, ..., root/.cache/huggingface/hub
            info = tarfile.TarInfo("/".join(parts[:depth]))
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for repo in NODE_REPOS:
            tar.add(model.repo_dir, arcname=f"{hub}/{repo_folder_name(repo)}", filter=_as_root)
    return buffer.getvalue()


def _as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info
