"""The local Docker daemon (dockerd) the simulation runs on, and the host tools `up` needs:
installed and running, or a message saying why not. (The local Docker daemon, not the
Pulumi engine that localengine/ stands in for.)"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable

from sim.runner import Runner
from sim.settings import StatePaths

DOCKER = "docker"
# tool on PATH -> Debian package that provides it
HOST_TOOLS = {
    "dockerd": "docker.io",
    "debootstrap": "debootstrap",
    "ssh-keygen": "openssh-client",
    "ssh": "openssh-client",
    "ip": "iproute2",
}
DOCKERD_WAIT_S = 60.0


class DockerdError(RuntimeError):
    """dockerd cannot be installed or started; the message says why."""


def missing_packages(which: Callable[[str], str | None] = shutil.which) -> list[str]:
    """Debian packages to install so every host tool `up` needs is on PATH."""
    return sorted({pkg for tool, pkg in HOST_TOOLS.items() if which(tool) is None})


def install_packages(runner: Runner, paths: StatePaths, packages: list[str]) -> None:
    log = paths.logs_dir / "apt.log"
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    try:
        runner.run(["apt-get", "update"], env=env, log_path=log)
        runner.run(["apt-get", "install", "-y", *packages], env=env, log_path=log)
    except RuntimeError as err:
        raise DockerdError(
            f"could not install {' '.join(packages)} with apt-get (needs root and the "
            f"Debian mirror): {err}"
        ) from err


def dockerd_ready(runner: Runner) -> bool:
    return runner.run(
        [DOCKER, "info", "--format", "{{.ServerVersion}}"], check=False, timeout=30
    ).ok


def ensure_dockerd(runner: Runner, paths: StatePaths, say: Callable[[str], None]) -> None:
    """Install missing host tools, start dockerd in the background if needed, wait for it."""
    packages = missing_packages()
    if packages:
        say(f"sim: installing host packages: {' '.join(packages)}")
        install_packages(runner, paths, packages)
    if dockerd_ready(runner):
        return
    say(f"sim: starting dockerd in the background (log: {paths.dockerd_log})")
    pid = runner.spawn(["dockerd"], log_path=paths.dockerd_log)
    deadline = time.monotonic() + DOCKERD_WAIT_S
    while time.monotonic() < deadline:
        if dockerd_ready(runner):
            return
        time.sleep(1.0)
    tail = _log_tail(paths)
    raise DockerdError(
        f"dockerd (pid {pid}) did not answer `docker info` within {DOCKERD_WAIT_S:.0f}s.\n"
        f"Last lines of {paths.dockerd_log}:\n{tail}\n"
        "Fix the cause above (another dockerd? /var/lib/docker on an unsupported "
        "filesystem?) and run `python -m sim up` again."
    )


def _log_tail(paths: StatePaths, lines: int = 20) -> str:
    if not paths.dockerd_log.exists():
        return "(no log)"
    return "\n".join(paths.dockerd_log.read_text(errors="replace").splitlines()[-lines:])
