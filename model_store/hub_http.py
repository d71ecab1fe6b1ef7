"""The one HTTP client the hub is asked through, and what its failures mean.

One `httpx.Client` for the process: the listing, the header reads and the downloads reuse its
connections (a pull is several requests to one host), and it takes its proxies from the
environment as curl does (HTTPS_PROXY, HTTP_PROXY, ALL_PROXY, NO_PROXY: httpx's `trust_env`).
The requests carry the user's hub token, as huggingface_hub finds it (HF_TOKEN, or the file
`hf auth login` wrote), and say they come from localinfer; huggingface_hub's own header builder
is not used, for it asks the hub for a registry of its own (telemetry) on a client of its own.
Every call has a timeout. A GET whose answer is read whole (`get`) is tried again, with a
growing pause, when the connection fails or the hub answers 429 or 5xx; a download's stream
is retried by its caller, which resumes it from the bytes it has (hub.download).
"""

from __future__ import annotations

import os
import re
import threading
import time

import httpx
from huggingface_hub import constants, get_token

from localinfer import __version__

__all__ = ["RETRY_STATUS", "TIMEOUT", "TRANSIENT", "client", "get", "headers", "retry_after",
           "unreachable"]

TIMEOUT = httpx.Timeout(30, connect=5)
_TRIES = 3  # a GET's tries in all; the pauses between them 0.5 s, then 1 s (or Retry-After)
_MAX_PAUSE = 8.0
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
# worth another try: the connection refused, reset or cut, a read that timed out. Not a
# connect timeout: the host did not answer in 5 s, and the user waits 5 s more for each try
TRANSIENT = (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.ReadTimeout,
             httpx.RemoteProtocolError)

_lock = threading.Lock()
_client: httpx.Client | None = None


def client() -> httpx.Client:
    """The process's hub client, made on first use (the environment's proxies read then)."""
    global _client
    with _lock:
        if _client is None:
            _client = httpx.Client(follow_redirects=True, timeout=TIMEOUT, trust_env=True,
                                   limits=httpx.Limits(max_keepalive_connections=8))
        return _client


def _forget_in_child() -> None:
    """A forked child must not write to its parent's sockets: it makes its own client."""
    global _client, _lock
    _client, _lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)


def headers() -> dict[str, str]:
    """Who asks, and the user's token for the hub if there is one (read at each call)."""
    token = get_token()
    mine = {"User-Agent": f"localinfer/{__version__}"}
    return {**mine, "Authorization": f"Bearer {token}"} if token else mine


def get(url: str, headers: dict[str, str], params: dict[str, str] | None = None,
        sleep=time.sleep) -> httpx.Response:
    """GET `url` and read the answer whole; a failed connection, 429 or 5xx tried again up to
    `_TRIES` times in all. The last answer is returned whatever its status (the caller says
    what a status means); the last transport error is raised."""
    for attempt in range(1, _TRIES):
        try:
            response = client().get(url, headers=headers, params=params)
        except TRANSIENT:
            sleep(_pause(attempt))
            continue
        if response.status_code not in RETRY_STATUS:
            return response
        sleep(retry_after(response) or _pause(attempt))
    return client().get(url, headers=headers, params=params)  # the last try, as it comes


def _pause(attempt: int) -> float:
    return min(0.5 * 2 ** (attempt - 1), _MAX_PAUSE)


def retry_after(response: httpx.Response) -> float | None:
    """The pause a 429 or 503 asks for, in seconds (capped), if it asks in seconds."""
    value = response.headers.get("Retry-After", "")
    return min(float(value), _MAX_PAUSE) if value.isdigit() else None


def unreachable(exc: httpx.TransportError) -> str:
    """The one line for a hub that could not be reached: what failed, and where to look."""
    cause = re.sub(r"^\[Errno -?\d+\] ", "", str(exc).splitlines()[0] if str(exc) else "")
    proxy = any(os.environ.get(name) for name in
                ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY",
                 "all_proxy"))
    where = "network, HF_ENDPOINT or the proxy (HTTPS_PROXY)" if proxy else "network or HF_ENDPOINT"
    return (f"cannot reach {constants.ENDPOINT} ({cause or type(exc).__name__}) — check the "
            f"{where}; installed models still work")
