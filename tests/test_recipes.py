"""Community recipes in, stack config out, and back: the two formats read by their tools'
rules (tests/fixtures/recipes/ hold a recipe of each with every field its loader knows),
each command word to its typed field or to extra_args, every field without a place named,
bad input one line and exit 2 with nothing written, and an export that imports to the same
model. No node is contacted: the command reads files only."""

from __future__ import annotations

import copy
import itertools
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkvllm.config import ConfigError, load_stack_config
from sparkvllm.config.model import ServedModel
from sparkvllm.config_sources import stack_without_secrets as stack_raw
from sparkvllm.recipes import formats, mapping, shipped
from sparkvllm.recipes.__main__ import main
from tests.conftest import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "recipes"
HF = "/home/aurora/.cache/huggingface"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, list[str]]:
    """(exit status, stdout, stderr lines) of `python -m sparkvllm.recipes ARGV`."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err.splitlines()


def imported(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[dict[str, Any], list[str]]:
    code, out, err = run(capsys, "import", *argv)
    assert code == 0, err
    config = yaml.safe_load(out)["config"]
    return config, [line.removeprefix("recipes: warning: ") for line in err]


def write(tmp_path: Path, text: str, name: str = "r.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one line a refused import or export prints (exit 2, nothing on stdout)."""
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, ""), (code, out, err)
    assert len(err) == 1, err
    return err[0]


# --- the two formats, every field -------------------------------------------------------


def test_a_sparkrun_recipe_with_every_field(capsys: pytest.CaptureFixture[str]) -> None:
    config, warnings = imported(
        capsys, str(FIXTURES / "sparkrun-every-field.yaml"), "--hf-cache", HF
    )
    assert config["spark-vllm:image"] == {
        "ref": "ghcr.io/spark-arena/dgx-vllm-eugr-nightly:latest",
        "source": "pull",
    }
    assert config["spark-vllm:models"] == [
        {
            "id": "Qwen/Qwen3-Coder-30B-A3B-Instruct",
            "revision": "0123456789abcdef0123456789abcdef01234567",
            "served_name": "coder",
            "hf_cache": HF,
            "ports": {"api": 8010, "master": 29502},
            # runtime vllm-distributed is vLLM's own multi-node launcher
            "parallelism": {"tensor": 2, "pipeline": 1, "launcher": "native"},
            "vllm": {
                "gpu_memory_utilization": 0.75,
                "max_model_len": 65536,  # {context} -> {max_model_len} -> 65536
                "max_num_batched_tokens": 8192,
                "kv_cache_dtype": "fp8",
                "load_format": "instanttensor",
                "enable_auto_tool_choice": True,
                "tool_call_parser": "qwen3_coder",
                "speculative_config": {
                    "method": "ngram",
                    "num_speculative_tokens": 3,
                    "prompt_lookup_max": 4,
                },
                "enable_prefix_caching": True,
                "extra_args": [
                    "--max-num-seqs",
                    "16",
                    "--trust-remote-code",
                    "--compilation-config",
                    '{"cudagraph_mode": "FULL_AND_PIECEWISE"}',
                ],
                "env": {"VLLM_MARLIN_USE_ATOMIC_ADD": "1", "VLLM_USE_FLASHINFER_SAMPLER": "0"},
            },
        }
    ]
    # Each field without a place is named, none silently dropped.
    named = sorted(w.split(":", 1)[0] for w in warnings)
    assert named == sorted(
        [
            "mods",
            "executor_config",
            "distribution_config",
            "runtime_config",
            "benchmark",
            "metadata",
            "description",
            "runtime_version",
            "sparkrun_version",
            "name",
        ]
    )


def test_an_eugr_recipe_with_every_field(capsys: pytest.CaptureFixture[str]) -> None:
    config, warnings = imported(capsys, str(FIXTURES / "eugr-every-field.yaml"), "--hf-cache", HF)
    # eugr's containers are images its build script builds on the machine.
    assert config["spark-vllm:image"] == {"ref": "vllm-node", "source": "present"}
    assert config["spark-vllm:models"] == [
        {
            "id": "QuantTrio/MiniMax-M2-AWQ",
            "hf_cache": HF,
            # --distributed-executor-backend ray in the command
            "parallelism": {"tensor": 2, "launcher": "ray"},
            "vllm": {
                "gpu_memory_utilization": 0.8,
                "max_model_len": 128000,
                "enable_auto_tool_choice": True,
                "tool_call_parser": "minimax_m2",
                "reasoning_parser": "minimax_m2",
                # str.format: {{ }} are braces, {num_speculative_tokens} a value
                "speculative_config": {"method": "mtp", "num_speculative_tokens": 2},
                "extra_args": ["--mxfp4-layers", "moe,qkv,o,lm_head"],
                "env": {"VLLM_MARLIN_USE_ATOMIC_ADD": "1"},
            },
        }
    ]
    named = sorted(w.split(":", 1)[0] for w in warnings)
    assert named == sorted(["container", "mods", "build_args", "benchmark", "description", "name"])


