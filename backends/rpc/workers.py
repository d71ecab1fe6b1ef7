"""The link between a head and its RPC workers, in Python, in front of ggml's RPC server.

ggml's RPC server has no authentication, aborts or hangs its client on a network fault, and
serves one client at a time, so no byte reaches it before Python has checked the peer. A
worker listens with `WorkerFront`; ggml's server listens on a loopback port behind it. Every
connection starts with a few JSON lines:

    worker → {"localinfer_worker": 1, "nonce": "<hex>", "key": true|false}
    head   → {"want": "info"|"relay", "proof": hex(HMAC-SHA256(key, nonce)) | null,
              "session": "<hex>" | null}
    worker → {"info": {...}} and closes, or {"relay": true} and from then on carries bytes
             between the head and ggml's server, or {"error": "..."} and closes.

A worker holds one head's model at a time: while a relay is open, only connections of the
same session (the head's tunnel: ggml's client reconnects between steps of a load) are
relayed; others hear "busy".

`probe` asks for the info with timeouts (a worker down, busy or of another llama.cpp is one
line, never an abort); a `Tunnel` on the head's loopback is what ggml's RPC client connects
to: it opens the relay with the key and carries the bytes. The key keeps strangers from
using a worker; nothing here encrypts the traffic (run workers on a network you trust, or
through an SSH tunnel or a VPN).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from localinfer.errors import LocalinferError

__all__ = ["DEFAULT_PORT", "RemoteDevice", "Tunnel", "WorkerFront", "WorkerInfo", "WorkerUnusable",
           "parse_endpoint", "probe"]

DEFAULT_PORT = 50052  # llama.cpp's rpc-server's
_LINE_MAX = 64 * 1024  # a preamble line longer than this is not ours
_PREAMBLE_TIMEOUT = 5.0
_MAX_GREETING = 16  # connections still in their preamble at once; more are dropped
_CHUNK = 1 << 20
# this head (a server, or a `run`): its runners' tunnels carry it, so the head can tell a
# worker busy with one of its own models from one another head holds
HEAD = secrets.token_hex(8)


class WorkerUnusable(LocalinferError):
    """A worker that cannot be used now: down, busy, another version, or a refused key."""


@dataclass(frozen=True)
class RemoteDevice:
    name: str  # ggml's: "CPU", "CUDA0"
    description: str
    kind: str  # "cpu", "gpu"
    free_bytes: int  # a CPU's: the worker's available RAM (ggml would say its total)
    total_bytes: int


@dataclass(frozen=True)
class WorkerInfo:
    endpoint: str
    version: str  # llama-cpp-python's
    protocol: str  # ggml RPC's, "7.0.0"
    devices: tuple[RemoteDevice, ...]
    busy: str | None  # the head it is serving, if any (its address)
    busy_head: str | None = None  # and that head's id (`HEAD` where it is this one)

    def to_dict(self) -> dict:
        return {"endpoint": self.endpoint, "version": self.version, "protocol": self.protocol,
                "devices": [d.__dict__ for d in self.devices], "busy": self.busy}


def parse_endpoint(text: str) -> tuple[str, int]:
    """("host", port) from "host:port" (or "[v6]:port"; the port defaults to 50052)."""
    text = text.strip()
    host, sep, port = text.rpartition(":")
    if not sep or "]" in port:
        host, port = text, str(DEFAULT_PORT)
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise WorkerUnusable(f"'{text}' is not a worker address — write it as host:port, "
                             f"e.g. 192.168.1.20:{DEFAULT_PORT}")
    return host, int(port)


def _proof(key: str | None, nonce: str) -> str | None:
    if key is None:
        return None
    return hmac.new(key.encode(), nonce.encode(), hashlib.sha256).hexdigest()


def _send(sock: socket.socket, message: dict) -> None:
    sock.sendall(json.dumps(message).encode() + b"\n")


def _read_line(sock: socket.socket, buffer: bytearray) -> dict:
    """One JSON line; what follows it stays in `buffer`."""
    while b"\n" not in buffer:
        if len(buffer) > _LINE_MAX:
            raise ValueError("line too long")
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed")
        buffer += chunk
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    message = json.loads(line)
    if not isinstance(message, dict):
        raise ValueError("not an object")
    return message


def _open(endpoint: str, key: str | None, want: str, timeout: float,
          session: str | None = None) -> tuple[socket.socket, dict, bytearray]:
    """Connect, greet and ask; the worker's answer. Raises WorkerUnusable with what to do."""
    host, port = parse_endpoint(endpoint)
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise WorkerUnusable(f"worker {endpoint} is not answering ({exc.strerror or exc}) — "
                             f"start `localinfer worker` there, or leave it out of "
                             f"--workers") from None
    buffer = bytearray()
    try:
        hello = _read_line(sock, buffer)
        if hello.get("localinfer_worker") != 1:
            raise ValueError("not a worker")
        if hello.get("key") and key is None:
            raise WorkerUnusable(f"worker {endpoint} takes a key — set LOCALINFER_WORKER_KEY to "
                                 f"the key it was started with")
        _send(sock, {"want": want, "proof": _proof(key, str(hello.get("nonce", ""))),
                     "session": session})
        answer = _read_line(sock, buffer)
    except WorkerUnusable:
        sock.close()
        raise
    except (OSError, ValueError, ConnectionError):
        sock.close()
        raise WorkerUnusable(f"{endpoint} does not answer as a localinfer worker — run "
                             f"`localinfer worker` there (a bare llama.cpp rpc-server is not "
                             f"used: it has no key and aborts its client on a fault)") from None
    if "error" in answer:
        sock.close()
        raise WorkerUnusable(f"worker {endpoint}: {answer['error']}")
    return sock, answer, buffer


