"""A Hugging Face hub on a loopback port, for tests of the real hub client code (no network).

It answers the three requests a transformers load makes: the repository listing
(``GET /api/models/<repo>[?blobs=true]``: commit and every file with its size) and a file's HEAD and
GET (``/<repo>/resolve/<revision>/<file>``, with the commit and ETag headers the client checks).
Every request is logged, so a test can say which files were downloaded.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/([^?]+)")
_LISTING = re.compile(r"^/api/models/([^/?]+/[^/?]+)")


class FakeHub:
    """``repos``: repo id -> {file name: bytes}. ``listed_sizes``: repo id -> {file name: size the listing
    gives (None: no size)}, for files whose listed size should differ from their bytes."""

    def __init__(self, repos: dict[str, dict[str, bytes]], listed_sizes: dict[str, dict] | None = None):
        self.repos, self.listed_sizes, self.log = repos, listed_sizes or {}, []
        self.commits = {repo: hashlib.sha1(repo.encode()).hexdigest() for repo in repos}
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _send(self, code: int, body: bytes = b"", headers: dict | None = None) -> None:
                self.send_response(code)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_GET(self) -> None:
                hub.log.append((self.command, self.path))
                found = _RESOLVE.match(self.path)
                if found and found.group(1) in hub.repos:
                    repo, name = found.group(1), found.group(3)
                    commit = {"X-Repo-Commit": hub.commits[repo]}
                    if name not in hub.repos[repo]:
                        return self._send(404, headers={"X-Error-Code": "EntryNotFound", **commit})
                    body = hub.repos[repo][name]
                    return self._send(200, body, {**commit, "ETag": f'"{hashlib.sha256(body).hexdigest()}"'})
                found = _LISTING.match(self.path)
                if found and found.group(1) in hub.repos:
                    repo = found.group(1)
                    sizes = hub.listed_sizes.get(repo, {})
                    siblings = [{"rfilename": name, "size": sizes.get(name, len(body))}
                                for name, body in hub.repos[repo].items()]
                    body = json.dumps({"id": repo, "sha": hub.commits[repo], "siblings": siblings}).encode()
                    return self._send(200, body, {"Content-Type": "application/json"})
                return self._send(404, headers={"X-Error-Code": "RepoNotFound"})

            do_HEAD = do_POST = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def downloaded(self, repo: str, upto: int | None = None) -> list[str]:
        """Files of ``repo`` fetched with GET, in order (among the first ``upto`` requests logged)."""
        found = [_RESOLVE.match(path) for method, path in self.log[:upto] if method == "GET"]
        return [match.group(3) for match in found if match and match.group(1) == repo]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
