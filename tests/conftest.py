"""Shared fixtures: the spark stack's own config file, a four-node variant, a test key."""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

from sparkvllm.config_sources import stack_file_raw
from sparkvllm.specs.containers import LABEL_PREFIX

ROOT = Path(__file__).resolve().parent.parent

# A program that fails on purpose (bad preflight) leaves Pulumi's internal futures holding
# the exception; asyncio logs each one when it is garbage collected. The tests assert on
# the raised error itself, so this noise is dropped.
logging.getLogger("asyncio").setLevel(logging.CRITICAL)

# Not a real key: the shape the program checks for, nothing more.
TEST_PRIVATE_KEY = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    "TEST-ONLY-NOT-A-KEY-7f3a\n"
    "-----END OPENSSH PRIVATE KEY-----\n"
)
TEST_API_KEY = "test-api-key-5b9e1c"
TEST_HF_TOKEN = "hf_testTokenNotReal4d2a"


def project_yaml(name: str, extra: str = "") -> str:
    """A Pulumi.yaml for a project of a test's own: this virtualenv as its runtime's (where
    the language host and the provider host find pulumi and this project's packages)."""
    return (
        f"name: {name}\nruntime:\n  name: python\n  options:\n    toolchain: pip\n"
        f"    virtualenv: {sys.prefix}\n{extra}"
    )


def write_project(folder: Path, name: str, program: str, config: str = "config: {}\n") -> Path:
    """A project of a test's own in `folder`: Pulumi.yaml, Pulumi.test.yaml, the program."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Pulumi.yaml").write_text(project_yaml(name))
    (folder / "Pulumi.test.yaml").write_text(config)
    (folder / "__main__.py").write_text(program)
    return folder


def stack_file(stack: str) -> dict[str, Any]:
    """The `spark-vllm:` keys of Pulumi.<stack>.yaml, namespace stripped."""
    return stack_file_raw(stack, ROOT)


@pytest.fixture
def spark_raw() -> dict[str, Any]:
    raw = stack_file("spark")
    raw["ssh_private_key"] = TEST_PRIVATE_KEY
    return raw


def four_node_raw(raw: dict[str, Any]) -> dict[str, Any]:
    """Four Sparks: each node its own address AND its own netdev name, so a value copied
    from the head would show."""
    out = copy.deepcopy(raw)
    base = out["nodes"][0]
    out["nodes"] = []
    for i in range(4):
        node = copy.deepcopy(base)
        node["name"] = f"spark-{i + 1}"
        node["ssh"]["host"] = f"10.1.230.{180 + i}"
        node["cluster_link"]["address"] = f"192.168.100.{10 + i}"
        node["cluster_link"]["netdev"] = f"enp1s0f{i % 2}np{i}"
        node["cluster_link"]["roce_hcas"] = [f"rocep1s0f{i % 2}", f"roceP2p1s0f{i % 2}"]
        out["nodes"].append(node)
    out["parallelism"] = {"tensor": 4, "pipeline": 1}
    return out


@pytest.fixture
def spark4_raw(spark_raw: dict[str, Any]) -> dict[str, Any]:
    return four_node_raw(spark_raw)


# The oldest python3 a node's host may run the probes that run there with (probes/stripe.py:
# socket.send_fds came in 3.9), found on PATH or as pyenv installs it.
OLDEST_NODE_PYTHON = "python3.9"


def _oldest_python() -> str | None:
    found = shutil.which(OLDEST_NODE_PYTHON)
    pyenv = sorted(Path.home().glob(f".pyenv/versions/3.9.*/bin/{OLDEST_NODE_PYTHON}"))
    return str(pyenv[-1]) if pyenv else found


@pytest.fixture(params=["this", "oldest"])
def node_python(request: pytest.FixtureRequest) -> str:
    """This test's python, then the oldest a node's host may have (skipped where this
    machine has none: a pyenv shim that names no install does not count)."""
    if request.param == "this":
        return sys.executable
    found = _oldest_python()
    if found is None or subprocess.run([found, "-c", ""], capture_output=True).returncode:
        pytest.skip(f"no {OLDEST_NODE_PYTHON} on this machine")
    return found


@pytest.fixture(autouse=True)
def _state_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    # Workstation files (identity, known_hosts) go to a temp dir, never to ~/.cache; the
    # sim suites use the default one, as `python -m localengine up --stack sim` does.
    if request.node.get_closest_marker("sim") is None:
        monkeypatch.setenv("SPARKVLLM_STATE_DIR", str(tmp_path / "state"))


def hf_snapshot(root: Any, files: dict[str, bytes], index: list[str] | None = None) -> Any:
    """An HF hub cache under `root` for Qwen/Qwen3.5-122B-A10B-FP8@main: blobs + links."""
    repo = root / "hub" / "models--Qwen--Qwen3.5-122B-A10B-FP8"
    blobs, snap = repo / "blobs", repo / "snapshots" / "abc"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc")
    if index is not None:
        files = {
            **files,
            "model.safetensors.index.json": json.dumps(
                {"weight_map": {f"layer.{i}.w": f for i, f in enumerate(index)}}
            ).encode(),
        }
    for i, (name, data) in enumerate(files.items()):
        (blobs / f"b{i}").write_bytes(data)
        (snap / name).symlink_to(blobs / f"b{i}")
    return snap


@dataclass
class SimDeployment:
    """The sim stack deployed once per test session through the local engine, shared by
    the sim suites (cluster, drift, engine, fail-fast)."""

    cfg: Any
    access: Any
    outputs: dict[str, Any]
    seconds: float
    answer: str  # SIM_PROMPT's completion when deployed (TP=2), for later comparisons


PHASES = ROOT / ".sim" / "logs" / "phases.log"


def sim_log(message: str) -> None:
    """A sim test's progress line (shown with its test's output). A `phase:` line, a
    figure of the run, also goes to PHASES, which the run's summary prints."""
    print(message, flush=True)
    if message.startswith("phase:"):
        PHASES.parent.mkdir(parents=True, exist_ok=True)
        with PHASES.open("a") as out:
            out.write(message + "\n")


