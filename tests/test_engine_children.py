"""Issue 24, a state you can trust: nothing the engine starts outlives it, and no secret is
in any argv.

- A killed engine (SIGKILL: none of its cleanup runs) takes the program and the dynamic
  provider hosts with it, the python the host's script starts included
  (localengine/children.py: the parent-death signal, armed by `setpriv`).
- The signal follows the THREAD that forked (prctl(2)): a provider host started from a
  thread that ends right after lives on.
- pulumi-command's `environment` and previous outputs reach the node as SSH env requests:
  their values are in the ssh process's environment, never its argv; an `environment` the
  node's sshd does not accept fails the command (localengine/providers/command.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from localengine import children, wire
from localengine.providers.base import ProviderError
from localengine.providers.command import CommandProvider
from localengine.providers.dynamic import PluginContext, ProviderHost
from sparkvllm.specs.ssh import SshOptions, SshTarget
from tests.conftest import project_yaml

ROOT = Path(__file__).resolve().parent.parent

# --- processes, read from /proc -----------------------------------------------------------


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(parent, state, start time) of a process, None when there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return int(fields[1]), fields[0], int(fields[19])


def _running(pid: int, started: int | None = None) -> bool:
    """Alive (a zombie is not: it has ended, and waits only to be reaped) and, given its
    start time, still the same process."""
    stat = _stat(pid)
    return stat is not None and stat[1] not in "ZX" and started in (None, stat[2])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _descendants(root: int) -> dict[int, tuple[int, str]]:
    """Every running process under `root` (by parent links): pid -> (start time, cmdline)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        stat = _stat(int(entry.name)) if entry.name.isdigit() else None
        if stat is not None and stat[1] not in "ZX":
            parents[int(entry.name)] = stat[0]
    found, frontier = {}, [root]
    while frontier:
        parent = frontier.pop()
        for pid in (p for p, pp in parents.items() if pp == parent):
            stat = _stat(pid)
            if stat is not None:
                found[pid] = (stat[2], _cmdline(pid))
                frontier.append(pid)
    return found


def _survivors(procs: dict[int, tuple[int, str]], within_s: float) -> dict[int, str]:
    """Those of `procs` still running after `within_s` seconds."""
    deadline = time.monotonic() + within_s
    while True:
        left = {pid: cmd for pid, (start, cmd) in procs.items() if _running(pid, start)}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def _kill_all(procs: dict[int, tuple[int, str]]) -> None:
    """A failed test leaves nothing running."""
    for pid, (start, _cmd) in procs.items():
        if _running(pid, start):
            os.kill(pid, signal.SIGKILL)


# --- a killed engine ----------------------------------------------------------------------

# A dynamic provider whose create writes its pid (the provider host's python) and then runs
# until it is stopped.
STUCK_PROGRAM = textwrap.dedent(
    """
    import os
    import time
    from pathlib import Path

    from pulumi.dynamic import CreateResult, Resource, ResourceProvider


    class Stuck(ResourceProvider):
        def create(self, props):
            Path("create.pid").write_text(str(os.getpid()))
            time.sleep(600)
            return CreateResult("stuck", {})


    class StuckRes(Resource):
        def __init__(self, name):
            super().__init__(Stuck(), name, {})


    StuckRes("stuck")
    """
)


def _engine_up(project: Path) -> subprocess.Popen[str]:
    """`python -m localengine up` on a project of its own, once the create runs in its
    provider host. A session of its own: nothing of the test's is signalled with it."""
    (project / "Pulumi.yaml").write_text(project_yaml("stuck"))
    (project / "Pulumi.test.yaml").write_text("config: {}\n")
    (project / "__main__.py").write_text(STUCK_PROGRAM)
    env = {k: v for k, v in os.environ.items() if "BACKEND_URL" not in k}
    with (project / "engine.log").open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "localengine", "up", "--stack", "test", "--cwd", str(project)],
            cwd=ROOT, env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
    deadline = time.monotonic() + 120
    while not (project / "create.pid").exists():
        said = (project / "engine.log").read_text()
        assert proc.poll() is None and time.monotonic() < deadline, said
        time.sleep(0.1)
    return proc


