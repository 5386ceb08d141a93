"""What node commands print, read back: the one home for parsing their output.

Commands print either `key=value` lines (facts, links, image and weight steps, the drift
state) or, for probes run with `python3 -`, one JSON object on their last line; a value
that must be the same on every node is read from each node and compared here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

# A key: a word, dotted and dashed parts allowed (`peer.spark-2.route`, `image.id`). A log
# line that happens to hold `=` ("Loaded image: x=y") is not a key=value line.
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


def key_values(stdout: str) -> dict[str, str]:
    """The `key=value` lines of a command's output, values stripped (later lines win).

    >>> key_values("id=sha256:ab\\nLoaded image: x=y\\npeer.spark-2.tcp=ok\\n")
    {'id': 'sha256:ab', 'peer.spark-2.tcp': 'ok'}
    """
    out: dict[str, str] = {}
    for line in stdout.splitlines():
        key, sep, value = line.partition("=")
        key = key.strip()
        if sep and _KEY.fullmatch(key):
            out[key] = value.strip()
    return out


def last_json(stdout: str) -> dict[str, Any]:
    """The last line of a probe's output that parses as a JSON object ({} if none)."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return {}


class NodesDisagreeError(Exception):
    """Nodes report different values for something that must be the same everywhere."""


def same_on_every_node(by_node: Mapping[str, str], subject: str) -> str:
    """The one value every node reported, else NodesDisagreeError naming each node's.

    >>> same_on_every_node({"spark-1": "ab", "spark-2": "ab"}, "image differs")
    'ab'
    """
    distinct = set(by_node.values())
    if len(distinct) != 1 or "" in distinct:
        detail = ", ".join(f"{n}={v[:12] or 'missing'}" for n, v in sorted(by_node.items()))
        raise NodesDisagreeError(f"{subject} across nodes: {detail}")
    return distinct.pop()
