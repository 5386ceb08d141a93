"""From Pulumi's config to a validated StackConfig, one ConfigError naming every problem;
and the JSON Schema editors check stack files with."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from sparkvllm.config.errors import SECRET_FIELDS, STRUCTURED_SECRETS, ConfigError, Issue
from sparkvllm.config.stack import StackConfig
from sparkvllm.config.values import PROJECT


def _format_loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _walk(loc: tuple[int | str, ...]) -> tuple[type[BaseModel] | None, str | None]:
    """The model class reached by `loc` and the description of the last field on it."""
    model: type[BaseModel] | None = StackConfig
    desc = None
    for part in loc:
        if isinstance(part, int):
            continue
        field = None if model is None else _keys(model).get(str(part))
        if field is None:
            return None, desc
        desc = field.description
        model = _model_in(field.annotation)
    return model, desc


def _keys(model: type[BaseModel]) -> dict[str, Any]:
    """A section's fields by the key a stack file writes (the alias, where one is set)."""
    return {f.alias or name: f for name, f in model.model_fields.items()}


def _model_in(ann: Any) -> type[BaseModel] | None:
    """The section class a field holds: itself, or inside `X | None` or `list[X]`."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in getattr(ann, "__args__", None) or ():
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _named(loc: tuple[int | str, ...], desc: str | None) -> str:
    """A field as a fix names it: `nodes (the GB10 nodes)`, from its description (without
    its SECRET marker; a leading word in lower case unless it is a name, e.g. RoCE)."""
    name = next((str(p) for p in reversed(loc) if isinstance(p, str)), "a valid value")
    text = re.sub(r"^SECRET(, optional)?\. ", "", (desc or "").strip()).rstrip(".")
    if not text:
        return f"{name} (see the config reference)"
    if text[:1].isupper() and text[1:2].islower():
        text = text[0].lower() + text[1:]
    return f"{name} ({text})"


def _issue_from_pydantic(err: Mapping[str, Any]) -> Issue:
    loc = tuple(err["loc"])
    msg = str(err["msg"])
    msg = msg.removeprefix("Value error, ")
    if "; fix: " in msg:
        problem, fix = msg.split("; fix: ", 1)
    else:
        problem = msg
        _, desc = _walk(loc)
        if err["type"] == "extra_forbidden":
            parent, _ = _walk(loc[:-1])
            allowed = ", ".join(_keys(parent)) if parent else "see the config reference"
            fix = f"remove it or fix its spelling; allowed here: {allowed}"
        elif err["type"] == "missing":
            fix = f"add {_named(loc, desc)}"
        else:
            fix = f"give {_named(loc, desc)}"
    value = err.get("input")
    if err["type"] == "missing":
        value = "(missing)"
    if isinstance(value, dict) and err["type"] not in ("extra_forbidden",):
        value = {k: v for k, v in value.items() if k not in SECRET_FIELDS}
    return Issue(
        path=_format_loc(loc) or "(top level)",
        value=value,
        problem=problem.rstrip("."),
        fix=fix.rstrip("."),
    )


def load_stack_config(raw: Mapping[str, Any]) -> StackConfig:
    """Validate a raw stack config (the `spark-vllm:` keys, namespace stripped).

    Raises ConfigError naming every bad field, its value and the fix.
    """
    try:
        return StackConfig.model_validate(dict(raw))
    except ValidationError as e:
        raise ConfigError(_issue_from_pydantic(err) for err in e.errors()) from None


def parse_pulumi_config(values: Mapping[str, str], secret_keys: Iterable[str]) -> dict[str, Any]:
    """Turn Pulumi's flat `spark-vllm:key -> string` config into the raw schema input.

    Structured values arrive as JSON strings. Keys of other namespaces are ignored.
    Secrets set in plain text are refused: they would sit unencrypted in the stack file.
    """
    secret = set(secret_keys)
    raw: dict[str, Any] = {}
    issues: list[Issue] = []
    for full_key, text in values.items():
        ns, _, key = full_key.partition(":")
        if ns != PROJECT:
            continue
        if key in SECRET_FIELDS and full_key not in secret:
            issues.append(
                Issue(
                    path=key,
                    value="[secret]",
                    problem="set in plain text, so it is stored unencrypted",
                    fix=f"run `pulumi config rm {key}` then `pulumi config set --secret {key} ...`",
                )
            )
            continue
        if key in SECRET_FIELDS and key not in STRUCTURED_SECRETS:
            raw[key] = text
            continue
        try:
            raw[key] = json.loads(text)
        except json.JSONDecodeError:
            raw[key] = text
    if issues:
        raise ConfigError(issues)
    return raw


def json_schema() -> dict[str, Any]:
    """JSON Schema of a `Pulumi.<stack>.yaml` file for this project (for editors)."""
    inner = StackConfig.model_json_schema(ref_template="#/$defs/{model}")
    defs = inner.pop("$defs", {})
    props: dict[str, Any] = {}
    secret_value = {
        "type": "object",
        "properties": {"secure": {"type": "string"}},
        "required": ["secure"],
        "additionalProperties": False,
        "description": "Encrypted by `pulumi config set --secret`.",
    }
    for key, schema in inner["properties"].items():
        if key in SECRET_FIELDS:
            schema = {"description": schema.get("description", ""), **secret_value}
        props[f"{PROJECT}:{key}"] = schema
    required = [f"{PROJECT}:{k}" for k in inner.get("required", [])]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"Pulumi stack file for {PROJECT}",
        "type": "object",
        "properties": {
            "config": {
                "type": "object",
                "properties": props,
                "required": required,
                "patternProperties": {r"^(?!spark-vllm:).+:.+$": {}},
                "additionalProperties": False,
            },
            "encryptionsalt": {"type": "string"},
            "secretsprovider": {"type": "string"},
            "encryptedkey": {"type": "string"},
        },
        "$defs": defs,
    }