# --- the simulated cluster, warmed up while the other tests run --------------------------
#
# `./run-tests` runs pytest-xdist: the sim's suites are one unit of work (_SimGroup),
# the largest, so one worker takes them first and runs them in their own
# order (SIM_ORDER) while the other workers share every other test. Without xdist
# (`-p no:xdist`, or `-n 0`), every test that needs no sim runs first and the sim's suites
# after. Either way, as soon as the tests are collected, a process of its own brings the
# sim up (the images' first build, the nodes, the tiny model) and, when a sim test wants
# the shared deployment, deploys it (`python -m sim apply`), so that work overlaps the
# other tests. A process, not a thread: the tests change their process's environment and
# folder. Under xdist one worker (gw0) starts it and records its exit code in a file that
# the worker running the sim's suites waits for.


def _is_sim(item: pytest.Item) -> bool:
    return item.get_closest_marker("sim") is not None


# The sim's suites in the order that costs least: those on the shared deployment first,
# the ones that end it last (the native story switches launchers and destroys; the engine
# suite then checks destroy left nothing). A suite not listed runs after the
# listed ones that share the deployment, before those that end it.
SIM_ORDER = (
    "tests/sim_smoke/test_sim_live.py",
    "tests/test_sim_cluster.py",
    "tests/test_sim_drift.py",
    "tests/test_sim_drift_job.py",
    "tests/test_sim_health.py",
    "tests/test_sim_hub.py",
    "tests/test_sim_jump_host.py",
    "tests/test_sim_link.py",
    "tests/test_sim_failfast.py",
    "tests/test_sim_vllm_parser.py",
    "tests/test_sim_models.py",
    "",  # any other
    "tests/test_sim_native.py",
    "tests/test_sim_engine.py",
)


def _listed(nodeid: str, prefixes: tuple[str, ...]) -> int | None:
    """The place of the first of `prefixes` (empty ones aside) that `nodeid` starts with."""
    return next((i for i, p in enumerate(prefixes) if p and nodeid.startswith(p)), None)


def sim_rank(nodeid: str) -> int:
    """Where a sim test's suite runs among the sim's suites (SIM_ORDER)."""
    listed = _listed(nodeid, SIM_ORDER)
    return SIM_ORDER.index("") if listed is None else listed


# The other tests' longest suites first (each of their tests takes 10-90 s on a busy
# machine): started last, one of them would keep a worker busy after the rest are done.
SLOW_FIRST = (
    "tests/test_hostile_input.py",
    "tests/test_plan_engine.py",
    "tests/test_launcher.py",
    "tests/test_provider_contract.py",
    "tests/test_engine_faults.py",
)


