"""Config documentation generated from the schema, so it cannot drift from the code.

`python -m sparkvllm.schema` writes schema/stack-config.schema.json (for editors) and the
config reference table between the markers in README.md. Tests fail when either is stale.
"""

import json
import re
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from sparkvllm.config import PROJECT, SECRET_FIELDS, StackConfig, json_schema

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_FILE = ROOT / "schema" / "stack-config.schema.json"
README = ROOT / "README.md"
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


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        ann = field.annotation
        nested = next(
            (
                a
                for a in (typing.get_args(ann) or (ann,))
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
        kind = "object" if nested else _type_name(ann)
        if name in SECRET_FIELDS:
            kind = "secret string"
        rows.append(f"| `{path}` | {kind} | {default} | {desc} |")
        if nested is not None:
            sub = f"{path}[]." if typing.get_origin(ann) is list else f"{path}."
            rows += _rows(nested, sub)
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


if __name__ == "__main__":
    SCHEMA_FILE.write_text(render())
    README.write_text(readme_with_reference(README.read_text()))
    print(f"wrote {SCHEMA_FILE} and the config reference in {README}")
