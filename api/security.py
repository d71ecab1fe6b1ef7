"""The server's guard, in front of every route: Host check, API key, body limit, request count.

- Host: a browser page on another site can reach 127.0.0.1 through DNS rebinding, but its
  requests carry that site's name in Host; only loopback names (and those configured) pass.
  Host and Origin are read as URLs read them (`127.0.0.1:1@evil.example` names evil.example,
  and is refused: neither header has a user part), and a request with two Hosts or two
  Origins is refused (RFC 9112: a 400), not judged by one of them.
- Origin: a page on another site can also post to 127.0.0.1 directly — a "simple" request
  (text/plain body, no preflight), which the browser sends before CORS can say no. Browsers
  name the page's origin in Origin, so a request that carries one passes only from a
  loopback page or an origin given with --allow-origin; programs send none and pass.
- API key: when one is set, every route but `/` and `/health` needs `Authorization: Bearer`.
- Body: refused past the limit, by Content-Length or by counting a chunked body; and past
  `MAX_OBJECTS` JSON objects, which cost the event loop ~5 µs each to validate — a body of
  100,000 tiny messages held every stream for half a second. Counting `{` costs a
  millisecond per MB; only a body with more of them than the limit is parsed to count
  its objects exactly (braces inside strings are text, not objects).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import re
from collections.abc import Iterable

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from localinfer.api.errors import error_body
from localinfer.api.metrics import REQUESTS

__all__ = ["Guard"]

_OPEN_PATHS = {"/", "/health"}


def _open(path: str) -> bool:
    """Paths without an API key: liveness, and the web app's own files (no secrets in
    them; the page then calls the API with the key)."""
    return path in _OPEN_PATHS or path.startswith("/ui/")


def is_loopback(host: str) -> bool:
    """Whether a Host header's or an origin's name is this machine: localhost, a name under
    .localhost (browsers resolve those to loopback themselves), or a loopback address."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# a Host header, or an origin after its scheme: a name, an IPv4 address or a bracketed IPv6
# one, and a port; nothing else (a user part, a path) — what a browser or a client sends
_AUTHORITY = re.compile(r"(\[[0-9a-f:.]+\]|[a-z0-9_.-]+)(?::[0-9]{1,5})?")


def _hostname(authority: str) -> str | None:
    """The host of `authority` ("name", "name:port", "[::1]:port"); None where it is no
    such thing (a user part, a path, spaces, an empty name): never guessed at."""
    match = _AUTHORITY.fullmatch(authority.lower())
    return match[1].strip("[]") if match else None


MAX_OBJECTS = 20_000


class _BodyTooLarge(HTTPException):
    """An HTTPException, so the routes' own handler answers it in the dialect's shape."""

    def __init__(self, message: str):
        super().__init__(413, message)


class _TooManyObjects(ValueError):
    pass


def _objects_over(body: bytes, limit: int) -> bool:
    """Whether the JSON `body` holds more than `limit` objects; parsing stops at the first
    one past it. A body that is not JSON is left to the route to refuse."""
    count = 0

    def counted(pairs: list) -> dict:
        nonlocal count
        count += 1
        if count > limit:
            raise _TooManyObjects
        return {}

    try:
        json.loads(body, object_pairs_hook=counted)
    except _TooManyObjects:
        return True
    except (ValueError, RecursionError):
        return False
    return False


class Guard:
    def __init__(self, app: ASGIApp, *, allowed_hosts: Iterable[str] = (), api_key: str | None = None,
                 max_body_bytes: int = 8 * 1024 * 1024, allowed_origins: Iterable[str] = ()):
        self.app = app
        self.allowed_hosts = {h.lower() for h in allowed_hosts}
        self.allowed_origins = {o.rstrip("/").lower() for o in allowed_origins}
        self.api_key = api_key or None
        self.max_body = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = {"code": 500, "started": False}

        async def counted_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"], status["started"] = message["status"], True
            await send(message)

        try:
            refusal = self._refusal(scope)
            if refusal:
                await _reply(scope, counted_send, *refusal)
                return
            _read_as_json(scope)
            await self.app(scope, self._limited(receive), counted_send)
        except _BodyTooLarge as refused:
            if not status["started"]:
                await _reply(scope, counted_send, 413, refused.detail)
        finally:
            route = scope.get("route")
            REQUESTS.labels(getattr(route, "path", "unmatched"), scope["method"],
                            str(status["code"])).inc()

    def _refusal(self, scope: Scope) -> tuple[int, str] | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        for name in ("host", "origin"):
            count = sum(k.lower() == name.encode() for k, _ in scope["headers"])
            if count > 1:  # which one a proxy or a browser meant is anyone's guess
                return 400, f"the request has {count} {name.title()} headers — send one"
        host = headers.get("host")
        if host is not None and not self._host_ok(_hostname(host)):
            return 403, (f"Host '{host[:100]}' is not allowed — add it with --allow-host "
                         f"if this server should answer to that name")
        origin = headers.get("origin")
        if origin is not None and not self._origin_ok(origin):
            return 403, (f"requests from pages at '{origin[:100]}' are not allowed — start the "
                         f"server with --allow-origin {origin[:100]} to let that site use it")
        if self.api_key and not _open(scope["path"]):
            given = headers.get("authorization", "")
            # (Anthropic's clients send theirs as x-api-key)
            keyed = headers.get("x-api-key")
            if not (hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode())
                    or keyed is not None and hmac.compare_digest(keyed.encode(),
                                                                 self.api_key.encode())):
                return 401, "missing or wrong API key — send 'Authorization: Bearer <key>'"
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body:
            return 413, self._too_large()
        return None

    def _origin_ok(self, origin: str) -> bool:
        origin = origin.strip().rstrip("/").lower()
        if "*" in self.allowed_origins or origin in self.allowed_origins:
            return True
        scheme, _, rest = origin.partition("://")
        host = _hostname(rest)
        return scheme in ("http", "https") and host is not None and is_loopback(host)

    def _host_ok(self, host: str | None) -> bool:
        if "*" in self.allowed_hosts:
            return True
        return host is not None and (host in self.allowed_hosts or is_loopback(host))

    def _too_large(self) -> str:
        return f"request body is larger than {self.max_body} bytes"

    def _limited(self, receive: Receive) -> Receive:
        seen = braces = 0
        chunks: list[bytes] = []

        async def wrapped() -> Message:
            nonlocal seen, braces
            message = await receive()
            if message["type"] == "http.request":
                chunk = message.get("body", b"")
                seen += len(chunk)
                if seen > self.max_body:
                    raise _BodyTooLarge(self._too_large())
                braces += chunk.count(b"{")
                chunks.append(chunk)
                if (not message.get("more_body", False) and braces > MAX_OBJECTS
                        and _objects_over(b"".join(chunks), MAX_OBJECTS)):
                    raise _BodyTooLarge(f"request body holds more than {MAX_OBJECTS} JSON "
                                        f"objects — send fewer messages or content parts")
            return message

        return wrapped


def _read_as_json(scope: Scope) -> None:
    """Read every API body as JSON whatever its Content-Type, as Ollama does: the usual
    `curl -d '{...}'` sends application/x-www-form-urlencoded. In place: the router
    writes the matched route into this same scope, and the request counter reads it."""
    if scope["path"].startswith(("/api/", "/v1/")):
        headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]
        scope["headers"] = [*headers, (b"content-type", b"application/json")]


async def _reply(scope: Scope, send: Send, status: int, message: str) -> None:
    data = json.dumps(error_body(scope["path"], status, message)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})
