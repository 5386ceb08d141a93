"""python -m sparkvllm.recipes: import a community recipe as stack config, export a stack's
model as a recipe, list the project's own recipes.

  import FILE|NAME [--stack S] [--nodes A,B] [--name N] [--hf-cache PATH] [--set K=V ...]
      prints the `config:` keys the recipe means (image and models); warnings on stderr.
  export --stack S [--model NAME] [--out FILE]
      writes the stack's model as a sparkrun recipe (stdout, or FILE).
  list
      the project's recipes for the Spark (import one by its name).

Exit status: 0 done, 2 bad input (one line naming the field, the value and the fix;
nothing written), 1 anything else. Reads files only: nothing is sent to any node.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from sparkvllm.config import (
    PROJECT,
    ConfigError,
    Issue,
    StackConfig,
    load_stack_config,
)
from sparkvllm.config.model import ServedModel
from sparkvllm.config_sources import stack_without_secrets as stack_raw
from sparkvllm.recipes import formats, mapping, shipped
from sparkvllm.workstation import add_tool_flags, write_whole

PROG = "python -m sparkvllm.recipes"


def _bad(path: str, value: Any, problem: str, fix: str) -> ConfigError:
    return ConfigError([Issue(path=path, value=value, problem=problem, fix=fix)])


def _recipe_path(given: str) -> Path:
    path = Path(given)
    if path.is_file():
        return path
    if given in shipped():
        return shipped()[given]
    raise _bad(
        "recipe",
        given,
        "no such file, and no recipe of the project has this name",
        f"give a recipe file, or one of: {', '.join(shipped())}",
    )


def _overrides(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise _bad("--set", pair, "not KEY=VALUE", "write e.g. --set port=8001")
        out[key.strip()] = value
    return out


def import_to_config(
    args: argparse.Namespace,
) -> tuple[dict[str, Any], list[str], str, bool]:
    """(the `spark-vllm:` keys, warnings, what was read, whether the stack is written in
    the single-model form) of `import`."""
    recipe = formats.read(_recipe_path(args.recipe), _overrides(args.set or []))
    stack = stack_raw(args.stack, args.cwd) if args.stack else None
    nodes = [n.strip() for n in args.nodes.split(",")] if args.nodes else None
    imported = mapping.import_recipe(
        recipe, hf_cache=args.hf_cache, name=args.name, nodes=nodes, launcher=args.launcher
    )
    if stack is not None:
        _place_on(imported, stack, args.stack)
    if "hf_cache" not in imported.entry:
        raise _bad(
            "--hf-cache",
            "(missing)",
            "the stack needs the Hugging Face cache's path "
            "on the nodes, which no recipe field holds",
            "give --hf-cache /home/USER/.cache/huggingface, or --stack S to use the stack's",
        )
    config = mapping.checked(imported, stack)
    single = stack is not None and "models" not in stack
    return config, imported.warnings, f"{recipe.path} ({recipe.what})", single


def _place_on(imported: mapping.Imported, stack: dict[str, Any], name: str) -> None:
    """The stack's hf_cache (its first model's) when none is given, and the nodes: the head
    then the others in order, as many as the model's ranks."""
    cfg = load_stack_config(stack)
    entry = imported.entry
    if "hf_cache" not in entry:
        entry["hf_cache"] = cfg.served[0].hf_cache
    par = entry["parallelism"]
    ranks = int(par.get("tensor", 1)) * int(par.get("pipeline", 1))
    names = [cfg.head, *(n.name for n in cfg.nodes if n.name != cfg.head)]
    if ranks > len(names):
        raise _bad(
            "--stack",
            name,
            f"the stack has {len(names)} node(s), and the recipe's tensor x pipeline needs {ranks}",
            "add nodes to the stack, or import into a stack with enough",
        )
    if "nodes" not in entry and ranks < len(names):
        entry["nodes"] = names[:ranks]
    imported.entry = mapping.reordered(entry)