def test_a_killed_engine_takes_the_program_and_the_provider_hosts_with_it(tmp_path: Path) -> None:
    """SIGKILL to the engine alone (not its group): within 10 s the program, the provider
    host's script and its python, and everything else the engine started are gone."""
    engine = _engine_up(tmp_path)
    started = _descendants(engine.pid)
    try:
        host = int((tmp_path / "create.pid").read_text())
        assert host in started, started
        program = [p for p, (_s, cmd) in started.items() if "pulumi-language-python-exec" in cmd]
        assert program, f"the program is not among the engine's children: {started}"
        os.kill(engine.pid, signal.SIGKILL)
        engine.wait(timeout=10)
        left = _survivors(started, within_s=10)
        assert not left, f"outlived the killed engine: {left}"
    finally:
        _kill_all(started)
        if engine.poll() is None:
            engine.kill()
            engine.wait()


def test_a_provider_host_started_by_a_thread_that_ended_lives_on(tmp_path: Path) -> None:
    """Hosts are started from gRPC handler threads and refresh pool workers, which end
    while the engine lives on: the parent-death signal must not follow them."""
    project = yaml.safe_load(project_yaml("hosts"))
    made: list[ProviderHost] = []
    starter = threading.Thread(
        target=lambda: made.append(ProviderHost(PluginContext(tmp_path, project, "127.0.0.1:1")))
    )
    starter.start()
    starter.join()
    host = made[0]
    under = _descendants(host.proc.pid)
    try:
        time.sleep(1)  # a signal tied to the starter would have come by now
        assert host.proc.poll() is None, list(host.stderr)
        python = [p for p, (s, cmd) in under.items() if "pulumi.dynamic" in cmd and _running(p, s)]
        assert python, f"the host's python is gone: {under}"
        grpc.channel_ready_future(host.channel).result(timeout=30)  # and it still answers
    finally:
        host.close()
        _kill_all(under)


def test_the_parent_death_signal_follows_the_thread_that_forked() -> None:
    """The rule the spawner thread exists for (prctl(2) PR_SET_PDEATHSIG: "the thread that
    created this process"): the same wrapper, forked by a thread that then ends, dies."""
    forked: list[subprocess.Popen[bytes]] = []
    argv = children.wrapped(["sleep", "60"], engine=os.getpid())

    def fork_and_end() -> None:
        forked.append(subprocess.Popen(argv, start_new_session=True))
        # Once the wrappers are `sleep`, the signal is armed: a thread that ended before
        # (Popen returns at setpriv's exec) would leave the child to a sibling thread.
        deadline = time.monotonic() + 10
        while not _cmdline(forked[0].pid).startswith("sleep") and time.monotonic() < deadline:
            time.sleep(0.01)

    starter = threading.Thread(target=fork_and_end)
    starter.start()
    starter.join()
    try:
        assert forked[0].wait(timeout=10) == -signal.SIGKILL
    finally:
        forked[0].kill()
        forked[0].wait()


def test_a_child_whose_engine_died_before_the_signal_was_armed_ends_itself() -> None:
    """The race: the parent the child finds once armed is not the engine (it was
    reparented), so it ends as the signal would have ended it."""
    not_the_parent = 1
    argv = children.wrapped(["true"], engine=not_the_parent)
    ran = subprocess.run(argv, start_new_session=True, check=False, timeout=10)
    assert ran.returncode == -signal.SIGKILL


def test_the_watch_of_a_child_that_already_ended_stops_the_group() -> None:
    """The watch's race: its parent, once it is armed, is not the child it watches (the
    watch, in the child's group, stands here for what the child left in it)."""
    # A group leader that becomes the watch of itself: its parent is not "the child".
    leader = subprocess.Popen(
        ["/bin/sh", "-c", 'exec /bin/sh -c "$1" localengine-watch $$', "sh", children._WATCH],
        start_new_session=True,
    )
    assert leader.wait(timeout=10) == -signal.SIGKILL


def test_the_watch_keeps_out_of_a_group_the_child_does_not_lead() -> None:
    """A child started without a session of its own shares its parent's group: its watch
    does nothing there. (The watch leads its own group here, so a watch that did act
    would end only itself.)"""
    watch = ["/bin/sh", "-c", children._WATCH, "localengine-watch", "1"]
    ran = subprocess.run(watch, start_new_session=True, check=False, timeout=10)
    assert ran.returncode == 0


