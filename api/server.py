"""`localinfer serve`: bind first (so a busy port is one clear line), then run uvicorn.

The served model starts loading before FastAPI is imported: the event loop runs from the
start, the load begins on it, and the app is built on a thread meanwhile (~0.8 s of imports
on a 2-core machine, which the model's runner spends loading it).
"""

from __future__ import annotations

import asyncio
import errno
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from types import FrameType
from typing import Any

import uvicorn

from localinfer.backends.base import LoadOptions
from localinfer.errors import LocalinferError
from localinfer.pool import LoadedModel, ModelPool, parse_keep_alive
from localinfer.service import prepare
from localinfer.settings import Settings, binds_loopback

__all__ = ["serve", "serve_in_thread"]


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        fix = {errno.EADDRINUSE: "pick another with --port",
               errno.EACCES: "pick one above 1023 with --port",
               errno.EADDRNOTAVAIL: "this machine has no such address: check --host"}
        raise LocalinferError(f"cannot listen on {host}:{port} ({exc.strerror}) — "
                              f"{fix.get(exc.errno, 'check --host and --port')}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _check_host(host: str) -> None:
    """A host that names no address is one line about the host, before the API key is asked
    for (it said to set a key for `garbage!!`, then that the name is unknown)."""
    if not host.strip():
        raise LocalinferError("--host is empty — give an address to listen on: 127.0.0.1 "
                              "(this machine only) or 0.0.0.0 (every network)")
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as exc:
        raise LocalinferError(f"cannot listen on {host!r}: it names no address "
                              f"({getattr(exc, 'strerror', None) or exc}) — check --host") from None


def serve(settings: Settings, options: LoadOptions, model: str | None,
          verbose: bool = False) -> None:
    pool, preload, sock = _prepare(settings, options, model)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    banner = (f"localinfer {'' if not model else model + ' '}serving on http://{shown}:{port} "
              f"— OpenAI API at /v1, Ollama API at /api")
    _run(_serve(pool, settings, preload, sock, verbose,
                lambda _: print(banner, file=sys.stderr, flush=True)))


def _run(main: Coroutine[Any, Any, None]) -> None:
    with asyncio.Runner(loop_factory=_new_loop) as runner:
        runner.run(main)


async def _serve(pool: ModelPool, settings: Settings, preload: str | None,
                 sock: socket.socket, verbose: bool, built: Callable[[_Server], None]) -> None:
    """The server on this thread's loop; `built` is called with it before it starts.

    The served model loads (in its runner) while this process imports FastAPI and builds
    the app. Until uvicorn takes them, SIGTERM stops the start as Ctrl-C does (asyncio's
    Runner cancels this task). However the start or the serving ends, every request and
    load is stopped and the pool closed: uvicorn's shutdown does that once its lifespan
    began, and this, again, for a server that ended before (a second close does nothing)."""
    loading = asyncio.create_task(pool.get(preload)) if preload else None
    if loading is not None:  # its error read even where the start stops before the app (whose
        # own callback logs it)
        loading.add_done_callback(lambda task: task.cancelled() or task.exception())
    terminated: list[int] = []
    stop = _stop_on_sigterm(asyncio.current_task(), terminated)
    try:
        server = await asyncio.to_thread(_server, pool, settings, verbose, preload, loading)
        stop()
        built(server)
        await server.serve(sockets=[sock])
    except asyncio.CancelledError:
        if not terminated:
            raise
    finally:
        stop()
        pool.cancel_all()
        await pool.close()
    if terminated:  # the process ends by the signal it was sent, as uvicorn ends it
        signal.raise_signal(signal.SIGTERM)


def _stop_on_sigterm(task: asyncio.Task | None, terminated: list[int]) -> Callable[[], None]:
    """SIGTERM cancels `task` and is noted in `terminated` (on the main thread; asyncio's
    Runner does the same for Ctrl-C); the returned call undoes it (before uvicorn installs
    its own handlers, and before the signal is raised again)."""
    loop = asyncio.get_running_loop()
    if task is None or threading.current_thread() is not threading.main_thread():
        return lambda: None

    def terminate() -> None:
        terminated.append(signal.SIGTERM)
        task.cancel()

    try:
        loop.add_signal_handler(signal.SIGTERM, terminate)
    except (NotImplementedError, RuntimeError, ValueError):  # (not on Windows' loop)
        return lambda: None
    return lambda: loop.remove_signal_handler(signal.SIGTERM)


def _new_loop() -> asyncio.AbstractEventLoop:
    """The event loop uvicorn's own `run` makes: uvloop's where it is installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def serve_in_thread(settings: Settings, options: LoadOptions, model: str | None,
                    verbose: bool = False) -> tuple[str, _Server, threading.Thread]:
    """The same server on a thread of this process (`localinfer app`): its URL, the server
    (set `should_exit` to stop it) and the thread. Returns once it answers."""
    pool, preload, sock = _prepare(settings, options, model)
    host, port = sock.getsockname()[:2]
    made: list[_Server] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            _run(_serve(pool, settings, preload, sock, verbose, made.append))
        except BaseException as exc:  # noqa: BLE001 - the caller raises it
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True, name="localinfer-server")
    thread.start()
    while not (made and made[0].started) and thread.is_alive():
        time.sleep(0.02)
    if not thread.is_alive():
        if failed and isinstance(failed[0], LocalinferError):
            raise failed[0]
        raise LocalinferError("the server stopped as it started — run with --verbose to see "
                              "why") from (failed[0] if failed else None)
    return f"http://{host}:{port}", made[0], thread


def _prepare(settings: Settings, options: LoadOptions, model: str | None
             ) -> tuple[ModelPool, str | None, socket.socket]:
    """The checks, the pool, the name the model to serve is loaded by, and the socket."""
    if settings.api_key is not None and not settings.api_key.strip():
        raise LocalinferError("the API key is blank — anyone could send it; choose one "
                              "(e.g. `openssl rand -hex 16`)")
    _check_host(settings.host)
    if not binds_loopback(settings.host) and not settings.api_key:
        raise LocalinferError(
            f"listening on {settings.host} would expose your models to the network — "
            f"set an API key with --api-key or LOCALINFER_API_KEY first")
    pool = ModelPool(settings, options, max_loaded=settings.max_loaded_models,
                     default_keep_alive=parse_keep_alive(settings.keep_alive, None))
    preload = model
    if model:  # a missing model, or a context it cannot take, is one clear line now,
        # not a failed preload and a server whose every request fails
        resolved = prepare(model, options, settings, hardware=pool.hardware).model  # probed once
        if resolved.source == "path":  # requests name it by its alias; so does the preload
            pool.alias(resolved.name, model)
            preload = resolved.name
    pool.default = preload  # a request that names no model gets the one being served
    return pool, preload, _bind(settings.host, settings.port)


def _server(pool: ModelPool, settings: Settings, verbose: bool, preload: str | None,
            loading: asyncio.Task[LoadedModel] | None) -> _Server:
    """uvicorn's server of the app (`loading`: the load of `preload`, the model served)."""
    from localinfer.api.asgi import create_app  # FastAPI

    app = create_app(pool, settings, None if loading is None else (preload, loading))
    config = uvicorn.Config(app, log_level="info" if verbose else "warning",
                            timeout_graceful_shutdown=5, access_log=verbose,
                            http=_http_protocol(settings.header_timeout,
                                                settings.body_timeout))
    return _Server(config, on_exit=pool.cancel_all)


def _http_protocol(header_timeout: float, body_timeout: float) -> type[asyncio.Protocol] | str:
    """uvicorn's httptools protocol, which closes a connection whose request's headers have
    not all come within `header_timeout` seconds, or its body within `body_timeout` seconds
    after them. uvicorn has no such timer: 500 connections that sent their headers a byte at
    a time stayed open as long as their clients liked (with 1,024 file descriptors, a few more
    and the server could accept no one), and so did one that sent its body a byte a second."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # no httptools on this platform: uvicorn's own choice
        return "auto"

    class HeaderDeadline(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None

        def _arm(self, seconds: float = header_timeout) -> None:
            if self._deadline is None:
                self._deadline = self.loop.call_later(seconds, self._too_slow)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _too_slow(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_message_begin(self) -> None:  # the next request on a kept-alive connection
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            self._arm(body_timeout)  # until the body has come (at once, for one without)
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderDeadline


class _Server(uvicorn.Server):
    """On SIGTERM or Ctrl-C, running streams end at once with a proper last chunk (finish
    reason, [DONE]) and the server exits, instead of generating on through the grace period
    and then cutting every stream off mid-body."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]):
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit:
            self._on_exit()
        super().handle_exit(sig, frame)