def test_a_sparkrun_recipe_without_a_command_is_what_sparkrun_builds(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    recipe = write(
        tmp_path,
        """
model: Qwen/Qwen3-4B-Instruct-2507
container: vllm/vllm-openai:v0.11.0
defaults:
  tensor_parallel: 1
  port: 8000
  gpu_memory_utilization: 0.5
  enforce_eager: true
  trust_remote_code: "no"
  reasoning_parser: qwen3
""",
    )
    config, warnings = imported(capsys, recipe, "--hf-cache", HF)
    entry = config["spark-vllm:models"][0]
    assert entry["parallelism"] == {"tensor": 1, "launcher": "native"}
    assert entry["vllm"] == {"gpu_memory_utilization": 0.5, "extra_args": ["--enforce-eager"]}
    # sparkrun has no flag for it without a template: left out there, and said so here.
    assert warnings == [
        (
            "defaults.reasoning_parser: not imported; without a command template sparkrun "
            "passes only the defaults it has a flag for, and leaves this one out"
        )
    ]


@pytest.mark.parametrize(
    ("runtime", "backend", "launcher"),
    [
        ("vllm-ray", "", "ray"),
        ("vllm-distributed", "", "native"),
        ("vllm", "", "native"),
        ("vllm", "--distributed-executor-backend ray", "ray"),
        ("", "--distributed-executor-backend ray", "ray"),
        ("eugr-vllm", "", "ray"),
    ],
)
def test_the_runtime_decides_the_launcher_never_auto(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, runtime: str, backend: str, launcher: str
) -> None:
    text = "model: a/b\ncontainer: x/y:1\n" + (f"runtime: {runtime}\n" if runtime else "")
    text += f"command: vllm serve a/b -tp 2 {backend}\n"
    config, _ = imported(capsys, write(tmp_path, text), "--hf-cache", HF)
    assert config["spark-vllm:models"][0]["parallelism"]["launcher"] == launcher
    config, _ = imported(capsys, write(tmp_path, text), "--hf-cache", HF, "--launcher", "native")
    assert config["spark-vllm:models"][0]["parallelism"]["launcher"] == "native"


def test_sparkrun_ray_hints_are_its_own(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """recipe.py _resolve_vllm_variant: the backend default in any case, -o included; the
    template's flag with a space only. A backend the launcher contradicts is refused."""
    text = "model: a/b\ncommand: vllm serve a/b -tp 2\n"
    config, _ = imported(capsys, write(tmp_path, text), "--hf-cache", HF,
                         "--set", "distributed_executor_backend=Ray")  # fmt: skip
    assert config["spark-vllm:models"][0]["parallelism"]["launcher"] == "ray"
    text = "model: a/b\ncommand: vllm serve a/b -tp 2 --distributed-executor-backend=ray\n"
    line = refused(capsys, "import", write(tmp_path, text), "--hf-cache", HF)
    assert "command word 6 = '--distributed-executor-backend ray'" in line
    assert "vllm-distributed" in line


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        # every spelling vLLM's parser reads as the typed option
        ("--tensor_parallel_size 2", {"parallelism": {"tensor": 2}}),
        (
            "--tensor-parallel-size=2 --pipeline-parallel-size 1",
            {"parallelism": {"tensor": 2, "pipeline": 1}},
        ),
        (
            "--max_model_len=4096 --enable-prefix",
            {"vllm": {"max_model_len": 4096, "enable_prefix_caching": True}},
        ),
        (
            "--speculative-config.method mtp --speculative-config.num_speculative_tokens=2",
            {"vllm": {"speculative_config": {"method": "mtp", "num_speculative_tokens": 2}}},
        ),
        ("--model a/b --revision v2 --served-model-name x", {"revision": "v2", "served_name": "x"}),
        ("--port 8005 --master-port 29600", {"ports": {"api": 8005, "master": 29600}}),
        ("--host :: -dp 1", {}),
        (
            "--no-enable-prefix-caching -ep --language-model-only",
            {
                "vllm": {
                    "enable_prefix_caching": False,
                    "enable_expert_parallel": True,
                    "language_model_only": True,
                }
            },
        ),
        # flags no field owns keep their order and values, word by word
        (
            "--seed -1 --enforce-eager -O3 --hf-overrides '{\"a\": 1}'",
            {
                "vllm": {
                    "extra_args": [
                        "--seed",
                        "-1",
                        "--enforce-eager",
                        "-O3",
                        "--hf-overrides",
                        '{"a": 1}',
                    ]
                }
            },
        ),
    ],
)
def test_each_command_word_goes_to_its_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, words: str, expected: dict[str, Any]
) -> None:
    text = f"model: a/b\ncontainer: x/y:1\ncommand: |\n  vllm serve a/b {words}\n"
    entry = imported(capsys, write(tmp_path, text), "--hf-cache", HF)[0]["spark-vllm:models"][0]
    base = {"id": "a/b", "hf_cache": HF, "parallelism": {"tensor": 1, "launcher": "native"}}
    want: dict[str, Any] = {**base, **expected}
    want["parallelism"] = {"tensor": 1, "launcher": "native", **expected.get("parallelism", {})}
    assert {k: entry.get(k) for k in want} == want
    assert set(entry) == set(want)


