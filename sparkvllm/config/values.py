"""Values every part of the config checks alike: names, hosts, paths on the nodes, hub
URLs, plain JSON values, secret-looking names; the closed base of every section."""

from __future__ import annotations

import itertools
import re
from ipaddress import ip_address
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict

PROJECT = "spark-vllm"
# The project folder (Pulumi.yaml, the stack files, schema/): the default for tools.
PROJECT_DIR = Path(__file__).resolve().parents[2]

# Unified memory (GB10): cudaMemGetInfo ignores reclaimable page cache, and an OOM can
# wedge the host until a power cycle. Above this fraction vLLM's start-up fails with "Free
# memory ... less than desired GPU memory utilization", or the box hangs.
MAX_UNIFIED_MEMORY_UTILIZATION = 0.9

_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")
# Linux interface names: 1-15 chars, no '/', ':' or whitespace (dev_valid_name); a leading
# '-' would read as an option to `ip`.
_NETDEV = re.compile(r"^(?!\.\.?$)[A-Za-z0-9_.][A-Za-z0-9_.-]{0,14}$")
# Login names as useradd takes them (no leading '-': it would read as an ssh option).
_USER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
# A DNS name (RFC 1123 labels, none starting or ending with '-').
_LABEL = r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)"
_HOSTNAME = re.compile(rf"^{_LABEL}(\.{_LABEL})*\.?$")
# Absolute paths on the nodes: no spaces or shell/docker metacharacters (':' and ',' split
# docker's -v syntax), no '..' segment.
_NODE_PATH = re.compile(r"^/[A-Za-z0-9._@%+=/-]*$")
# Docker's image reference grammar (distribution/reference regexp.go): [domain[:port]/]
# path[:tag][@digest].
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_REF = re.compile(
    rf"^(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::[0-9]+)?/)?{_PATH_PART}(?:/{_PATH_PART})*"
    r"(?::[\w][\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:"
    r"[0-9a-fA-F]{32,})?$"
)
# Names of vLLM plugins (parsers, speculative methods): qwen3, qwen3_coder, granite-20b-fc.
_PLUGIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_SERVED_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Variables a non-interactive bash (the containers' `bash -c` entrypoints) acts on at start
# or while it runs (bash(1) INVOCATION and Shell Variables): BASH_ENV and ENV name a file it
# sources after expanding them (`$(cmd)` runs), SHELLOPTS/BASHOPTS set options (xtrace),
# PS4 is expanded for every traced command, BASH_XTRACEFD redirects the trace, IFS, CDPATH
# and GLOBIGNORE change how the script's words are split and found; the prompts and
# PROMPT_COMMAND run code in an interactive one. None of them is vLLM's or NCCL's.
SHELL_STARTUP_VARIABLES = frozenset(
    {"BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS0", "PS1", "PS2", "PS3", "PS4",
     "PROMPT_COMMAND", "BASH_XTRACEFD", "IFS", "CDPATH", "GLOBIGNORE"}
)  # fmt: skip
# Words of a variable name that mark a secret (HF_TOKEN, OPENAI_API_KEY, DB_PASSWORD ...).
_SECRET_WORDS = {"TOKEN", "SECRET", "PASSWORD", "PASSWD", "APIKEY", "CREDENTIALS"}
_SECRET_PAIRS = {("API", "KEY"), ("PRIVATE", "KEY"), ("ACCESS", "KEY")}
MAX_CONTEXT_TOKENS = 2**24


def _host_problem(v: str) -> str | None:
    """Why `v` is not an IP address or DNS name, or None."""
    try:
        ip_address(v)
        return None
    except ValueError:
        pass
    if len(v) <= 253 and _HOSTNAME.match(v):
        return None
    return (
        "not an IP address or DNS name (letters, digits, dots and inner dashes); fix: give "
        "the address or name ssh reaches, e.g. 10.1.230.180 or spark-1.lab"
    )


_BEARER_FIX = {
    "api_key": ("an API key", "generate one, e.g. `openssl rand -hex 32`"),
    "hf_token": (
        "a Hugging Face token",
        "copy a read token from https://huggingface.co/settings/tokens",
    ),
}
HUB_ENDPOINT = "https://huggingface.co"
_HUB_PATH = re.compile(r"^(/[A-Za-z0-9._~-]+)*/?$")


def _hub_url_problem(v: str) -> str | None:
    """Why `v` is not a plain http(s) URL of a hub (scheme, host, port, path), or None."""
    fix = "fix: e.g. https://huggingface.co or http://10.0.0.5:8080 (a mirror)"
    try:
        u = urlsplit(v)
        port = u.port
    except ValueError:
        return f"not a URL; {fix}"
    if u.scheme not in ("http", "https") or not u.hostname:
        return f"needs http:// or https:// and a host; {fix}"
    if u.username or u.password or u.query or u.fragment:
        return f"no user, password, query or fragment (a token is the hf_token secret); {fix}"
    host_problem = _host_problem(u.hostname)
    if host_problem or (port is not None and not 0 < port < 65536):
        return f"the host or port is not valid; {fix}"
    if not _HUB_PATH.match(u.path):
        return f"the path may hold letters, digits and . _ ~ - / only; {fix}"
    return None


def _node_path_problem(v: str) -> str | None:
    if not PurePosixPath(v).is_absolute():
        return (
            "must be an absolute path on the nodes (no ~); fix: e.g. /home/USER/.cache/huggingface"
        )
    if not _NODE_PATH.match(v) or ".." in v.split("/") or v.rstrip("/") == "":
        return (
            "paths on the nodes may hold letters, digits and . _ @ % + = / - only (no spaces, "
            "quotes, ':' or '..') and not be /; fix: use a plain absolute path such as "
            "/var/lib/images/vllm.tar"
        )
    return None


def _node_path(v: str) -> str:
    """A path on the nodes, or ValueError naming the problem (_node_path_problem)."""
    problem = _node_path_problem(v)
    if problem:
        raise ValueError(problem)
    return v


def _no_control_chars(v: str) -> str:
    if any(ord(c) < 32 or ord(c) == 127 for c in v):
        raise ValueError("holds a control character (newline, tab, NUL ...); fix: remove it")
    return v


def _key_file(v: str) -> str:
    """A key file's path: given, so not empty (an empty one would quietly mean "unset")."""
    if not v.strip():
        raise ValueError("is empty; fix: give the key file's path, or leave the key out")
    return _no_control_chars(v)


_JSON_TEXT = re.compile(r"^[A-Za-z0-9._/:@+=-]{0,256}$")


def _json_value_problem(value: Any, where: str, depth: int) -> str | None:
    """Why `value` (a config object passed to vLLM as JSON) is not plain data, or None."""
    if depth > 3:
        return f"{where} nests deeper than 3 levels; fix: flatten it"
    if isinstance(value, dict):
        for k, v in value.items():
            if not (isinstance(k, str) and re.match(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$", k)):
                return f"{where} key {str(k)[:80]!r} is not an option name; fix: rename it"
            problem = _json_value_problem(v, f"{where}.{k}", depth + 1)
            if problem:
                return problem
        return None
    if isinstance(value, list):
        for i, v in enumerate(value[:64]):
            problem = _json_value_problem(v, f"{where}[{i}]", depth + 1)
            if problem:
                return problem
        return None if len(value) <= 64 else f"{where} has more than 64 items; fix: shorten it"
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        ok = abs(value) < 2**31
    elif isinstance(value, float):
        ok = value == value and abs(value) < 1e12
    elif isinstance(value, str):
        ok = bool(_JSON_TEXT.match(value))
    else:
        ok = False
    if ok:
        return None
    return (
        f"{where} = {str(value)[:80]!r} is not a plain value (a number, true/false, or a "
        "name of letters, digits and . _ / : @ + = -); fix: correct it"
    )


def is_secret_name(name: str) -> bool:
    """True for variable names that say they hold a secret (HF_TOKEN, X_API_KEY ...)."""
    words = name.upper().split("_")
    return bool(_SECRET_WORDS & set(words)) or any(
        pair in _SECRET_PAIRS for pair in itertools.pairwise(words)
    )


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)
