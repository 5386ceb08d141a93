"""The local engine's command line: the stand-in for `pulumi` where the CLI cannot run.
It works on the Pulumi project in the current folder (or the nearest folder above it that
holds a Pulumi.yaml, as the CLI finds it), or on `--cwd DIR`'s.

    python -m localengine up|preview|refresh|destroy --stack NAME
        [--refresh] [--expect-no-changes] [--replace URN]... [--parallel N] [--json]
    python -m localengine refresh --stack NAME [--import-pending-creates URN ID]...
        [--clear-pending-creates]
        (settles the creates an interrupted run left pending: exists with that ID, or not)
    python -m localengine state delete URN... --stack NAME [--target-dependents]
        (forgets resources whose objects are gone; nothing on a node is touched)
    python -m localengine output --stack NAME [--json] [--show-secrets]
        (the stack's outputs from its state, as `pulumi stack output` prints them)
    python -m localengine export --stack NAME [--file FILE]
        (the state as `pulumi stack import` reads it, secrets sealed with
        PULUMI_CONFIG_PASSPHRASE: the stack moves to the Pulumi CLI without redeploying)
    python -m localengine import --stack NAME --file FILE
        (the stack's state becomes a `stack export` file's, ours or the CLI's)

Exit codes as the Pulumi CLI's (pkg/cmd/pulumi/cmd/exit_codes.go): 0 ok, 1 a step or the
program failed (a config error the program found included), 2 bad usage (a flag, a
project folder or a backend it cannot use), 6 no such stack, 7 changes were found under
--expect-no-changes, 8 cancelled (^C or SIGTERM; a second one terminates).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

from localengine import wire
from localengine.display import Display, summary_lines
from localengine.executor import STACK_TYPE
from localengine.export import ExportError, passphrase_from_env, untyped_deployment
from localengine.operations import Result, Terminated, run
from localengine.project import StackConfigError, read_stack_file
from localengine.state import StateError, StateFile
from localengine.state_edit import EditError, delete_resources, import_deployment

EXIT_USAGE = 2  # ExitConfigurationError
EXIT_STACK_NOT_FOUND = 6  # ExitStackNotFound
EXIT_NO_CHANGES = 7
EXIT_CANCELLED = 8  # pkg/cmd/pulumi/cmd/exit_codes.go ExitCancelled
EXIT_INTERNAL = 255  # ExitInternalError
USAGE = """python -m localengine up|preview|refresh|destroy [--stack NAME] [--cwd DIR]
           [--refresh|--no-refresh] [--expect-no-changes] [--replace URN]... [--parallel N]
           [--json] [--debug]
       python -m localengine refresh [--stack NAME] [--import-pending-creates URN ID]...
           [--clear-pending-creates]
       python -m localengine state delete URN [URN...] [--stack NAME] [--target-dependents]
       python -m localengine output [--stack NAME] [--json] [--show-secrets]
       python -m localengine export [--stack NAME] [--file FILE]
       python -m localengine import [--stack NAME] --file FILE"""


# pulumi pkg/backend/filestate/backend.go validateStackName (the local backend's rule).
_STACK_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


def stack_name(text: str) -> str:
    if not _STACK_NAME.match(text):
        raise argparse.ArgumentTypeError(
            f"{text[:100]!r}: stack names may only contain alphanumeric, hyphens, underscores, "
            "or periods (at most 100)"
        )
    return text


def parallel_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r}: give a whole number of 1 or more (1: one step at a time)"
        )
    return value


def find_project(start: Path) -> Path | None:
    """pulumi sdk/go/common/workspace/paths.go DetectProjectPathFrom: the first folder,
    from `start` up, that holds a Pulumi.yaml."""
    for folder in [start, *start.parents]:
        if (folder / "Pulumi.yaml").is_file():
            return folder
    return None


class _Parser(argparse.ArgumentParser):
    """Bad usage is one line naming the flag or value and the fix, exit 2 (not the whole
    usage block: `--help` shows it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"error: {message} (see `{self.prog} --help`)\n")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = _Parser(prog="python -m localengine", usage=USAGE, description=__doc__.split("\n")[0])
    p.add_argument(
        "operation",
        choices=["up", "preview", "refresh", "destroy", "output", "export", "import", "state"],
    )
    p.add_argument("words", nargs="*", metavar="ARG",
                   help="state: `delete URN...`, the resources to forget")  # fmt: skip
    p.add_argument(
        "--stack", "-s", default="sim", type=stack_name, metavar="NAME",
        help="stack name (default: sim)",
    )  # fmt: skip
    p.add_argument(
        "--refresh", action=argparse.BooleanOptionalAction, default=None,
        help="read every resource back first (default: Pulumi.yaml options.refresh)",
    )  # fmt: skip
    p.add_argument("--expect-no-changes", action="store_true", help="exit 7 if anything changes")
    p.add_argument("--replace", action="append", default=[], metavar="URN",
                   help="replace this resource even if its inputs did not change")  # fmt: skip
    p.add_argument("--parallel", "-p", type=parallel_count, default=None, metavar="N",
                   help="at most N resource operations at once (default: 4 per CPU, "
                   "or PULUMI_PARALLEL)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--show-secrets", action="store_true", help="output: show secret values")
    p.add_argument("--file", type=Path, default=None,
                   help="export: write here (default: standard output)")  # fmt: skip
    p.add_argument("--import-pending-creates", nargs=2, action="append", default=[],
                   metavar=("URN", "ID"), help="refresh: this pending create exists, with "
                   "this ID")  # fmt: skip
    p.add_argument("--clear-pending-creates", action="store_true",
                   help="refresh: the other pending creates do not exist")  # fmt: skip
    p.add_argument("--target-dependents", action="store_true",
                   help="state delete: delete the resources that depend on it too")  # fmt: skip
    p.add_argument("--debug", action="store_true", help="show an internal error's traceback")
    p.add_argument("--cwd", "-C", type=Path, default=None, metavar="DIR",
                   help="the Pulumi project's folder (default: the current folder, or the "
                   "nearest one above it that holds a Pulumi.yaml)")  # fmt: skip
    args = p.parse_args(argv)
    found = find_project((args.cwd or Path.cwd()).resolve())
    if found is None:
        where = args.cwd if args.cwd is not None else Path.cwd()
        p.error(
            f"no Pulumi.yaml in {where} or any folder above it. Fix: run in your Pulumi "
            "project's folder, or give --cwd DIR"
        )
    args.cwd = found
    return args