def test_template_rules_of_each_tool(tmp_path: Path) -> None:
    # sparkrun: a brace that is no key stays; a key is filled again until nothing changes;
    # vpd's match is non-greedy, so a {key} inside a JSON object is never reached.
    r = formats.read(
        Path(
            write(
                tmp_path,
                """
model: a/b
defaults: {n: 2, spec: '{"num_speculative_tokens": {n}}', len: '{m}', m: 64}
command: |
  vllm serve {model} --x '{spec}' --y '{"y": 1}' --max-model-len {len}
""",
            )
        )
    )
    assert r.words == [
        "vllm",
        "serve",
        "a/b",
        "--x",
        '{"num_speculative_tokens": {n}}',
        "--y",
        '{"y": 1}',
        "--max-model-len",
        "64",
    ]
    # --set comes before the defaults (sparkrun's -o, eugr's CLI flags).
    r = formats.read(
        Path(
            write(
                tmp_path,
                """
recipe_version: "1"
name: n
container: c
defaults: {port: 8000}
command: |
  vllm serve a/b \\
    --port {port} --x '{{"y": 1}}'
""",
            )
        ),
        {"port": "9000"},
    )
    assert r.words == ["vllm", "serve", "a/b", "--port", "9000", "--x", '{"y": 1}']


# --- bad input: one line, exit 2, nothing written -----------------------------------------