def _fast_rank(item: pytest.Item) -> int:
    listed = _listed(item.nodeid, SLOW_FIRST)
    return len(SLOW_FIRST) if listed is None else listed


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    sims = sorted((i for i in items if _is_sim(i)), key=lambda i: sim_rank(i.nodeid))
    others = sorted((i for i in items if not _is_sim(i)), key=_fast_rank)
    items[:] = others + sims


def is_sim_suite(nodeid: str) -> bool:
    """Whether a test is one of the sim's suites, from its id alone (where xdist's
    controller, which sees no marks, groups them): a module named in SIM_ORDER or named
    tests/test_sim_*.py. tests/test_suite_groups.py checks this agrees with the sim mark."""
    return _listed(nodeid, SIM_ORDER) is not None or nodeid.startswith("tests/test_sim_")


class _SimGroup(LoadScopeScheduling):
    """xdist's load scheduling with the sim's suites as ONE unit of work, so one worker
    runs them all, in their order, while the others share every other test, one test
    per unit. (xdist's own `--dist loadgroup` reads `xdist_group` marks by rewriting the
    test id, which pytest 9 no longer takes.) The sim's unit is the largest, so it is
    handed out first (loadscope's default order: the units with most tests first)."""

    def _split_scope(self, nodeid: str) -> str:
        return "sim" if is_sim_suite(nodeid) else nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling | None:
    """`--dist loadgroup` (./run-tests): the sim's suites as one group (_SimGroup)."""
    return _SimGroup(config, log) if config.getvalue("dist") == "loadgroup" else None


def _xdist(config: pytest.Config) -> tuple[str, str] | None:
    """(this worker's id, the run's id) in an xdist worker; None elsewhere."""
    given = getattr(config, "workerinput", None)
    return None if given is None else (str(given["workerid"]), str(given["testrunuid"]))


def _controller(config: pytest.Config) -> bool:
    """Whether this process hands the tests to xdist's workers (and runs none itself)."""
    return _xdist(config) is None and bool(getattr(config.option, "numprocesses", None))


WARMUP_FILES = ROOT / ".sim" / "logs"


def _run_files(run: str) -> tuple[Path, Path]:
    """The warm-up's process id and, once it ended, its exit code, for run `run`."""
    return WARMUP_FILES / f"warmup-{run}.pid", WARMUP_FILES / f"warmup-{run}.rc"


@dataclass
class _Warmup:
    command: str  # "up" or "apply"
    log: Path
    done: Path  # its exit code, once it ended (how another worker learns it)
    started: float
    process: subprocess.Popen[bytes] | None  # None in a worker that did not start it
    code: int | None = None

    def wait(self) -> None:
        """Until the warm-up ends; a failure raises with the log's tail the first time,
        and again for every later sim test."""
        first = self.code is None
        if self.process is not None:
            self.code = self.process.wait()
        while self.code is None:
            if self.done.exists():
                self.code = int(self.done.read_text().strip() or "1")
            else:
                time.sleep(2)
        if first:
            seconds = time.monotonic() - self.started
            sim_log(f"phase: sim {self.command} (in the background) {seconds:.1f}s")
        if self.code == 0:
            return
        if not first:
            raise RuntimeError(f"`python -m sim {self.command}` failed earlier ({self.log})")
        tail = self.log.read_text(errors="replace").splitlines()[-30:]
        raise RuntimeError(f"`python -m sim {self.command}` failed ({self.log}):\n"
                           + "\n".join(tail))  # fmt: skip


def _record(done: Path, code: int) -> None:
    """The exit code, written whole (a reader never sees half of it)."""
    part = done.with_suffix(".part")
    part.write_text(f"{code}\n")
    part.replace(done)


_WARMUP: list[_Warmup] = []


def pytest_configure(config: pytest.Config) -> None:
    """Under xdist the run's id is this process's choice, so that it finds the warm-up's
    files at the end (the workers get it as their testrunuid)."""
    if _controller(config) and not config.option.testrunuid:
        config.option.testrunuid = uuid.uuid4().hex
    if _xdist(config) is not None:
        # The sim's suites are the run's longest chain: every worker starts in the
        # background and the one that runs them comes back to the foreground at its first
        # sim test, so the other tests use the time the sim's leave (waits, sleeps)
        # instead of slowing them down.
        _background()