def engine_line(result: Result) -> str:
    """What the local engine adds to the CLI's summary: the provider calls that changed a
    node (0 on a no-op), and what the refresh read."""
    line = f"{result.provider_writes} provider calls that change a node"
    if result.refresh_steps:
        gone = sum(1 for s in result.refresh_steps if s.op == "delete")
        changed = sum(1 for s in result.refresh_steps if s.op == "update")
        line += f"; refresh read {len(result.refresh_steps)}: {changed} changed, {gone} gone"
    return f"({line})"


def stack_outputs(project_dir: Path, stack: str, show_secrets: bool) -> dict[str, Any] | None:
    """The root stack resource's outputs in the state (None: no state), secrets shown as
    "[secret]" unless asked (pulumi `stack output`: pkg/cmd/pulumi/stack/stack_output.go)."""
    root = next((r for r in StateFile(project_dir, stack).load() if r.type == STACK_TYPE), None)
    if root is None:
        return None
    return wire.plain(root.outputs) if show_secrets else wire.redacted(root.outputs)


def export_stack(project_dir: Path, stack: str, file: Path | None) -> int:
    """`export`: the stack's state for `pulumi stack import` (localengine/export.py)."""
    try:
        state = StateFile(project_dir, stack)
        state.move_from_earlier_location()
        resources = state.load()
        if not resources:
            raise ExportError(f"stack {stack!r} has no state here; fix: pick another --stack")
        deployment = untyped_deployment(resources, passphrase_from_env(), state.pending)
        text = json.dumps(deployment, indent=2)
    except (ExportError, StackConfigError, StateError) as e:
        print(f"error: export: {e}", file=sys.stderr)
        return 1
    if file is None:
        print(text)
        return 0
    fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    print(
        f"wrote {file}: {len(resources)} resources; next: `pulumi stack import --stack {stack} "
        f"--file {file}` (the same PULUMI_CONFIG_PASSPHRASE)",
        file=sys.stderr,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return _main(args)
    except Exception as e:  # the engine's own fault: one line, the traceback on demand
        if args.debug:
            raise
        print(f"error: internal: {type(e).__name__}: {e} (run with --debug for the traceback)",
              file=sys.stderr)  # fmt: skip
        return EXIT_INTERNAL


def edit_state(args: argparse.Namespace) -> int:
    """`state delete URN...` and `import --file F` (localengine/state_edit.py)."""
    say = lambda m: print(m, file=sys.stderr)  # noqa: E731
    try:
        state = StateFile(args.cwd, args.stack)
        state.move_from_earlier_location()
        if args.operation == "import":
            if args.file is None:
                raise EditError("import needs --file FILE (a `stack export` file)")
            try:
                passphrase: str | None = passphrase_from_env()
            except ExportError:
                passphrase = None  # needed only if the file holds sealed secrets
            count = import_deployment(state, args.file, passphrase, say)
            print(f"imported {count} resources into stack {args.stack!r}")
            return 0
        verb, urns = (args.words[0], args.words[1:]) if args.words else ("", [])
        if verb not in ("delete", "remove", "rm") or not urns:
            raise EditError("usage: state delete URN... [--target-dependents]")
        count = delete_resources(state, urns, args.target_dependents, say)
        print("Resource deleted" if count == 1 else f"{count} resources deleted")
        return 0
    except (EditError, StateError, StackConfigError) as e:
        print(f"error: {args.operation}: {e}", file=sys.stderr)
        return 1


def stack_exists(project_dir: Path, stack: str) -> bool:
    """A stack the local engine knows: its Pulumi.<stack>.yaml or a state of it (there is
    no `stack init` here: a stack file is how a stack is made)."""
    state = StateFile(project_dir, stack)  # refuses a backend it cannot use
    if (project_dir / f"Pulumi.{stack}.yaml").is_file():
        return True
    return state.path.exists() or state.earlier_path.exists()


def _main(args: argparse.Namespace) -> int:
    try:
        known = stack_exists(args.cwd, args.stack)
    except (StackConfigError, StateError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if not known:
        # The CLI: "no stack named 'X' found" (pkg/cmd/pulumi/stack/stack_select.go).
        print(f"error: no stack named {args.stack!r} found: no Pulumi.{args.stack}.yaml and no "
              f"state in {args.cwd}. Fix: pick a stack that has one (ls Pulumi.*.yaml), or "
              f"create Pulumi.{args.stack}.yaml", file=sys.stderr)  # fmt: skip
        return EXIT_STACK_NOT_FOUND
    stack_file = args.cwd / f"Pulumi.{args.stack}.yaml"
    if args.operation in ("up", "preview", "refresh", "destroy") and stack_file.is_file():
        try:  # the CLI reads the stack's config for each of these before anything else
            read_stack_file(stack_file)
        except StackConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return EXIT_USAGE
    if args.operation in ("state", "import"):
        return edit_state(args)
    if args.words:
        print(f"error: {args.operation} takes no words: {' '.join(args.words)[:200]}",
              file=sys.stderr)  # fmt: skip
        return 1
    if (args.import_pending_creates or args.clear_pending_creates) and args.operation != "refresh":
        print("error: --import-pending-creates and --clear-pending-creates go with `refresh`",
              file=sys.stderr)  # fmt: skip
        return 1
    if args.operation == "export":
        return export_stack(args.cwd, args.stack, args.file)
    if args.operation == "output":
        try:
            outputs = stack_outputs(args.cwd, args.stack, args.show_secrets)
        except (StateError, StackConfigError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        if outputs is None:
            print(f"error: stack {args.stack!r} has no state; fix: run `up` first", file=sys.stderr)
            return 1
        if args.json:
            print(json.dumps(outputs, indent=2, sort_keys=True, default=str))
        else:
            for key in sorted(outputs):
                value = outputs[key]
                text = value if isinstance(value, str) else json.dumps(value, default=str)
                print(f"    {key:24} {text}")
        return 0
    # The live view: finished steps as lines, the steps in flight redrawn on a terminal
    # (a line every 10 s elsewhere); nothing of it under --json.
    display = Display(sys.stdout)
    log = (lambda _m: None) if args.json else display.log
    try:
        with contextlib.nullcontext() if args.json else display:
            result = run(
                args.operation, args.stack, args.cwd, refresh=args.refresh,
                replace_urns=frozenset(args.replace), log=log, parallel=args.parallel,
                import_pending_creates=dict(args.import_pending_creates),
                clear_pending_creates=args.clear_pending_creates,
                progress=None if args.json else display,
            )  # fmt: skip
    except Terminated:
        # The provider hosts and the program are stopped; calls still in flight are not
        # waited for (their threads would hold the exit), so the process ends here.
        print("error: terminated: steps in flight were not waited for and are not "
              "recorded; fix: `refresh`, then `up`", file=sys.stderr, flush=True)  # fmt: skip
        sys.stdout.flush()
        os._exit(EXIT_CANCELLED)
    if args.json:
        print(json.dumps(result.as_json(), indent=2, sort_keys=True, default=str))
    else:
        # As the CLI ends a run: the outputs laid out (secrets masked), the counts, the
        # duration (each step was shown as it ended).
        outputs = wire.redacted(result.outputs) if result.operation == "up" else None
        print()
        for line in summary_lines(result.operation, result.counts, result.seconds,
                                  None if result.error else outputs):  # fmt: skip
            print(line)
        print(engine_line(result))
        if result.error:
            print(f"error: {result.error}", file=sys.stderr)  # a config error: a line each
    if result.cancelled:
        return EXIT_CANCELLED
    if result.error:
        return 1
    if args.expect_no_changes and result.changed:
        if not args.json:
            print("error: no changes were expected but changes were proposed", file=sys.stderr)
        return EXIT_NO_CHANGES
    return 0


if __name__ == "__main__":
    sys.exit(main())