BAD: list[tuple[str, str, str]] = [
    ("not YAML", "model: [a\n", "recipe = "),
    ("a list", "- model: a/b\n", "the top level is a list"),
    ("two documents", "model: a/b\n---\nmodel: c/d\n", "recipe = "),
    ("a key twice", "model: a/b\nmodel: c/d\n", "model"),
    ("an unknown field", "model: a/b\ncommand: vllm serve a/b\nmodle: x\n", "modle = 'x'"),
    ("a wrong type", "model: a/b\nmin_nodes: two\n", "min_nodes = 'two': must be an integer"),
    ("a map of the wrong type", "model: a/b\ndefaults: [1]\n", "defaults = [1]: must be a mapping"),
    ("a version no format has", "recipe_version: '3'\nmodel: a/b\n", "recipe_version = '3'"),
    (
        "eugr without command",
        "recipe_version: '1'\nname: n\ncontainer: c\n",
        "command = '(missing)'",
    ),
    ("sparkrun without model", "command: vllm serve a/b\n", "model = '(missing)'"),
    ("another engine", "model: a/b\nruntime: sglang\n", "runtime = 'sglang': another engine"),
    ("a command before serving", "model: a/b\npre_exec: ['pip install x']\n", "pre_exec = "),
    ("a workstation command", "model: a/b\npost_commands: ['curl x']\n", "post_commands = "),
    (
        "a template key without a value",
        "model: a/b\ncommand: vllm serve a/b --port {port}\n",
        "command = '{port}'",
    ),
    (
        "eugr: a key without a value",
        "recipe_version: '1'\nname: n\ncontainer: c\ncommand: vllm serve a/b --port {port}\n",
        "command = '{port}'",
    ),
    (
        "eugr: an attribute",
        (
            "recipe_version: '1'\nname: n\ncontainer: c\ndefaults: {p: 1}\n"
            "command: vllm serve a/b --port {p.real}\n"
        ),
        "only a plain {key}",
    ),
    (
        "a default that names itself",
        "model: a/b\ndefaults: {a: 'x{a}'}\ncommand: vllm serve a/b --x {a}\n",
        "never ends",
    ),
    ("not vllm serve", "model: a/b\ncommand: python3 -m sglang.launch_server\n", "not `vllm serve"),
    ("a shell operator", "model: a/b\ncommand: vllm serve a/b; reboot\n", "shell operator"),
    ("a substitution", "model: a/b\ncommand: vllm serve a/b --x $(reboot)\n", "expansion"),
    ("a backtick", "model: a/b\ncommand: vllm serve a/b --x `reboot`\n", "expansion"),
    (
        "a variable in double quotes",
        'model: a/b\ncommand: vllm serve a/b --x "$HOME"\n',
        "inside double quotes",
    ),
    ("a glob", "model: a/b\ncommand: vllm serve a/b --chat-template *.jinja\n", "glob"),
    ("a tilde", "model: a/b\ncommand: vllm serve a/b --chat-template ~/t.jinja\n", "glob"),
    ("an open quote", "model: a/b\ncommand: vllm serve a/b --x 'y\n", "never closed"),
    ("data parallel", "model: a/b\ncommand: vllm serve a/b -dp 2\n", "data parallelism"),
    (
        "a per-node flag",
        "model: a/b\ncommand: vllm serve a/b --nnodes 2\n",
        "set on each node by the launcher",
    ),
    ("another host", "model: a/b\ncommand: vllm serve a/b --host 127.0.0.1\n", "0.0.0.0"),
    ("an API key", "model: a/b\ncommand: vllm serve a/b --api-key k\n", "api_key"),
    ("an ambiguous flag", "model: a/b\ncommand: vllm serve a/b --enable\n", "abbreviation"),
    ("a file of options", "model: a/b\ncommand: vllm serve a/b --config c.yaml\n", "--config"),
    ("two models", "model: a/b\ncommand: vllm serve c/d\n", "model = 'a/b': the command serves"),
    ("a bad number", "model: a/b\ncommand: vllm serve a/b -tp two\n", "-tp takes a number"),
    (
        "memory over 0.9",
        "model: a/b\ncommand: vllm serve a/b --gpu-memory-utilization 0.95\n",
        "above 0.9",
    ),
    (
        "a cluster recipe on one GPU",
        "model: a/b\ncluster_only: true\ncommand: vllm serve a/b\n",
        "cluster_only = '2 to any'",
    ),
    (
        "a solo recipe on two",
        "model: a/b\nmax_nodes: 1\ncommand: vllm serve a/b -tp 2\n",
        "tensor x pipeline (2)",
    ),
    ("env: a shell expansion", "model: a/b\nenv: {X: '$(reboot)'}\n", "env.X = '$(reboot)'"),
    (
        "eugr env: a quote that ends eugr's export",
        (
            'recipe_version: "1"\nname: n\ncontainer: c\ncommand: vllm serve a/b\n'
            "env: {X: 'a\"; reboot; \"'}\n"
        ),
        "env.X = 'a\"; reboot; \"': eugr writes",
    ),
    (
        "env: a per-node variable",
        "model: a/b\nenv: {NCCL_SOCKET_IFNAME: eth0}\n",
        "env.NCCL_SOCKET_IFNAME = 'eth0': the program sets this variable itself",
    ),
    ("env: a secret", "model: a/b\nenv: {HF_TOKEN: x}\n", "env (models[].vllm.env)"),
    ("env: a shell startup file", "model: a/b\nenv: {BASH_ENV: /x}\n", "BASH_ENV"),
    ("env: a map", "model: a/b\nenv: {X: {y: 1}}\n", "env.X"),
    ("a bad model id", "model: 'a b'\ncommand: vllm serve 'a b'\n", "models[].id"),
    ("a bad image", "model: a/b\ncontainer: 'UPPER CASE'\n", "image.ref"),
]