# The other tests' cpu cgroup (cgroup v1's cpu controller, as root): the least weight the
# kernel takes (2) against the sim's (the node containers' cgroups and the foreground's
# processes, 1024 each), so they run on what the sim's chain leaves idle. Beside them the
# sim's chain is slower than alone (the warm-up 351 s against 174 s, at 256); at 2 its
# suites after the warm-up took about 1,400 s against 1,470 at 256, though its drift heals
# did not change (CONTRIBUTING.md, "Time budget"). A nice value would not do it: with the
# kernel's autogroups (kernel.sched_autogroup_enabled) nice orders only the processes of
# one session, and the tests' engines, provider hosts and the nodes' containers each run in
# sessions or cgroups of their own, which the scheduler weighs alike whatever their nice.
# Children stay in their parent's cgroup whatever session they start, so the whole of a
# test's work is weighed as one.
CPU_CGROUPS = Path("/sys/fs/cgroup/cpu")
BACKGROUND = CPU_CGROUPS / "sparkvllm-tests-background"
BACKGROUND_SHARES = 2


def _background() -> None:
    """This process (and what it starts from now on) in the background cgroup; where
    there is none to make (no cgroup v1 cpu controller, or not root), nice 19."""
    try:
        BACKGROUND.mkdir(exist_ok=True)
        (BACKGROUND / "cpu.shares").write_text(f"{BACKGROUND_SHARES}\n")
        (BACKGROUND / "cgroup.procs").write_text(f"{os.getpid()}\n")
    except OSError:
        os.nice(19)


def _normal_priority() -> None:
    """This process (and what it starts from now on) back in the foreground: the root cpu
    cgroup and the normal priority (as root; elsewhere it keeps the one it has). Also a
    preexec_fn: os calls only."""
    with contextlib.suppress(OSError):
        fd = os.open(CPU_CGROUPS / "cgroup.procs", os.O_WRONLY)
        try:
            os.write(fd, b"%d\n" % os.getpid())
        finally:
            os.close(fd)
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, 0, 0)


def pytest_sessionstart(session: pytest.Session) -> None:
    """The run's phase figures start empty (the controller, or the only process; not a
    collection alone, as tests/test_suite_groups.py runs during a run)."""
    if _xdist(session.config) is None and not session.config.option.collectonly:
        PHASES.unlink(missing_ok=True)


def pytest_collection_finish(session: pytest.Session) -> None:
    sims = [i for i in session.items if _is_sim(i)]
    if not sims or session.config.option.collectonly:
        return
    wanted = any("sim_deployment" in getattr(i, "fixturenames", ()) for i in sims)
    command = "apply" if wanted else "up"
    log = WARMUP_FILES / f"warmup-{command}.log"
    xdist = _xdist(session.config)
    pid, done = _run_files(xdist[1] if xdist else str(os.getpid()))
    if xdist is not None and xdist[0] != "gw0":
        _WARMUP.append(_Warmup(command, log, done, time.monotonic(), None))
        return
    WARMUP_FILES.mkdir(parents=True, exist_ok=True)
    for stale in [*WARMUP_FILES.glob("warmup-*.pid"), *WARMUP_FILES.glob("warmup-*.rc")]:
        stale.unlink(missing_ok=True)  # earlier runs'
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "sim", command], cwd=ROOT, stdout=out,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=_normal_priority,  # on the sim's chain, as the sim's worker is
        )  # fmt: skip
    if xdist is not None:
        # For the controller (its pid) and the sim's worker (its exit code as soon as it
        # ends, whatever this worker is running then: this worker's process lives until
        # the run's end, after its own tests are done).
        pid.write_text(f"{process.pid}\n")
        threading.Thread(target=lambda: _record(done, process.wait()), daemon=True).start()
    _WARMUP.append(_Warmup(command, log, done, time.monotonic(), process))


def _stop_warmup(pid: int, waited: Callable[[float], bool]) -> None:
    """SIGTERM is the local engine's graceful cancel (the steps in flight finish and are
    recorded, so the next run finds no pending operation); it is waited for."""
    sim_log(f"stopping the sim warm-up (steps in flight finish; log: {WARMUP_FILES})")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        if not waited(900):
            os.kill(pid, signal.SIGKILL)


