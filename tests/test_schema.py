"""The committed JSON Schema is current, and the stack files validate against it."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from sparkvllm.schema import SCHEMA_FILE, render
from tests.conftest import ROOT


def test_committed_schema_is_current() -> None:
    assert SCHEMA_FILE.read_text() == render(), "run: python -m sparkvllm.schema"


@pytest.mark.parametrize("stack", ["spark", "sim", "spark-models"])
def test_stack_file_validates(stack: str) -> None:
    path = ROOT / f"Pulumi.{stack}.yaml"
    if not path.exists():
        pytest.skip(f"{path.name} not present")
    jsonschema.validate(yaml.safe_load(path.read_text()), json.loads(SCHEMA_FILE.read_text()))


def test_schema_rejects_unknown_keys() -> None:
    doc = yaml.safe_load((ROOT / "Pulumi.spark.yaml").read_text())
    doc["config"]["spark-vllm:nodez"] = []
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, json.loads(SCHEMA_FILE.read_text()))
    doc = yaml.safe_load((ROOT / "Pulumi.spark.yaml").read_text())
    doc["config"]["spark-vllm:nodes"][0]["ssh"]["hostname"] = "x"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, json.loads(SCHEMA_FILE.read_text()))


def test_the_config_reference_is_current() -> None:
    from sparkvllm.schema import REFERENCE, readme_with_reference

    text = REFERENCE.read_text()
    assert readme_with_reference(text) == text, "run: python -m sparkvllm.schema"
    assert "| `vllm.gpu_memory_utilization` | float | `0.8` |" in text


def test_project_config_block_is_current() -> None:
    from sparkvllm.schema import PROJECT_FILE, project_file_with_config

    text = PROJECT_FILE.read_text()
    assert project_file_with_config(text) == text, "run: python -m sparkvllm.schema"


@pytest.mark.parametrize("stack", ["spark", "sim"])
def test_stack_files_pass_the_project_config_block(stack: str) -> None:
    """As `pulumi up` checks them (types; declared keys without a default present), and
    every injected default is the schema's own: the program sees the same config."""
    from localengine.program import apply_project_config, project_file
    from sparkvllm.config import load_stack_config
    from sparkvllm.config_sources import stack_file_raw

    raw = stack_file_raw(stack, ROOT)
    if stack == "spark":
        raw["ssh_private_key_file"] = "~/.ssh/id_ed25519"
    merged = apply_project_config(project_file(ROOT), stack, raw, set())
    ours = {k.removeprefix("spark-vllm:"): v for k, v in merged.items() if "pulumi:" not in k}
    assert set(ours) > set(raw)
    assert load_stack_config(ours) == load_stack_config(raw)


def test_the_generator_helps_and_checks_without_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--help` prints help; `--check` names a stale file and writes nothing; no flag
    writes it."""
    from sparkvllm import schema

    for name in ("SCHEMA_FILE", "REFERENCE", "PROJECT_FILE"):
        path = getattr(schema, name)
        copy = tmp_path / path.relative_to(ROOT)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(path.read_text())
        monkeypatch.setattr(schema, name, copy)
    monkeypatch.setattr(schema, "PROJECT_DIR", tmp_path)
    schema.SCHEMA_FILE.write_text("{}\n")
    with pytest.raises(SystemExit, match="0"):
        schema.main(["--help"])
    assert schema.main(["--check"]) == 1 and schema.SCHEMA_FILE.read_text() == "{}\n"
    assert "stale: schema/stack-config.schema.json; fix: python -m sparkvllm.schema" in (
        capsys.readouterr().err
    )
    assert schema.main([]) == 0 and schema.main(["--check"]) == 0
