"""A Hugging Face Hub stand-in on the loopback interface, for testing real downloads offline.

`huggingface_hub` honours `HF_ENDPOINT`; this server answers the calls `snapshot_download` makes for
a commit-pinned model repository: the tree listing (`/api/models/<repo>/tree/<rev>`), the revision
info (`/api/models/<repo>/revision/<rev>`) and file downloads (`HEAD`/`GET /<repo>/resolve/<rev>/<path>`),
with the headers the client reads (`X-Repo-Commit`, `ETag`, `X-Linked-Etag`, `Content-Length`). It
counts every request, so a test can prove that a cached load makes none.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HubStandIn:
    """Serves `repo` at commit `commit` from `folder` (every file under it). `tamper` maps a relative
    path to the bytes served instead (a corrupted or substituted file)."""

    def __init__(self, repo: str, commit: str, folder: Path, tamper: dict[str, bytes] | None = None):
        self.repo, self.commit = repo, commit
        self.files = {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
        self.files.update(tamper or {})
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HubStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def count(self, prefix: str = "") -> int:
        with self._lock:
            return sum(1 for _, path in self.requests if path.startswith(prefix))

    def _entry(self, path: str) -> dict:
        data = self.files[path]
        entry = {"type": "file", "path": path, "size": len(data), "oid": git_blob_id(data)}
        if path.endswith(".safetensors"):  # stored in LFS on the Hub: the etag is the sha256
            entry["lfs"] = {"size": len(data), "oid": hashlib.sha256(data).hexdigest(), "pointerSize": 134}
        return entry

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def _send(self, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False) -> None:
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _json(self, value) -> None:
                self._send(200, json.dumps(value).encode(), {"Content-Type": "application/json"})

            def _route(self, head: bool) -> None:
                path = unquote(urlparse(self.path).path)
                with hub._lock:
                    hub.requests.append((self.command, path))
                api = f"/api/models/{hub.repo}/"
                if path.startswith(api + "tree/"):
                    rest = path[len(api + "tree/"):]
                    if rest.split("/")[0] not in (hub.commit, "main"):
                        return self._send(404, b'{"error": "Revision Not Found"}',
                                          {"X-Error-Code": "RevisionNotFound"})
                    return self._json([hub._entry(p) for p in hub.files])
                if path.startswith(api + "revision/"):
                    return self._json({"id": hub.repo, "sha": hub.commit,
                                       "siblings": [{"rfilename": p} for p in hub.files]})
                resolve = f"/{hub.repo}/resolve/"
                if path.startswith(resolve):
                    revision, _, rel = path[len(resolve):].partition("/")
                    if revision not in (hub.commit, "main") or rel not in hub.files:
                        return self._send(404, b"", {"X-Error-Code": "EntryNotFound"}, head)
                    entry = hub._entry(rel)
                    etag = entry["lfs"]["oid"] if "lfs" in entry else entry["oid"]
                    data = hub.files[rel]
                    return self._send(200, data, {"X-Repo-Commit": hub.commit, "ETag": f'"{etag}"',
                                                  "X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(len(data))},
                                      head)
                return self._send(404, b'{"error": "Repository Not Found"}', {"X-Error-Code": "RepoNotFound"}, head)

            def do_GET(self) -> None:  # noqa: N802
                self._route(head=False)

            def do_HEAD(self) -> None:  # noqa: N802
                self._route(head=True)

        return Handler