def _print_config(config: dict[str, Any], read: str, stack: str | None, single: bool) -> None:
    where = f"Pulumi.{stack}.yaml" if stack else "a stack file (Pulumi.<stack>.yaml)"
    keyed = {f"{PROJECT}:{k}": v for k, v in config.items()}
    body = yaml.safe_dump({"config": keyed}, sort_keys=False, width=100)
    replaced = "its image and models"
    if single:  # the single form's keys are models[0] now
        replaced += (f", and remove its {PROJECT}:model, {PROJECT}:parallelism and "
                     f"{PROJECT}:vllm (the first entry of models holds them now)")  # fmt: skip
    print(f"# From {read}.\n# Put these keys under `config:` in {where}; they replace "
          f"{replaced}.\n" + body, end="")  # fmt: skip


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (the command template) as YAML literal blocks, as people write
    recipes."""


def _literal(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
    style = "|" if "\n" in text and not re.search(r"[ \t]\n", text) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_BlockDumper.add_representer(str, _literal)


def _deployed_launcher(cfg: StackConfig, model: ServedModel, stack: str, cwd: Path) -> str | None:
    """The launcher the stack's last `up` chose for `model` (its outputs), or None."""
    if model.parallelism.launcher != "auto":
        return None
    from sparkvllm.drift import last_outputs

    last = last_outputs(stack, cwd)
    if cfg.single_form:
        chosen = last.get("launcher")
    else:
        chosen = next(
            (
                m.get("launcher")
                for m in (last.get("models") or {}).values()
                if m.get("served_name") == model.name_for_clients
            ),
            None,
        )
    return chosen.get("name") if isinstance(chosen, dict) else None


def _export(args: argparse.Namespace) -> int:
    cfg = load_stack_config(stack_raw(args.stack, args.cwd))
    models = cfg.served
    if args.model is None:
        if len(models) > 1:
            names = ", ".join(m.name or m.id for m in models)
            raise _bad(
                "--model",
                "(none)",
                f"the stack serves {len(models)} models",
                f"name one with --model: {names}",
            )
        model = models[0]
    else:
        found = [m for m in models if args.model in (m.name, m.served_name, m.id)]
        if not found:
            names = ", ".join(m.name or m.id for m in models)
            raise _bad(
                "--model", args.model, "the stack serves no such model", f"give one of: {names}"
            )
        model = found[0]
    deployed = args.launcher or _deployed_launcher(cfg, model, args.stack, args.cwd)
    recipe = mapping.to_recipe(cfg, model, args.stack, deployed)
    text = f"# A sparkrun recipe, exported from the {args.stack} stack of spark-vllm.\n"
    text += yaml.dump(recipe, Dumper=_BlockDumper, sort_keys=False, width=100)
    if args.out is None:
        print(text, end="")
        return 0
    out = Path(args.out)
    if not out.parent.is_dir() or not os.access(out.parent, os.W_OK | os.X_OK):
        raise _bad("--out", str(out), f"cannot write in {out.parent}", "give a file in a "
                   "folder that exists and you can write in")  # fmt: skip
    write_whole(out, text, 0o600)
    print(f"recipes: wrote {out}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="verb", required=True)
    imp = sub.add_parser("import", help="print the stack config a recipe means")
    imp.add_argument("recipe", help="a sparkrun or eugr recipe file, or a project recipe's name")
    imp.add_argument("--stack", help="the stack it joins (its nodes, hf_cache and models)")
    imp.add_argument("--nodes", help="the nodes its ranks run on, rank 0 first: A,B")
    imp.add_argument("--name", help="the model's short name (needed beside other models)")
    imp.add_argument("--hf-cache", help="the Hugging Face cache's path on the nodes")
    imp.add_argument(
        "--launcher",
        choices=["native", "ray"],
        help="override the launcher the recipe's runtime decides",
    )
    imp.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="a template value, before the recipe's defaults (sparkrun's -o)",
    )
    add_tool_flags(imp)
    exp = sub.add_parser("export", help="write a stack's model as a sparkrun recipe")
    exp.add_argument("--stack", required=True, help="stack name, e.g. spark")
    exp.add_argument("--model", help="which model of a set (its name, served name or id)")
    exp.add_argument("--out", help="the file to write (default: stdout)")
    exp.add_argument(
        "--launcher",
        choices=["native", "ray"],
        help="for a model whose launcher is auto: the one to write (default: "
        "the one the last `up` chose)",
    )
    add_tool_flags(exp)
    sub.add_parser("list", help="the project's own recipes")
    args = parser.parse_args(argv)
    try:
        if args.verb == "list":
            for name, path in shipped().items():
                about = (yaml.safe_load(path.read_text()).get("metadata") or {}).get(
                    "description", ""
                )
                print(f"{name}: {about}")
            return 0
        if args.verb == "export":
            return _export(args)
        config, warnings, read, single = import_to_config(args)
        _print_config(config, read, args.stack, single)
        sys.stdout.flush()
        for line in warnings:
            print(f"recipes: warning: {line}", file=sys.stderr)
        return 0
    except ConfigError as e:
        if getattr(args, "debug", False):
            import traceback

            traceback.print_exc()
        for issue in e.issues:
            print(f"recipes: {issue.render()}", file=sys.stderr)
        return 2
    except Exception as e:
        if getattr(args, "debug", False):
            raise
        print(f"{PROG}: {type(e).__name__}: {e} (--debug shows where)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