def probe(endpoint: str, key: str | None = None, timeout: float = 5.0) -> WorkerInfo:
    """What a worker offers, asked in Python with timeouts."""
    sock, answer, _ = _open(endpoint, key, "info", timeout)
    sock.close()
    try:
        info = answer["info"]
        devices = tuple(RemoteDevice(str(d["name"]), str(d["description"]), str(d["kind"]),
                                     int(d["free_bytes"]), int(d["total_bytes"]))
                        for d in info["devices"])
        return WorkerInfo(endpoint, str(info["version"]), str(info["protocol"]), devices,
                          info.get("busy"), info.get("busy_head"))
    except (KeyError, TypeError, ValueError):
        raise WorkerUnusable(f"worker {endpoint} sent an answer this version cannot read — "
                             f"run the same localinfer on both machines") from None


def check_usable(info: WorkerInfo, version: str, protocol: str) -> None:
    """Refuse a worker this head cannot drive, naming why."""
    if info.protocol != protocol or info.version != version:
        raise WorkerUnusable(f"worker {info.endpoint} runs llama.cpp RPC {info.protocol} "
                             f"(llama-cpp-python {info.version}); this machine {protocol} "
                             f"({version}) — install the same llama-cpp-python on both")
    if info.busy:
        raise WorkerUnusable(f"worker {info.endpoint} is busy serving {info.busy} — a worker "
                             f"serves one model of one head at a time")
    if not info.devices:
        raise WorkerUnusable(f"worker {info.endpoint} offers no device")


def _pump(source: socket.socket, sink: socket.socket, first: bytes = b"") -> None:
    """Carry bytes one way until either side closes; then close both ways."""
    try:
        if first:
            sink.sendall(first)
        while chunk := source.recv(_CHUNK):
            sink.sendall(chunk)
    except OSError:
        pass
    for sock in (source, sink):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _relay(a: socket.socket, b: socket.socket, a_first: bytes = b"") -> None:
    """Carry bytes both ways between a and b until one closes (blocks)."""
    for sock in (a, b):
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    back = threading.Thread(target=_pump, args=(b, a), daemon=True)
    back.start()
    _pump(a, b, a_first)
    back.join()
    a.close()
    b.close()


