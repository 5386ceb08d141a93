"""SIMULATION: a stand-in for the Hugging Face hub that serves one model and can gate it.

Serves what `huggingface_hub.snapshot_download` asks for (read in huggingface_hub 2.4.0,
the vllm-sim image's: `_snapshot_download.py`, `hf_api.py`, `file_download.py`,
`utils/_http.py`) and what the program's preflight asks (`sparkvllm/probes/hub_access.py`):

    GET  /api/models/ORG/NAME/revision/REV      repo info: {"id", "sha", "gated", ...}
                                                (`?blobs=true`: each file's size too)
    GET  /api/models/ORG/NAME/tree/REV          the file list (`?recursive=...` ignored)
    HEAD /ORG/NAME/resolve/REV/FILE             X-Repo-Commit, ETag, Content-Length
    GET  /ORG/NAME/resolve/REV/FILE             the bytes

As the hub does: metadata (repo info, tree) is public for a gated repo; a file is not. A
gated file without a token is 401 with `X-Error-Code: GatedRepo`, with a token that is not
the one allowed 403 `GatedRepo`; an unknown repo 401 `RepoNotFound`; an unknown revision 404
`RevisionNotFound`; an unknown file 404 `EntryNotFound`. Simplified: every file is served
as an LFS file (ETag = its sha256, the name huggingface_hub gives its blob), directly (no
redirect to a CDN, no Xet). Standard library only: it runs in the sim-node image.

Run: python3 hub.py --port P --model ORG/NAME --files DIR [--token-file F]
(the allowed token is read from a file, never from argv).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

CHUNK = 1 << 20


@dataclass
class Repo:
    """One model repo: its files (a flat folder), one commit, optionally gated."""

    model_id: str
    files_dir: Path
    token: str | None = None  # gated when set
    hashes: dict[str, str] = field(default_factory=dict)
    sha: str = ""

    def __post_init__(self) -> None:
        for p in sorted(self.files_dir.iterdir()):
            if p.is_file():
                self.hashes[p.name] = _sha256(p)
        listing = "".join(f"{n}\0{h}\n" for n, h in sorted(self.hashes.items()))
        self.sha = hashlib.sha1(listing.encode()).hexdigest()

    def revision_ok(self, rev: str) -> bool:
        return rev in ("main", self.sha)

    def info(self, blobs: bool = False) -> dict[str, object]:
        """The repo info; with `blobs` (`?blobs=true`, huggingface_hub's
        `model_info(files_metadata=True)`) each sibling carries its size, blob id and LFS
        record, as the hub's do."""
        siblings: list[dict[str, object]] = []
        for name, digest in sorted(self.hashes.items()):
            sibling: dict[str, object] = {"rfilename": name}
            if blobs:
                size, oid = self._blob(name)
                sibling.update(
                    size=size,
                    blobId=oid,
                    lfs={"size": size, "sha256": digest, "pointerSize": 134},
                )
            siblings.append(sibling)
        return {
            "id": self.model_id,
            "modelId": self.model_id,
            "sha": self.sha,
            "private": False,
            "gated": "manual" if self.token else False,
            "disabled": False,
            "siblings": siblings,
        }

    def _blob(self, name: str) -> tuple[int, str]:
        """File `name`'s size and its git object id (simplified: a sha1 of its sha256), as
        the tree and the repo info both give them."""
        size = (self.files_dir / name).stat().st_size
        return size, hashlib.sha1(self.hashes[name].encode()).hexdigest()

    def tree(self) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        for name, digest in sorted(self.hashes.items()):
            size, oid = self._blob(name)
            out.append(
                {
                    "type": "file",
                    "oid": oid,
                    "size": size,
                    "path": name,
                    "lfs": {"oid": digest, "size": size, "pointerSize": 134},
                }
            )
        return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


class Handler(BaseHTTPRequestHandler):
    repo: Repo  # set on the subclass made by `server`
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write(f"hub: {self.command} {self.path.split('?')[0]} {args[1:2]}\n")

    def do_GET(self) -> None:
        self._serve(body=True)

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def _error(self, status: int, code: str, message: str) -> None:
        data = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _json(self, payload: object) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        if not auth.startswith("Bearer "):
            return None
        return auth.removeprefix("Bearer ").strip() or None

    def _serve(self, body: bool) -> None:
        parts = [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/")]
        repo = self.repo
        if parts[:2] == ["api", "models"] and len(parts) >= 6:
            model, kind, rev = "/".join(parts[2:4]), parts[4], parts[5]
            if model != repo.model_id:
                return self._error(401, "RepoNotFound", "Repository Not Found")
            if not repo.revision_ok(rev):
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            if kind == "revision":
                query = parse_qs(urlsplit(self.path).query)
                return self._json(repo.info(blobs=query.get("blobs", [""])[-1].lower() in
                                            ("true", "1")))  # fmt: skip
            if kind == "tree":
                return self._json(repo.tree())
        elif len(parts) >= 5 and parts[2] == "resolve":
            model, rev, name = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
            if model != repo.model_id:
                return self._error(401, "RepoNotFound", "Repository Not Found")
            if repo.token is not None:
                token = self._token()
                if token is None:
                    return self._error(
                        401, "GatedRepo",
                        f"Access to model {model} is restricted. You must have access to it "
                        "and be authenticated to access it. Please log in.",
                    )  # fmt: skip
                if token != repo.token:
                    return self._error(
                        403, "GatedRepo",
                        f"Access to model {model} is restricted and you are not in the "
                        "authorized list.",
                    )  # fmt: skip
            if not repo.revision_ok(rev):
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            if name not in repo.hashes:
                return self._error(404, "EntryNotFound", f"{name} does not exist")
            return self._file(name, body)
        return self._error(404, "NotFound", "Not Found")

    def _file(self, name: str, body: bool) -> None:
        path = self.repo.files_dir / name
        self.send_response(200)
        self.send_header("X-Repo-Commit", self.repo.sha)
        self.send_header("ETag", f'"{self.repo.hashes[name]}"')
        self.send_header("Content-Length", str(path.stat().st_size))
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        if body:
            with path.open("rb") as f:
                while chunk := f.read(CHUNK):
                    self.wfile.write(chunk)


def server(repo: Repo, host: str, port: int) -> ThreadingHTTPServer:
    """A hub stand-in for `repo` listening on host:port (port 0: any free port)."""
    handler = type("RepoHandler", (Handler,), {"repo": repo})
    return ThreadingHTTPServer((host, port), handler)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--model", required=True)
    p.add_argument("--files", required=True, type=Path)
    p.add_argument("--token-file", type=Path)
    a = p.parse_args(argv)
    token = a.token_file.read_text().strip() if a.token_file else None
    httpd = server(Repo(a.model, a.files, token), a.host, a.port)
    print(f"hub: serving {a.model} on {a.host}:{httpd.server_address[1]}", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    main()