def test_what_a_child_starts_in_its_group_ends_with_it() -> None:
    """The provider host's script runs python as a child of /bin/sh, unarmed: the watch
    stops the child's whole process group when the child ends."""
    child = children.start(
        ["/bin/sh", "-c", "sleep 300 & echo $!; wait"], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    grandchild = int(child.stdout.readline())
    started = _stat(grandchild)
    assert started is not None and _running(grandchild)
    child.kill()
    child.wait()
    child.stdout.close()
    left = _survivors({grandchild: (started[2], "sleep 300")}, within_s=10)
    assert not left, left


def test_a_child_keeps_its_own_pid_session_and_exit_status() -> None:
    child = children.start(["/bin/sh", "-c", "echo $$ $(cut -d' ' -f6 /proc/$$/stat); exit 3"],
                           stdout=subprocess.PIPE, text=True)  # fmt: skip
    out, _ = child.communicate(timeout=10)
    assert out.split() == [str(child.pid), str(child.pid)]  # its pid, and its own session
    assert child.returncode == 3
    with pytest.raises(FileNotFoundError):
        children.start(["/nonexistent/python"])


# --- no secret in any argv ----------------------------------------------------------------

# An `ssh` that records its argv and environment (as exec'd: /proc/self/environ), and runs
# the remote command as sshd would: under bash, with only the sent variables (SendEnv) that
# the node's sshd accepts (STUB_ACCEPT_ENV, its AcceptEnv) in the session's environment.
STUB_SSH = textwrap.dedent(
    """\
    import json, os, subprocess, sys
    from pathlib import Path

    argv = sys.argv[1:]
    pairs = Path("/proc/self/environ").read_bytes().decode().split("\\0")
    env = dict(p.split("=", 1) for p in pairs if "=" in p)
    with open(env["STUB_SSH_LOG"], "a") as log:
        log.write(json.dumps({"argv": sys.argv, "env": env}) + "\\n")
    sent = [argv[i + 1].split("=", 1)[1] for i, w in enumerate(argv[:-1])
            if w == "-o" and argv[i + 1].startswith("SendEnv=")]
    accepted = env.get("STUB_ACCEPT_ENV", "").split()
    session = {"PATH": env["PATH"]}
    session.update({k: env[k] for k in sent if k in accepted and k in env})
    remote = " ".join(argv[argv.index("--") + 2:])
    sys.exit(subprocess.run(["bash", "-c", remote], env=session).returncode)
    """
)
TYPE = "command:remote:Command"
SECRET = "s3cr3t-value"


@pytest.fixture
def stub_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`ssh` on PATH is the stub; the log of its calls, one JSON object a line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "ssh"
    stub.write_text(f"#!{sys.executable}\n{STUB_SSH}")
    stub.chmod(0o755)
    log = tmp_path / "ssh.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STUB_SSH_LOG", str(log))
    return log