@pytest.mark.parametrize(("case", "text", "named"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, case: str, text: str, named: str
) -> None:
    line = refused(capsys, "import", write(tmp_path, text), "--hf-cache", HF)
    assert line.startswith("recipes: ") and named in line and "Fix: " in line, line


def test_node_counts_are_checked_against_the_nodes_given(
    capsys: pytest.CaptureFixture[str],
) -> None:
    seed = "qwen3.5-122b-a10b-fp8-2x-mtp"
    line = refused(capsys, "import", seed, "--hf-cache", HF, "--nodes", "spark-1")
    assert "--nodes = 'spark-1': the recipe's tensor x pipeline is 2" in line
    line = refused(
        capsys, "import", seed, "--stack", "spark-models", "--nodes", "spark-9", "--name", "big"
    )
    assert "spark-9" in line


def test_a_missing_file_and_a_missing_cache_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, "import", "no-such-recipe")
    assert "recipe = 'no-such-recipe': no such file" in line
    assert "qwen3-4b-instruct-1x" in line  # the project's recipes are offered
    line = refused(capsys, "import", "qwen3-4b-instruct-1x")
    assert "--hf-cache = '(missing)'" in line


# --- into a stack ------------------------------------------------------------------------


def test_a_recipe_joins_a_stacks_set(capsys: pytest.CaptureFixture[str]) -> None:
    """Beside the stack's models, with the stack's hf_cache, on the head (one rank), ports
    of its own; the whole config printed loads."""
    config, _ = imported(
        capsys,
        "qwen3-4b-instruct-1x",
        "--stack",
        "spark-models",
        "--name",
        "tiny",
        "--set",
        "port=8002",
        "--set",
        "served_model_name=tiny",
        "--set",
        "gpu_memory_utilization=0.1",
    )
    models = config["spark-vllm:models"]
    assert [m.get("name") for m in models] == [None, "small", "tiny"]
    assert models[2]["nodes"] == ["spark-1"] and models[2]["hf_cache"] == HF
    assert models[2]["ports"] == {"api": 8002, "master": 29503}  # 29502 is small's
    raw = {**stack_raw("spark-models", ROOT), **{k.split(":", 1)[1]: v for k, v in config.items()}}
    assert [m.name for m in load_stack_config(raw).served] == [None, "small", "tiny"]


def test_a_recipe_that_would_overcommit_a_node_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # spark has the 122B model at 0.8 on both nodes: 0.15 more on spark-1 is 95%.
    line = refused(capsys, "import", "qwen3-4b-instruct-1x", "--stack", "spark", "--name", "s")
    assert "models (node spark-1) = 'qwen3.5-122b 0.8 + s 0.15 = 0.95'" in line


def test_a_port_taken_in_the_stack_names_the_recipe_word(
    capsys: pytest.CaptureFixture[str],
) -> None:
    line = refused(
        capsys,
        "import",
        "qwen3-4b-instruct-1x",
        "--stack",
        "spark-models",
        "--name",
        "tiny",
        "--set",
        "port=8002",
    )
    assert line.startswith("recipes: command word ") and "(models[].served_name)" in line


# --- the project's own recipes -----------------------------------------------------------


