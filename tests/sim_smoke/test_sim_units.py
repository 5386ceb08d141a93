"""Quick self-checks of the simulation's pure parts and of `up`'s rollback (fake runner)."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from sim import build, host_checks, keys, tiny_model
from sim.nodes import Cluster, Undo, find_existing, node_run_argv
from sim.progress import Timer
from sim.runner import CommandError, Result
from sim.settings import StatePaths, node_specs


class FakeRunner:
    """Records argv; answers from a table of (argv prefix -> Result)."""

    def __init__(self, answers: dict[tuple[str, ...], Result] | None = None) -> None:
        self.calls: list[list[str]] = []
        self.answers = answers or {}

    def run(
        self,
        argv: Sequence[str],
        *,
        check: bool = True,
        input: bytes | None = None,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
    ) -> Result:
        self.calls.append(list(argv))
        result = Result(0, "")
        for prefix, answer in self.answers.items():
            if tuple(argv[: len(prefix)]) == prefix:
                result = answer
        if check and not result.ok:
            raise CommandError(argv, result.returncode, result.stderr)
        return result

    def spawn(self, argv: Sequence[str], *, log_path: Path) -> int:
        self.calls.append(list(argv))
        return 4242


def test_node_addresses_and_names() -> None:
    nodes = node_specs(3)
    assert [n.address for n in nodes] == ["172.28.0.11", "172.28.0.12", "172.28.0.13"]
    assert nodes[0].container == "sparkvllm-sim-spark-1"
    assert nodes[0].name == "spark-1"
    with pytest.raises(ValueError, match="at least 1"):
        node_specs(0)


def test_only_head_gets_images_mount(tmp_path: Path) -> None:
    head, worker = node_specs(2)
    paths = StatePaths(tmp_path)
    head_argv = node_run_argv(head, "img", paths, images_mount=head.is_head)
    worker_argv = node_run_argv(worker, "img", paths, images_mount=worker.is_head)
    mount = f"{paths.images_dir}:/var/lib/sparkvllm/images:ro"
    assert mount in head_argv
    assert mount not in worker_argv
    assert "--privileged" not in head_argv
    assert "--cap-drop=SYS_RESOURCE" in head_argv


def test_subnet_collisions() -> None:
    occupants = [
        host_checks.Occupant("docker network", "bridge", "172.17.0.0/16"),
        host_checks.Occupant("host route", "172.28.0.0/16 dev eth9", "172.28.0.0/16"),
    ]
    hits = host_checks.collisions("172.28.0.0/24", occupants)
    assert [h.name for h in hits] == ["172.28.0.0/16 dev eth9"]
    routes = json.dumps([{"dst": "default", "dev": "eth0"}, {"dst": "10.0.0.0/8", "dev": "x"}])
    assert [o.subnet for o in host_checks.parse_routes(routes)] == ["10.0.0.0/8"]


def test_deb822_mirrors() -> None:
    text = (
        "Types: deb\nURIs: http://mirror/debian\nSuites: bookworm bookworm-updates\n\n"
        "Types: deb\nURIs: http://mirror/debian-security\nSuites: bookworm-security\n"
    )
    mirrors = build.parse_deb822_mirrors(text)
    assert mirrors == build.AptMirrors("http://mirror/debian", "http://mirror/debian-security")


def test_hash_inputs_is_order_independent() -> None:
    a = build.hash_inputs([("x", b"1"), ("y", b"2")])
    assert a == build.hash_inputs([("y", b"2"), ("x", b"1")])
    assert a != build.hash_inputs([("x", b"1"), ("y", b"3")])


def test_hub_layout_is_deterministic(tmp_path: Path) -> None:
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "config.json").write_text("{}")
    (flat / "model.safetensors").write_bytes(b"weights")
    rev1 = tiny_model.write_hub_layout(flat, tmp_path / "a" / "models--o--m")
    rev2 = tiny_model.write_hub_layout(flat, tmp_path / "b" / "models--o--m")
    assert rev1 == rev2 and len(rev1) == 40
    link = tmp_path / "a" / "models--o--m" / "snapshots" / rev1 / "config.json"
    assert link.is_symlink() and link.read_text() == "{}"
    assert (tmp_path / "a" / "models--o--m" / "refs" / "main").read_text() == rev1


def test_known_hosts_text() -> None:
    text = keys.known_hosts_text(node_specs(2), {"spark-1": "k1", "spark-2": "k2"})
    assert text == "172.28.0.11 k1\n172.28.0.12 k2\n"


def test_undo_runs_in_reverse() -> None:
    done: list[str] = []
    undo = Undo()
    undo.push("a", lambda: done.append("a"))
    undo.push("b", lambda: done.append("b"))
    undo.run(lambda _: None)
    assert done == ["b", "a"]


def test_down_removes_only_labelled_sim_objects(tmp_path: Path) -> None:
    runner = FakeRunner(
        {
            ("docker", "ps"): Result(0, "sparkvllm-sim-spark-1 running\nother-thing running\n"),
            # The hub stand-in, found by its own label (not a node).
            ("docker", "ps", "-aq", "--filter", "label=io.sparkvllm.sim.hub"): Result(0, "hub1\n"),
            ("docker", "ps", "-aq", "--filter", "label=io.sparkvllm.sim.jump"): Result(0, "j1\n"),
            ("docker", "volume", "ls"): Result(0, "sparkvllm-sim-spark-1-docker\nforeign\n"),
            ("docker", "network", "ls"): Result(0, "abc123\n"),
        }
    )
    existing = find_existing(runner)
    assert list(existing.containers) == ["sparkvllm-sim-spark-1"]
    Cluster(runner, StatePaths(tmp_path), Timer(quiet=True)).down()
    removals = [c for c in runner.calls if "rm" in c]
    assert removals == [
        ["docker", "rm", "-f", "hub1"],  # attached to the network: first
        ["docker", "rm", "-f", "j1"],
        ["docker", "rm", "-f", "-v", "sparkvllm-sim-spark-1"],
        ["docker", "volume", "rm", "sparkvllm-sim-spark-1-docker"],
        ["docker", "network", "rm", "sparkvllm-sim"],
    ]


def test_down_forgets_the_local_engines_state_of_the_removed_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LOCALENGINE_BACKEND_URL", raising=False)
    checkout = tmp_path / "checkout"
    stacks = checkout / ".localengine" / "stacks" / "spark-vllm"
    stacks.mkdir(parents=True)
    (stacks / "sim.json").write_text("{}")
    (stacks / "spark.json").write_text("{}")
    runner = FakeRunner({("docker", "ps"): Result(0, "sparkvllm-sim-spark-1 running\n")})
    Cluster(runner, StatePaths(checkout / ".sim"), Timer(quiet=True)).down()
    assert not (stacks / "sim.json").exists()
    assert (stacks / "spark.json").exists()  # another stack's state is not the sim's


def test_failed_up_rolls_back_what_it_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sim.nodes as cluster_mod

    hub = tiny_model.HubModel(
        "sparkvllm/tiny-qwen3", tmp_path / "models--sparkvllm--tiny-qwen3", "0" * 40
    )
    hub.snapshot_dir.mkdir(parents=True)
    monkeypatch.setattr(cluster_mod, "ensure_dockerd", lambda *a: None)
    monkeypatch.setattr(keys, "ensure_node_keys", lambda *a: {"spark-1": "k1", "spark-2": "k2"})
    monkeypatch.setattr(build, "ensure_images", lambda *a: build.BuiltImages("b", "n", "v", "r"))
    monkeypatch.setattr(tiny_model, "ensure_model", lambda *a: hub)
    monkeypatch.setattr(Cluster, "_check_host", lambda *a: None)
    monkeypatch.setattr(Cluster, "_export_vllm_image", lambda *a: None)
    runner = FakeRunner(
        {
            ("docker", "volume", "inspect"): Result(1, ""),
            ("docker", "run", "-d", "--name", "sparkvllm-sim-spark-2"): Result(1, ""),
            ("docker", "inspect"): Result(0, "\n"),  # the name belongs to a foreign container
        }
    )
    cluster = Cluster(runner, StatePaths(tmp_path / ".sim"), Timer(quiet=True))
    with pytest.raises(CommandError):
        cluster.up(2)
    removals = [c[1:] for c in runner.calls if "rm" in c or "rm" in c[1:3]]
    assert removals == [
        ["volume", "rm", "sparkvllm-sim-spark-2-docker"],
        ["rm", "-f", "sparkvllm-sim-spark-1"],
        ["volume", "rm", "sparkvllm-sim-spark-1-docker"],
        ["network", "rm", "sparkvllm-sim"],
    ]
    assert not (tmp_path / ".sim" / "nodes.json").exists()


@pytest.mark.parametrize(
    ("mounted", "ours"),
    [("{here}", True), ("/tmp/ci/main/.sim/nodes/spark-1", False), ("", True)],
    ids=["mounts this checkout", "mounts another checkout", "not inspectable"],
)
def test_a_simulation_is_ours_only_if_its_nodes_mount_this_checkout(
    tmp_path: Path, mounted: str, ours: bool
) -> None:
    """Another checkout's .sim/ may hold keys as well: the node's mount decides."""
    paths = StatePaths(tmp_path / ".sim")
    node = node_specs(1)
    for p in [paths.client_key, paths.nodes_json, paths.host_key_pub("spark-1")]:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("x")
    source = mounted.format(here=paths.node_config_dir("spark-1"))
    runner = FakeRunner({("docker", "inspect"): Result(0, source + "\n")})
    assert Cluster(runner, paths, Timer(quiet=True))._state_here(node) is ours
    assert runner.calls[0][-1] == "sparkvllm-sim-spark-1"


class ImageStore:
    """A fake Docker engine's image store: `inspect` answers for the tags it holds, `build`
    and `tag` add one. Each build waits at `barrier` (if given) before it is done."""

    def __init__(self, present: set[str], barrier: threading.Barrier | None = None) -> None:
        self.present, self.barrier, self.built = present, barrier, list[str]()

    def run(self, argv: Sequence[str], *, check: bool = True, **_: object) -> Result:
        argv = list(argv)
        if argv[1:3] == ["image", "inspect"]:
            result = Result(0, f"sha256:{argv[-1]}") if argv[-1] in self.present else Result(1, "")
        elif argv[1] == "build":
            if self.barrier is not None:
                self.barrier.wait()
            tag = argv[argv.index("-t") + 1]
            self.present.add(tag)
            self.built.append(tag)
            result = Result(0, "")
        else:
            if argv[1] == "tag":
                self.present.add(argv[3])
            result = Result(0, "")
        if check and not result.ok:
            raise CommandError(argv, result.returncode, result.stderr)
        return result

    def spawn(self, argv: Sequence[str], *, log_path: Path) -> int:
        raise AssertionError(argv)


def test_the_images_on_the_base_build_side_by_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node, vLLM and router images (all FROM the base) build at once: each build
    waits until all three have begun (built one after another, the first waits alone and
    the barrier breaks). A second call builds nothing."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / f"torch-{build.TORCH_VERSION}-cp311-cp311-linux_x86_64.whl").write_bytes(b"w")
    monkeypatch.setenv(build.WHEEL_DIRS_ENV, str(wheels))
    paths = StatePaths(tmp_path / "sim")
    paths.cache_dir.mkdir(parents=True)
    base = build.base_recipe(build.host_mirrors())
    store = ImageStore({base.tag}, threading.Barrier(3, timeout=20))
    images = build.ensure_images(store, paths, Timer(quiet=True))
    assert sorted(store.built) == sorted([images.node, images.vllm, images.router])
    store.built.clear()
    assert build.ensure_images(store, paths, Timer(quiet=True)) == images
    assert store.built == []