def _calls(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def _command(**inputs: Any) -> tuple[CommandProvider, dict[str, Any]]:
    """The engine's command provider with the engine's own transport (the real ssh seam,
    here reaching the stub), and the checked inputs of a Command with a secret
    `environment`."""
    from localengine.operations import _engine_ssh

    provider = CommandProvider(_engine_ssh)
    news = {
        "connection": wire.secret({"host": "10.0.0.7"}),
        "environment": {"TOKEN": wire.secret(SECRET)},
        **inputs,
    }
    return provider, provider.check(TYPE, {}, news)


def test_a_secret_environment_and_previous_outputs_are_in_no_argv(
    stub_ssh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Create, then update with the previous stdout (the secret itself): each ssh names
    the variables in its argv (`-o SendEnv=NAME`) and holds their values in its environment,
    which is this process's plus those names, nothing else; the node's command sees them."""
    monkeypatch.setenv("STUB_ACCEPT_ENV", "TOKEN PULUMI_COMMAND_STDOUT PULUMI_COMMAND_STDERR")
    provider, inputs = _command(
        create='printf %s "$TOKEN"', update='printf "%s|%s" "$TOKEN" "$PULUMI_COMMAND_STDOUT"'
    )
    id_, created = provider.create(TYPE, "c", inputs, preview=False)
    assert created["stdout"] == SECRET
    updated = provider.update(TYPE, "c", id_, created, inputs, preview=False)
    assert updated["stdout"] == f"{SECRET}|{SECRET}"
    sent = [{"TOKEN": SECRET}, {"TOKEN": SECRET, "PULUMI_COMMAND_STDOUT": SECRET}]
    calls = _calls(stub_ssh)
    assert len(calls) == 2
    for call, variables in zip(calls, sent, strict=True):
        assert not [w for w in call["argv"] if SECRET in w], call["argv"]
        names = [w.removeprefix("SendEnv=") for w in call["argv"] if w.startswith("SendEnv=")]
        assert names == sorted(variables)
        assert call["env"] == {**os.environ, **variables}


def test_an_environment_the_nodes_sshd_does_not_accept_fails_the_command(
    stub_ssh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pulumi-command: an `environment` that cannot be set is an error; OpenSSH's client
    does not say, so the node's shell checks the name (and never shows the value)."""
    monkeypatch.setenv("STUB_ACCEPT_ENV", "LANG")
    provider, inputs = _command(create="echo ran")
    with pytest.raises(ProviderError) as refused:
        provider.create(TYPE, "c", inputs, preview=False)
    said = str(refused.value)
    assert "could not set environment variable TOKEN: the node's sshd must accept it" in said
    assert "(exit 255)" in said and "ran" not in said.splitlines()[1:] and SECRET not in said


def test_previous_outputs_the_nodes_sshd_drops_do_not_fail_the_command(
    stub_ssh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pulumi-command sets PULUMI_COMMAND_STDOUT/STDERR optimistically (a warning, and on)."""
    monkeypatch.setenv("STUB_ACCEPT_ENV", "TOKEN")
    provider, inputs = _command(
        create="echo first", update='printf %s "${PULUMI_COMMAND_STDOUT-unset}"'
    )
    id_, created = provider.create(TYPE, "c", inputs, preview=False)
    updated = provider.update(TYPE, "c", id_, created, inputs, preview=False)
    assert updated["stdout"] == "unset"
    assert "SendEnv=PULUMI_COMMAND_STDOUT" in _calls(stub_ssh)[1]["argv"]


@pytest.mark.parametrize("name", ["LD_PRELOAD", "PATH", "SSH_AUTH_SOCK", "GCONV_PATH"])
def test_an_environment_name_the_workstations_ssh_reads_is_refused(
    stub_ssh: Path, name: str
) -> None:
    """The value would reach the workstation's own ssh first (LD_PRELOAD loads code into
    it): refused before anything runs, naming the fix."""
    provider, inputs = _command(create="echo ran", environment={name: "/tmp/x"})
    with pytest.raises(ProviderError, match=f"environment name '{name}' is not sent"):
        provider.create(TYPE, "c", inputs, preview=False)
    assert not stub_ssh.exists(), "no ssh was started"


def test_ssh_sends_a_variable_by_a_plain_name_only() -> None:
    """SendEnv takes patterns and `-NAME` removals (ssh_config(5)): only plain names."""
    target = SshTarget("root", "10.0.0.7", 22, SshOptions())
    assert target.argv("true", send_env=["A_1"])[-9:-7] == ["-o", "SendEnv=A_1"]
    for bad in ("A*", "-A", "A B", "Ä", ""):
        with pytest.raises(ValueError, match="not an environment variable name"):
            target.argv("true", send_env=[bad])


def test_key_copies_go_when_their_process_ends_even_killed(tmp_path: Path) -> None:
    """ConnectionFiles' folder of key copies goes with a `close()`, and with the process
    that made it when that process is killed (its watch sees the pipe close)."""
    from sparkvllm.remote import ConnectionFiles

    with ConnectionFiles() as files:
        files.target({"host": "127.0.0.1", "privateKey": "KEY-TEXT"})
        folder = files.directory
        assert [p.read_text() for p in folder.iterdir()] == ["KEY-TEXT\n"]
        watch = files._watch
    assert not folder.exists() and watch is not None and watch.returncode is not None
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(
            """
            import time
            from sparkvllm.remote import ConnectionFiles
            files = ConnectionFiles()
            files.target({"host": "127.0.0.1", "privateKey": "KEY-TEXT"})
            print(files.directory, flush=True)
            time.sleep(600)
            """
        )],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None
    folder = Path(holder.stdout.readline().strip())
    assert (folder / next(iter(os.listdir(folder)))).read_text() == "KEY-TEXT\n"
    holder.kill()
    holder.wait()
    deadline = time.monotonic() + 10
    while folder.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not folder.exists(), "the key copy outlived its killed process"