def test_the_project_recipes_import_as_the_stacks_they_come_from(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The seed's recipe is the spark-models stack's first model; the small one its
    second (both exactly, field by field)."""
    assert set(shipped()) == {"qwen3.5-122b-a10b-fp8-2x-mtp", "qwen3-4b-instruct-1x"}
    cfg = load_stack_config(stack_raw("spark-models", ROOT))
    big, small = cfg.served
    config, _ = imported(capsys, "qwen3.5-122b-a10b-fp8-2x-mtp", "--hf-cache", HF)
    assert config["spark-vllm:image"]["ref"] == cfg.image.ref
    assert ServedModel.model_validate(config["spark-vllm:models"][0]) == big
    config, _ = imported(
        capsys,
        "qwen3-4b-instruct-1x",
        "--hf-cache",
        HF,
        "--name",
        "small",
        "--nodes",
        "spark-2",
        "--set",
        "tool_call_parser=x",
    )
    got = ServedModel.model_validate(config["spark-vllm:models"][0])
    # The recipe adds prefix caching and tool calls to what the stack's small model has.
    assert got.model_copy(update={"vllm": small.vllm}) == small
    assert got.vllm.enable_prefix_caching and got.vllm.tool_call_parser == "x"


# --- export, and back --------------------------------------------------------------------


@pytest.mark.parametrize("model", ["qwen3.5-122b", "small"])
def test_import_of_an_export_is_the_same_model(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, model: str
) -> None:
    cfg = load_stack_config(stack_raw("spark-models", ROOT))
    original = next(m for m in cfg.served if model in (m.name, m.served_name))
    out = tmp_path / "exported.yaml"
    code, _, err = run(
        capsys, "export", "--stack", "spark-models", "--model", model, "--out", str(out)
    )
    assert code == 0 and err == [f"recipes: wrote {out}"]
    recipe = yaml.safe_load(out.read_text())
    assert (
        recipe["runtime"]
        == {"ray": "vllm-ray", "native": "vllm-distributed"}[original.parallelism.launcher]
    )
    # its nodes and its own master port ride in the spark_vllm block
    config, warnings = imported(capsys, str(out))
    assert ServedModel.model_validate(config["spark-vllm:models"][0]) == original
    assert [w.split(":", 1)[0] for w in warnings] == ["metadata"]
    assert list(tmp_path.iterdir()) == [out]  # no temporary file left


def test_an_export_is_a_sparkrun_recipe_sparkrun_can_render(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every {key} of the exported command has a default, and the JSON of the speculative
    config survives vpd's substitution (it is no key)."""
    code, out, _ = run(capsys, "export", "--stack", "spark-models", "--model", "qwen3.5-122b")
    assert code == 0
    recipe = yaml.safe_load(out)
    assert set(recipe) <= set(formats.SPARKRUN_FIELDS)
    rendered = formats._sparkrun_render(
        recipe["command"], {**recipe["defaults"], "model": recipe["model"]}
    )
    assert not re.search(r"\{[A-Za-z_]\w*\}", rendered)
    assert '--speculative-config \'{"method": "mtp", "num_speculative_tokens": 1}\'' in rendered


def test_export_needs_a_launcher_and_one_model(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, "export", "--stack", "spark", "--cwd", str(ROOT))
    assert "parallelism.launcher = 'auto'" in line and "--launcher" in line
    code, out, _ = run(capsys, "export", "--stack", "spark", "--launcher", "ray")
    assert code == 0 and "runtime: vllm-ray" in out
    line = refused(capsys, "export", "--stack", "spark-models")
    assert "--model = '(none)': the stack serves 2 models" in line
    line = refused(capsys, "export", "--stack", "spark-models", "--model", "nope")
    assert "--model = 'nope'" in line
    line = refused(capsys, "export", "--stack", "nope")
    assert "stack = 'nope'" in line


def test_export_takes_the_launcher_up_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    from sparkvllm import drift
    from sparkvllm.recipes import __main__ as cli

    monkeypatch.setattr(
        drift,
        "last_outputs",
        lambda stack, cwd: {"launcher": {"name": "native", "why": "the image has no Ray"}},
    )
    cfg = load_stack_config(stack_raw("spark", ROOT))
    assert cli._deployed_launcher(cfg, cfg.served[0], "spark", ROOT) == "native"
    assert mapping.to_recipe(cfg, cfg.served[0], "spark", "native")["runtime"] == (
        "vllm-distributed"
    )


def test_no_secret_of_the_stack_is_read_or_written(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    stack = (ROOT / "Pulumi.spark-models.yaml").read_text()
    stack += "  spark-vllm:api_key:\n    secure: v1:AAAAencrypted\n"
    stack += "  spark-vllm:hf_token: hf_plainTextTokenThatMustNotShow1234\n"
    (tmp_path / "Pulumi.s.yaml").write_text(stack)
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    code, out, err = run(
        capsys, "export", "--stack", "s", "--cwd", str(tmp_path), "--model", "small"
    )
    assert code == 0 and "secure" not in out and "hf_plain" not in out + "".join(err)
    code, out, err = run(
        capsys,
        "import",
        "qwen3-4b-instruct-1x",
        "--stack",
        "s",
        "--cwd",
        str(tmp_path),
        "--name",
        "t",
        "--set",
        "port=8009",
        "--set",
        "served_model_name=t",
        "--nodes",
        "spark-1",
        "--set",
        "gpu_memory_utilization=0.1",
    )
    assert code == 0 and "secure" not in out and "hf_plain" not in out + "".join(err)
    assert "secret-not-read" not in out


def test_the_command_runs_as_a_module_with_one_line_errors(tmp_path: Path) -> None:
    bad = write(tmp_path, "model: a/b\ncommand: vllm serve a/b && reboot\n")
    done = subprocess.run(
        [sys.executable, "-m", "sparkvllm.recipes", "import", bad, "--hf-cache", HF],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and "shell operator" in done.stderr


def test_config_errors_carry_the_recipe_field() -> None:
    """A problem found by the stack's own rules names the recipe word it came from."""
    recipe = formats.Recipe(
        path=Path("r.yaml"),
        dialect=formats.SPARKRUN,
        fields={"model": "a/b", "container": "x/y:1"},
        words=["vllm", "serve", "a/b", "--max-model-len", "8"],
    )
    got = mapping.import_recipe(recipe, hf_cache=HF)
    with pytest.raises(ConfigError) as e:
        mapping.checked(got, None)
    assert e.value.issues[0].path == "command word 4 (models[].vllm.max_model_len)"


# --- hostile values ----------------------------------------------------------------------


def _string_leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _string_leaves(v, (*path, k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _string_leaves(v, (*path, i))]
    return [path] if isinstance(value, str | int | float) and not isinstance(value, bool) else []


def _with(doc: Any, path: tuple[Any, ...], payload: str) -> Any:
    doc = copy.deepcopy(doc)
    node = doc
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = payload
    return doc


@pytest.mark.parametrize("fixture", ["sparkrun-every-field.yaml", "eugr-every-field.yaml"])
def test_hostile_values_in_every_field_are_refused_or_stay_literal(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fixture: str
) -> None:
    """Each of the hostile-input payloads in each value of the recipe (the command, every
    default the template fills, env, the fields without a place): refused in one line
    naming a field (exit 2, nothing on stdout), or imported as a config the stack's rules
    accept, which the hostile-input suite shows runs no value as a command."""
    from tests.test_hostile_input import CANARY, PAYLOADS

    doc = yaml.safe_load((FIXTURES / fixture).read_text())
    paths = _string_leaves(doc)
    assert len(paths) > 15
    accepted = 0
    for path, payload in itertools.product(paths, PAYLOADS):
        recipe = write(tmp_path, yaml.safe_dump(_with(doc, path, payload)))
        code, out, err = run(capsys, "import", recipe, "--hf-cache", HF)
        where = ".".join(map(str, path))
        if code == 2:
            assert out == "" and len(err) == 1 and err[0].startswith("recipes: "), (where, err)
            assert " = " in err[0] and ". Fix: " in err[0], (where, err)
            continue
        assert code == 0, (where, payload, err)
        accepted += 1
        raw = {k.split(":", 1)[1]: v for k, v in yaml.safe_load(out)["config"].items()}
        model = ServedModel.model_validate(raw["models"][0])
        if CANARY in out and path[0] in ("command", "defaults"):
            # only as one whole argv word of extra_args (vLLM reads it as a value)
            assert any(CANARY in w for w in model.vllm.extra_args), (where, payload)
    assert 0 < accepted < len(paths) * len(PAYLOADS)


def test_the_import_each_project_recipe_shows_works(capsys: pytest.CaptureFixture[str]) -> None:
    for name, path in shipped().items():
        head = " ".join(
            line.lstrip("# ").rstrip("\\ ")
            for line in path.read_text().splitlines()
            if line.startswith("#")
        )
        argv = head.split("python -m sparkvllm.recipes", 1)[1].split()
        argv = [a.replace("USER", "aurora") for a in argv]
        assert argv[:2] == ["import", name]
        imported(capsys, *argv[1:])


# --- what review found (each was a wrong import, exit 0) ------------------------------------

REVIEWED: list[tuple[str, str, str]] = [
    # bash reads `\\` as a backslash: the newline after it ends the command
    ("an escaped backslash before a newline",
     "model: a/b\ncommand: |\n  vllm serve a/b --x a\\\\\n  touch /tmp/x\n", "shell operator"),
    # sparkrun joins a generated command with spaces and runs it with bash -c
    ("a generated command's value with an operator",
     "model: a/b\ndefaults: {max_num_seqs: '8; touch /tmp/x'}\n", "shell operator"),
    ("a generated command's value with a secret",
     "model: a/b\ndefaults: {quantization: 'fp8 --api-key sk-abcdefghijklmnopqrstuv'}\n",
     "api_key"),
    # after a flag, a word may be the flag's value or the model
    ("the model after a flag",
     "model: a/b\ncommand: vllm serve --enforce-eager c/d\n", "names no model right after"),
    ("an explicit value on a boolean flag",
     "model: a/b\ncommand: vllm serve a/b --enable-prefix-caching=false\n", "takes no value"),
    ("several served names",
     "model: a/b\ncommand: vllm serve a/b --served-model-name x y\n", "several served names"),
    ("a short form of the speculative config",
     "model: a/b\ncommand: vllm serve a/b --spec-method mtp\n", "--speculative-config '"),
    ("a length vLLM fits at start",
     "model: a/b\ncommand: vllm serve a/b --max-model-len auto\n", "fits the length"),
    ("a digit that is not ASCII", "model: a/b\nmin_nodes: '²'\n", "min_nodes = '²'"),
    ("a null template value in eugr's format",
     ("recipe_version: '1'\nname: n\ncontainer: c\ndefaults: {p: null}\n"
      "command: vllm serve a/b --port {p}\n"), "defaults.p = None"),
    ("a NUL in a field's name", "model: a/b\n\"x\\0y\": 1\n", "'x\\x00y'"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "text", "named"), REVIEWED, ids=[r[0] for r in REVIEWED])
def test_what_review_found_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, case: str, text: str, named: str
) -> None:
    line = refused(capsys, "import", write(tmp_path, text), "--hf-cache", HF)
    assert named in line and "\x00" not in line, line


def test_what_sparkrun_and_vllm_read_is_read(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # sparkrun appends --served-model-name when the template has none (base.py)
    text = "model: a/b\ndefaults: {served_model_name: foo}\ncommand: vllm serve a/b\n"
    entry = imported(capsys, write(tmp_path, text), "--hf-cache", HF)[0]["spark-vllm:models"][0]
    assert entry["served_name"] == "foo"
    # vLLM's human-readable counts; the last --speculative-config, its dotted keys after
    text = (
        "model: a/b\ncommand: |\n  vllm serve a/b --max-model-len 32k "
        "--max-num-batched-tokens 8K --speculative-config.num_speculative_tokens 3 "
        '--speculative-config \'{"method": "ngram", "prompt_lookup_max": 4}\' '
        '--speculative-config \'{"method": "mtp"}\'\n'
    )
    v = imported(capsys, write(tmp_path, text), "--hf-cache", HF)[0]["spark-vllm:models"][0]
    assert v["vllm"]["max_model_len"] == 32000
    assert v["vllm"]["max_num_batched_tokens"] == 8192
    assert v["vllm"]["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 3}
    # bash's double quotes: \$ is a dollar; a quoted $ stays refused
    text = 'model: a/b\ncommand: vllm serve a/b --x "a\\$b"\n'
    entry = imported(capsys, write(tmp_path, text), "--hf-cache", HF)[0]["spark-vllm:models"][0]
    assert entry["vllm"]["extra_args"] == ["--x", "a$b"]


def test_an_export_keeps_json_braces_and_refuses_a_template_key(tmp_path: Path) -> None:
    cfg = load_stack_config(stack_raw("spark-models", ROOT))
    small = cfg.served[1]
    json_arg = small.model_copy(
        update={"vllm": small.vllm.model_copy(update={"extra_args": ["--x", '{"a": 1}']})}
    )
    recipe = mapping.to_recipe(cfg, json_arg, "spark-models")
    assert "--x '{\"a\": 1}'" in recipe["command"]
    keyed = small.model_copy(
        update={"vllm": small.vllm.model_copy(update={"extra_args": ["--x", "{port}"]})}
    )
    with pytest.raises(ConfigError, match=r"extra_args\[1\] = '\{port\}'"):
        mapping.to_recipe(cfg, keyed, "spark-models")
    dollar = small.model_copy(
        update={"vllm": small.vllm.model_copy(update={"env": {"A": "x$HOME"}})}
    )
    with pytest.raises(ConfigError, match=r"vllm.env.A = 'x\$HOME'"):
        mapping.to_recipe(cfg, dollar, "spark-models")
