"""Config documentation generated from the schema, so it cannot drift from the code.

`python -m sparkvllm.schema` writes schema/stack-config.schema.json (for editors), the
config reference table between the markers in docs/config.md, and the `config:` block of
Pulumi.yaml (the project's declared keys, which `pulumi config`, `pulumi preview` and
`pulumi up` check). `--check` writes nothing and exits 1 naming each file that is stale.
Tests fail when any is stale.
"""

import argparse
import json
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from sparkvllm.config import PROJECT, PROJECT_DIR, SECRET_FIELDS, StackConfig, json_schema

SCHEMA_FILE = PROJECT_DIR / "schema" / "stack-config.schema.json"
REFERENCE = PROJECT_DIR / "docs" / "config.md"
PROJECT_FILE = PROJECT_DIR / "Pulumi.yaml"
# The project file's own entries, kept as they are.
PROJECT_OWN_CONFIG: dict[str, Any] = {"pulumi:tags": {"value": {"pulumi:template": ""}}}
BEGIN, END = "<!-- config-reference:begin -->", "<!-- config-reference:end -->"


def render() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


def _type_name(ann: Any) -> str:
    origin = typing.get_origin(ann)
    if origin is typing.Literal:
        return " \\| ".join(repr(a) for a in typing.get_args(ann))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in typing.get_args(ann) if a is not type(None))
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in typing.get_args(ann))}]"
    return getattr(ann, "__name__", str(ann))


def _unwrapped(ann: Any) -> Any:
    """`X | None` -> X."""
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        return args[0] if len(args) == 1 else ann
    return ann


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows = []
    for field_name, field in model.model_fields.items():
        name = field.alias or field_name  # the key as a stack file writes it
        path = f"{prefix}{name}"
        ann = field.annotation
        inner = _unwrapped(ann)
        listed = typing.get_origin(inner) is list
        nested = next(
            (
                a
                for a in (typing.get_args(inner) if listed else (inner,))
                if isinstance(a, type) and issubclass(a, BaseModel)
            ),
            None,
        )
        if field.is_required():
            default = "required"
        elif nested is not None:
            default = "see below"
        elif field.default_factory is not None:
            default = f"`{json.dumps(field.default_factory())}`"  # type: ignore[call-arg]
        else:
            default = f"`{json.dumps(field.default)}`"
        desc = (field.description or "").replace("|", "\\|").replace("\n", " ")
        kind = ("list of objects" if listed else "object") if nested else _type_name(ann)
        if name in SECRET_FIELDS:
            kind = "secret string"
        rows.append(f"| `{path}` | {kind} | {default} | {desc} |")
        if nested is not None:
            rows += _rows(nested, f"{path}[]." if listed else f"{path}.")
    return rows


def reference_table() -> str:
    head = [
        f"Keys live under the `{PROJECT}:` namespace of `Pulumi.<stack>.yaml`.",
        "",
        "| key | type | default | meaning |",
        "| --- | --- | --- | --- |",
    ]
    return "\n".join(head + _rows(StackConfig, ""))


def readme_with_reference(text: str) -> str:
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    return pattern.sub(lambda _: f"{BEGIN}\n{reference_table()}\n{END}", text)


def _pulumi_type(ann: Any) -> str | None:
    """The project config type of a field (Pulumi knows string, integer, boolean, array,
    object); None when it has no single one (e.g. a value that may be absent)."""
    origin = typing.get_origin(ann)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        return _pulumi_type(args[0]) if len(args) == 1 else None
    if origin is list:
        return "array"
    if origin is typing.Literal:
        return "string" if all(isinstance(a, str) for a in typing.get_args(ann)) else None
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return "object"
    return {str: "string", bool: "boolean", int: "integer"}.get(ann)


def project_config() -> dict[str, Any]:
    """The project's declared keys. Pulumi makes a declared key without a `default`
    required (pkg/workspace/config.go mergeConfig), and injects the default into every
    stack that lacks the key: so a key is declared only when it is required or its default
    is the schema's own; optional keys without a default (`api_key`, `endpoint_host`,
    either SSH key field) are left to the schema, which the program applies anyway."""
    out: dict[str, Any] = {}
    for field_name, field in StackConfig.model_fields.items():
        name = field.alias or field_name  # the key as a stack file writes it
        typ = _pulumi_type(field.annotation)
        if typ is None or name in SECRET_FIELDS:
            continue
        decl: dict[str, Any] = {"type": typ}
        if typ == "array":
            ann = field.annotation
            if typing.get_origin(ann) in (typing.Union, types.UnionType):
                ann = next(a for a in typing.get_args(ann) if a is not type(None))
            (item,) = typing.get_args(ann)
            decl["items"] = {"type": _pulumi_type(item) or "string"}
        decl["description"] = " ".join((field.description or "").split())
        if not field.is_required():
            if field.default_factory is not None:
                default = field.default_factory()  # type: ignore[call-arg]
            else:
                default = field.default
            if isinstance(default, BaseModel):
                default = {}
            if default is None:
                continue
            decl["default"] = default
        out[name] = decl
    return {**PROJECT_OWN_CONFIG, **out}


def project_file_with_config(text: str) -> str:
    """Pulumi.yaml with its `config:` block (the file's last block) generated."""
    head = text.split("\nconfig:\n", 1)[0].split("\n# Generated by", 1)[0].rstrip("\n")
    block = yaml.safe_dump(
        {"config": project_config()}, sort_keys=False, width=88, allow_unicode=True
    )
    note = (
        "# Generated by `python -m sparkvllm.schema` from the stack-config schema: the keys\n"
        "# Pulumi checks before it runs the program (types; defaults equal the schema's).\n"
    )
    return f"{head}\n{note}{block}"


def generated() -> dict[Path, str]:
    """Each generated file and what it should hold."""
    return {
        SCHEMA_FILE: render(),
        REFERENCE: readme_with_reference(REFERENCE.read_text()),
        PROJECT_FILE: project_file_with_config(PROJECT_FILE.read_text()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sparkvllm.schema",
        description="Write the files generated from the stack-config schema: "
        f"{SCHEMA_FILE.relative_to(PROJECT_DIR)}, the config reference in "
        f"{REFERENCE.relative_to(PROJECT_DIR)} and {PROJECT_FILE.name}'s config block.",
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 naming each stale file"
    )
    args = parser.parse_args(argv)
    try:
        files = generated()
        stale = [p for p, text in files.items() if not p.exists() or p.read_text() != text]
        names = ", ".join(str(p.relative_to(PROJECT_DIR)) for p in stale)
        if args.check:
            if stale:
                print(f"stale: {names}; fix: python -m sparkvllm.schema", file=sys.stderr)
            return 1 if stale else 0
        for path in stale:
            path.write_text(files[path])
    except OSError as e:
        print(f"error: {e}; fix: run it in a writable spark-vllm checkout", file=sys.stderr)
        return 2
    print(f"wrote {names}" if stale else "the generated files are current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
