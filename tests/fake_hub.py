"""A small Hugging Face hub over real HTTP on 127.0.0.1, for pulls without the internet.

Serves the routes huggingface_hub uses to list and download: the repo tree
(`/api/models/{repo}/tree/{rev}`) with LFS sha256 and sizes, and `/{repo}/resolve/{rev}/{file}`
(HEAD and GET) with the hub's headers (X-Repo-Commit, ETag = sha256, X-Linked-Size) and Range.
Faults can be injected per file: drop the connection after N bytes (once), serve bytes that
do not match the advertised hash, or send slowly (bytes a second), counting what was sent; and
for the whole hub: answer the next requests with given statuses (503, 429: busy for a moment).

`ForwardingProxy` is an HTTP proxy to put in front of it (HTTP_PROXY), counting the requests it
forwards and the client connections they came on.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class HubFile:
    path: Path
    sha256: str
    size: int
    drop_after: int | None = None  # cut the next GET after this many bytes, once
    corrupt: bool = False
    rate: float | None = None  # bytes a second, or as fast as it goes
    refuse: int | None = None  # answer every GET of the file with this status (403: gated)
    whole: bool = False  # ignore Range headers and send the whole file (some caches do)
    sent: int = 0  # bytes of this file written to clients, over all GETs


@dataclass
class FakeHub:
    repos: dict[str, dict[str, HubFile]] = field(default_factory=dict)
    gets: Counter = field(default_factory=Counter)  # (repo, file) → GETs that sent bytes
    ranges: list[str] = field(default_factory=list)
    busy: list[int] = field(default_factory=list)  # statuses for the next requests, in order
    url: str = ""
    _server: ThreadingHTTPServer | None = None

    def add(self, repo: str, name: str, path: Path) -> HubFile:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        entry = HubFile(path, digest, path.stat().st_size)
        self.repos.setdefault(repo, {})[name] = entry
        return entry

    def start(self) -> FakeHub:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                hub._route(self, send_body=True)

            def do_HEAD(self) -> None:
                hub._route(self, send_body=False)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    # ------------------------------------------------------------------ routes
    def _route(self, req: BaseHTTPRequestHandler, send_body: bool) -> None:
        if self.busy:
            return self._json(req, self.busy.pop(0), {"error": "busy"}, send_body,
                              {"Retry-After": "0"})
        path = req.path.split("?", 1)[0]
        tree = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/[^/]+/?", path)
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/[^/]+/(.+)", path)
        if tree:
            return self._tree(req, tree.group(1), send_body)
        if resolve:
            return self._file(req, resolve.group(1), resolve.group(2), send_body)
        self._json(req, 404, {"error": "Not Found"}, send_body)

    def _json(self, req, status: int, body, send_body: bool, headers: dict | None = None) -> None:
        data = json.dumps(body).encode()
        req.send_response(status)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            req.send_header(k, v)
        req.end_headers()
        if send_body:
            req.wfile.write(data)

    def _tree(self, req, repo: str, send_body: bool) -> None:
        if repo not in self.repos:
            return self._json(req, 404, {"error": "Repository not found"}, send_body,
                              {"X-Error-Code": "RepoNotFound"})
        entries = [{"type": "file", "oid": f.sha256[:40], "size": f.size, "path": name,
                    "lfs": {"oid": f.sha256, "size": f.size, "pointerSize": 134}}
                   for name, f in self.repos[repo].items()]
        entries.append({"type": "file", "oid": "1" * 40, "size": 12, "path": "README.md"})
        self._json(req, 200, entries, send_body)

    def _file(self, req, repo: str, name: str, send_body: bool) -> None:
        entry = self.repos.get(repo, {}).get(name)
        if entry is None:
            return self._json(req, 404, {"error": "Entry not found"}, send_body,
                              {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": COMMIT})
        if entry.refuse:
            return self._json(req, entry.refuse, {"error": "Access to this repo is restricted"},
                              send_body, {"X-Error-Code": "GatedRepo"})
        data = entry.path.read_bytes()
        if entry.corrupt:
            data = data[:1000] + bytes([data[1000] ^ 0xFF]) + data[1001:]
        start, end = 0, len(data) - 1
        rng = None if entry.whole else req.headers.get("Range")
        if rng:
            self.ranges.append(rng)
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng)
            start, end = int(m.group(1)), int(m.group(2) or end)
            end = min(end, len(data) - 1)
        req.send_response(206 if rng else 200)
        for k, v in {"X-Repo-Commit": COMMIT, "ETag": f'"{entry.sha256}"',
                     "X-Linked-Etag": f'"{entry.sha256}"', "X-Linked-Size": str(entry.size),
                     "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream",
                     "Content-Length": str(end - start + 1)}.items():
            req.send_header(k, v)
        if rng:
            req.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        req.end_headers()
        if not send_body:
            return
        body = data[start:end + 1]
        if entry.drop_after is not None and not rng:
            cut, entry.drop_after = entry.drop_after, None
            req.wfile.write(body[:cut])
            req.wfile.flush()
            req.close_connection = True
            return
        if start == 0 and end == len(data) - 1 or rng and start > 0:
            self.gets[(repo, name)] += 1
        piece = 256 * 1024 if entry.rate else max(1, len(body))
        for at in range(0, len(body), piece):
            try:
                req.wfile.write(body[at:at + piece])
            except (BrokenPipeError, ConnectionResetError):  # the client went away
                req.close_connection = True
                return
            entry.sent += len(body[at:at + piece])
            if entry.rate:
                time.sleep(piece / entry.rate)


_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authorization",
               "transfer-encoding", "te", "upgrade"}


@dataclass
class ForwardingProxy:
    """An HTTP proxy on 127.0.0.1: it forwards the absolute-URI GETs a client sends to its
    HTTP_PROXY, each on a fresh connection upstream, and counts them and the client
    connections they came on."""

    requests: int = 0
    connections: int = 0
    url: str = ""
    _server: ThreadingHTTPServer | None = None

    def start(self) -> ForwardingProxy:
        proxy, lock = self, threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def setup(self) -> None:
                super().setup()
                with lock:
                    proxy.connections += 1

            def do_GET(self) -> None:
                target = urlsplit(self.path)
                if target.scheme != "http":  # not a proxy request
                    self.send_error(400)
                    return
                with lock:
                    proxy.requests += 1
                upstream = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
                upstream.request("GET", target.path + (f"?{target.query}" if target.query else ""),
                                 headers={k: v for k, v in self.headers.items()
                                          if k.lower() not in _HOP_BY_HOP})
                answer = upstream.getresponse()
                self.send_response(answer.status, answer.reason)
                for key, value in answer.getheaders():
                    if key.lower() not in _HOP_BY_HOP | {"server", "date"}:
                        self.send_header(key, value)
                self.end_headers()
                while chunk := answer.read(256 * 1024):
                    self.wfile.write(chunk)
                upstream.close()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
