"""Can the head download the model? Asks the hub the way huggingface_hub does.

Run on the head (`python3 -c SOURCE ENDPOINT MODEL REVISION PROBLEMS_JSON`) with the HF
token, if any, as the first line of stdin: never on a command line. Standard library only
(a node's own python3). Prints one JSON line:

    {"hub": "ok" | "gated" | "no-access" | "bad-token" | "not-found" | "no-revision"
            | "unreachable" | "error", "status": HTTP status or 0, "gated": the repo's
     `gated` field ("manual", "auto" or false), "token": whether one was sent,
     "detail": the hub's X-Error-Message or the network error,
     "bytes": the size of the revision's files (0 when the hub did not say)}

and, for any verdict but "ok", its line from PROBLEMS_JSON (verdict -> text with `{said}`
and `{status}`, sparkvllm/specs/weights.py `hub_problems`) on stderr, and exits 1.

The hub's rules (huggingface_hub `utils/_http.py` `hf_raise_for_status`): a file of a gated
repo without a token is 401 `X-Error-Code: GatedRepo`, with a token lacking access 403
`GatedRepo`; an unknown (or private) repo 401 `RepoNotFound`; an unknown revision 404
`RevisionNotFound`. Repo metadata of a gated repo is public, its files are not: the probe
reads the repo info, then asks for config.json with HEAD (a redirect to the CDN counts as
access and is not followed). The repo info is asked with `?blobs=true`, as huggingface_hub's
`model_info(files_metadata=True)` does (`hf_api.py`): each sibling then carries its `size`,
and their sum is what a download of the revision brings (`snapshot_download` fetches every
file): the memory plan's weights figure before anything is downloaded.
"""

from __future__ import annotations

# What this probe does (sparkvllm.probes.revision): bump it when that changes, not for
# wording, comments or layout; a step that runs it re-runs then.
# revision: 2
import json
import sys
import urllib.error
import urllib.parse
import urllib.request


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # a 3xx comes back as an HTTPError: access granted, not followed


def _ask(url: str, token: str, method: str) -> tuple[int, str, str, bytes]:
    """(status, X-Error-Code, X-Error-Message, body) of one request; status 0 when the hub
    cannot be reached (the reason in the message)."""
    headers = {"User-Agent": "sparkvllm-preflight"}
    if token:
        headers["Authorization"] = "Bearer " + token
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(
            urllib.request.Request(url, headers=headers, method=method), timeout=20
        ) as r:
            return r.status, "", "", r.read() if method == "GET" else b""
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("X-Error-Code", ""), e.headers.get("X-Error-Message", ""), b""
    except (urllib.error.URLError, OSError) as e:
        return 0, "", str(getattr(e, "reason", e)), b""


def verdict(status: int, code: str, token: bool) -> str:
    if status == 0:
        return "unreachable"
    if 200 <= status < 400:
        return "ok"
    if code == "GatedRepo":
        return "no-access" if token else "gated"
    if code == "RepoNotFound":
        return "not-found"
    if code == "RevisionNotFound":
        return "no-revision"
    if status == 401 and token:
        return "bad-token"
    return "error"


def check(endpoint: str, model: str, revision: str, token: str) -> dict[str, object]:
    base = endpoint.rstrip("/")
    rev = urllib.parse.quote(revision, safe="")
    status, code, message, body = _ask(
        f"{base}/api/models/{model}/revision/{rev}?blobs=true", token, "GET"
    )
    gated: object = None
    size = 0
    if 200 <= status < 300:
        try:
            info = json.loads(body)
            gated = info.get("gated", False)
            rev = urllib.parse.quote(str(info.get("sha") or revision), safe="")
            size = weights_bytes(info.get("siblings"))
        except (ValueError, AttributeError):
            pass
        status, code, message, _ = _ask(f"{base}/{model}/resolve/{rev}/config.json", token, "HEAD")
    return {
        "hub": verdict(status, code, bool(token)),
        "status": status,
        "gated": gated,
        "token": bool(token),
        "detail": message[:300],
        "bytes": size,
    }


def weights_bytes(siblings: object) -> int:
    """The sum of the files' sizes; 0 (not known) unless every file says its size."""
    if not isinstance(siblings, list) or not siblings:
        return 0
    sizes = [s.get("size") if isinstance(s, dict) else None for s in siblings]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in sizes):
        return 0
    return sum(sizes)  # type: ignore[arg-type]


def problem(answer: dict[str, object], problems: dict[str, str]) -> str | None:
    """The line for a bad verdict (None for "ok"), filled with what the hub said."""
    verdict = str(answer["hub"])
    if verdict == "ok":
        return None
    said = f" (the hub says: {answer['detail']})" if answer.get("detail") else ""
    text = problems.get(verdict) or problems["error"]
    return text.replace("{said}", said).replace("{status}", str(answer.get("status")))


def main() -> None:
    endpoint, model, revision, problems = sys.argv[1:5]
    token = sys.stdin.readline().strip()
    answer = check(endpoint, model, revision, token)
    print(json.dumps(answer), flush=True)
    line = problem(answer, json.loads(problems))
    if line:
        print(line, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