def _gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(1)
    return False


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A run stopped early (-x, ^C): the bring-up does not outlive it. Under xdist the
    worker that started it may be done long before the sim's suites are: the controller
    stops it at the run's end (the worker only when interrupted itself)."""
    config = session.config
    if _controller(config):
        pid, done = _run_files(str(config.option.testrunuid))
        if pid.exists() and not done.exists():
            number = int(pid.read_text())
            _stop_warmup(number, functools.partial(_gone, number))
        pid.unlink(missing_ok=True)
        done.unlink(missing_ok=True)
        return
    interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
    for warm in _WARMUP:
        if warm.process is None or warm.process.poll() is not None:
            continue
        if _xdist(config) is None or interrupted:
            _stop_warmup(warm.process.pid, functools.partial(_waited, warm.process))


def _waited(process: subprocess.Popen[bytes], seconds: float) -> bool:
    try:
        process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return False
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A sim test starts once the background bring-up is done: before any of its fixtures
    (a session's shared deployment included), so none runs beside it."""
    if _is_sim(item):
        if _xdist(item.config) is not None:
            _normal_priority()
        for warm in _WARMUP:
            warm.wait()


@pytest.fixture(scope="session")
def sim_deployment() -> SimDeployment:
    """The shared deployment: deployed by the warm-up; this `up` finds it converged (or,
    without a warm-up, deploys it)."""
    from sim import stack

    started = time.monotonic()
    stack.ensure_up()
    sim_log(f"phase: sim up {time.monotonic() - started:.1f}s")
    cfg, access = stack.load()
    if not stack.has_state():
        # Containers that no state knows of (a deleted state) would block the creates.
        stack.cluster().remove_inner_containers(f"{LABEL_PREFIX}.stack={stack.STACK}")
    started = time.monotonic()
    result = stack.engine("up", log=sim_log)
    seconds = time.monotonic() - started
    sim_log(f"phase: deploy TP=2 (engine up) {seconds:.1f}s")
    assert not result.error, result.error
    assert result.outputs["health"]["ready"] is True
    answer = sim_complete(result.outputs["endpoint"])
    return SimDeployment(cfg, access, result.outputs, seconds, answer)


SIM_PROMPT = "The simulated spark cluster says"


def sim_complete(endpoint: str, tokens: int = 12, model: str = "tiny-qwen3") -> str:
    """The completion of SIM_PROMPT at temperature 0 (the TP=1 vs TP=2 comparison)."""
    import urllib.request

    body = {"model": model, "prompt": SIM_PROMPT, "max_tokens": tokens,
            "temperature": 0, "seed": 0}  # fmt: skip
    req = urllib.request.Request(
        f"{endpoint}/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=300) as resp:
        return str(json.loads(resp.read())["choices"][0]["text"])


# --- time per suite, beside its budget (CONTRIBUTING.md "Time budget") -------------------

_SUITE_SECONDS: dict[str, float] = {}
_BUDGET_ROW = re.compile(r"^\|\s*`(tests/[\w/]+\.py)`\s*\|\s*(\d+)\s*\|")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    suite = report.nodeid.split("::", 1)[0]
    _SUITE_SECONDS[suite] = _SUITE_SECONDS.get(suite, 0.0) + report.duration


def suite_budgets(text: str) -> dict[str, int]:
    """The seconds each suite may take, from CONTRIBUTING.md's budget table."""
    return {m[1]: int(m[2]) for line in text.splitlines() if (m := _BUDGET_ROW.match(line))}


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Each suite's time (its tests, fixtures included) beside its budget: what the next
    suite may spend, and which one went over (a figure, never a failure). Then the sim's
    phase figures (sim_log)."""
    write = terminalreporter.write_line
    if _xdist(terminalreporter.config) is None and PHASES.exists():
        terminalreporter.section("the simulated cluster's phases")
        for line in PHASES.read_text().splitlines():
            write(line)
    if not _SUITE_SECONDS:
        return
    budgets = suite_budgets((ROOT / "CONTRIBUTING.md").read_text())
    terminalreporter.section("time per suite (budget: CONTRIBUTING.md)")
    for suite, seconds in sorted(_SUITE_SECONDS.items(), key=lambda kv: -kv[1]):
        budget = budgets.get(suite)
        note = "" if budget is None else f" / {budget:5d}s" + ("  OVER" if seconds > budget else "")
        write(f"{seconds:8.1f}s{note}  {suite}")
    write(f"{sum(_SUITE_SECONDS.values()):8.1f}s in all")