class WorkerFront:
    """A worker's public side: greets, checks the key, answers probes, and relays one head
    at a time to ggml's server on `ggml_port` (loopback)."""

    def __init__(self, host: str, port: int, ggml_port: int, key: str | None,
                 devices: Callable[[], list[dict]], version: str, protocol: str):
        self.ggml_port, self.key = ggml_port, key
        self.devices, self.version, self.protocol = devices, version, protocol
        self._serving: str | None = None  # the head whose model this worker holds
        self._session: str | None = None  # its tunnel's, shared by its connections
        self._connections = 0
        self._lock = threading.Lock()
        self._greeting = threading.BoundedSemaphore(_MAX_GREETING)
        self.sock = socket.create_server((host, port), reuse_port=False)

    @property
    def address(self) -> tuple[str, int]:
        return self.sock.getsockname()[:2]

    def serve_forever(self) -> None:
        while True:
            conn, peer = self.sock.accept()
            if not self._greeting.acquire(blocking=False):
                conn.close()  # a flood of half-open greetings: drop, keep serving the head
                continue
            threading.Thread(target=self._handle, args=(conn, peer), daemon=True).start()

    def _handle(self, conn: socket.socket, peer: tuple) -> None:
        relaying, greeting = False, True
        try:
            conn.settimeout(_PREAMBLE_TIMEOUT)
            nonce = secrets.token_hex(16)
            _send(conn, {"localinfer_worker": 1, "nonce": nonce, "key": self.key is not None})
            buffer = bytearray()
            ask = _read_line(conn, buffer)
            expected = _proof(self.key, nonce)
            if expected is not None and not hmac.compare_digest(str(ask.get("proof")), expected):
                time.sleep(0.5)  # (a guesser gets two tries a second per connection)
                _send(conn, {"error": "the key is wrong — set LOCALINFER_WORKER_KEY to the "
                                      "worker's key"})
                return
            if ask.get("want") == "info":
                head = self._session.partition(":")[0] if self._session else None
                _send(conn, {"info": {"version": self.version, "protocol": self.protocol,
                                      "devices": self.devices(), "busy": self._serving,
                                      "busy_head": head}})
                return
            if ask.get("want") != "relay":
                _send(conn, {"error": "unknown request"})
                return
            session = str(ask.get("session") or secrets.token_hex(8))
            with self._lock:  # one head's model at a time: its connections, one by one
                busy = self._serving is not None and self._session != session
                if not busy:
                    if self._serving is None:
                        self._serving, self._session = f"the head at {peer[0]}", session
                    self._connections += 1
            if busy:
                _send(conn, {"error": f"busy serving {self._serving} — a worker serves one "
                                      f"model of one head at a time"})
                return
            relaying = True
            ggml = socket.create_connection(("127.0.0.1", self.ggml_port), timeout=10)
            _send(conn, {"relay": True})
            greeting = False
            self._greeting.release()  # past its preamble: no longer counted as greeting
            _relay(conn, ggml, bytes(buffer))
        except (OSError, ValueError, ConnectionError):
            pass
        finally:
            if relaying:
                with self._lock:
                    self._connections -= 1
                    if not self._connections:
                        self._serving = self._session = None
            if greeting:
                self._greeting.release()
            conn.close()


class Tunnel:
    """The head's end: a loopback port ggml's RPC client connects to, each connection relayed
    to the worker with the key. Lives as long as the process (a runner's)."""

    def __init__(self, endpoint: str, key: str | None, timeout: float = 10.0,
                 head: str = HEAD):
        self.endpoint, self.key, self.timeout = endpoint, key, timeout
        # ggml reconnects: the worker knows it is us; and whose runner we are
        self.session = f"{head}:{secrets.token_hex(8)}"
        self.sock = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def local(self) -> str:
        return f"127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            conn, _ = self.sock.accept()
            threading.Thread(target=self._carry, args=(conn,), daemon=True).start()

    def _carry(self, conn: socket.socket) -> None:
        try:
            remote, _, rest = _open(self.endpoint, self.key, "relay", self.timeout,
                                    self.session)
        except WorkerUnusable:
            conn.close()  # ggml's client then fails: the runner ends, the server lives
            return
        conn.sendall(bytes(rest))  # (ggml's server speaks only when asked; nothing is here)
        _relay(conn, remote)
