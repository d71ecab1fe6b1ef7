"""The FastAPI application: both dialects, health, metrics, and the guard in front."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from localinfer import __version__
from localinfer.api import anthropic, infill, ollama, openai, rerank, responses
from localinfer.api.errors import install_handlers
from localinfer.api.metrics import render, track_pool
from localinfer.api.security import Guard
from localinfer.errors import EngineClosed, LocalinferError
from localinfer.installed import installed_models
from localinfer.pool import LoadedModel, ModelPool
from localinfer import web
from localinfer.settings import Settings

__all__ = ["create_app"]

log = logging.getLogger("localinfer.api")


def create_app(pool: ModelPool, settings: Settings,
               preload: tuple[str, asyncio.Task[LoadedModel]] | None = None) -> FastAPI:
    """preload: the model served from the start, by name, and its load, begun by the caller
    before the app is built (api/server.py). /health says 503 until that load ends."""
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool.start()
        if preload is not None:
            name, app.state.preloading = preload
            app.state.preloading.add_done_callback(lambda done: _preloaded(app, name, done))
        else:
            app.state.ready = True
        yield
        await pool.close()

    app = FastAPI(title="localinfer", version=__version__, lifespan=lifespan,
                  description="OpenAI- and Ollama-compatible API over local models.")
    app.state.pool = pool
    app.state.settings = settings
    app.state.ready = False
    app.state.log = log
    app.state.catalog = lambda: _catalog(pool, settings)
    install_handlers(app)
    app.include_router(openai.router)
    app.include_router(anthropic.router)
    app.include_router(responses.router)
    app.include_router(infill.router)
    app.include_router(rerank.router)
    app.include_router(ollama.router)
    app.include_router(ollama.root)
    web.install(app)
    track_pool(pool)

    @app.get("/health", tags=["operations"])
    async def health(request: Request) -> JSONResponse:
        """200 when the server answers requests; 503 while the startup model is loading."""
        body = {"status": "ok" if app.state.ready else "loading",
                "models_loaded": [m.name for m in pool.loaded()], "models_loading": pool.loading}
        return JSONResponse(body, status_code=200 if app.state.ready else 503)

    @app.get("/metrics", tags=["operations"])
    async def metrics() -> Response:
        # off the loop: each model's figures are asked of its runner
        return Response(await asyncio.to_thread(render), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(Guard, allowed_hosts=settings.allowed_hosts + [settings.host],
                       api_key=settings.api_key, max_body_bytes=settings.max_body_bytes,
                       allowed_origins=settings.allowed_origins)
    if settings.allowed_origins:  # outermost: a browser's preflight carries no API key
        app.add_middleware(CORSMiddleware, allow_origins=settings.allowed_origins,
                           allow_methods=["*"], allow_headers=["*"])
    return app


def _preloaded(app: FastAPI, name: str, task: asyncio.Task[LoadedModel]) -> None:
    """The startup model's load has ended: the server is ready, whatever came of it."""
    app.state.ready = True
    if task.cancelled():
        return
    error = task.exception()
    if error is None or isinstance(error, EngineClosed):  # (shut down before it was loaded)
        return
    if isinstance(error, LocalinferError):  # its own line says what to do
        log.error("could not load %s at startup: %s (requests will retry)", name, error)
    else:
        log.error("could not load %s at startup; requests will retry", name, exc_info=error)


def _catalog(pool: ModelPool, settings: Settings) -> list[str]:
    """What the server can run without downloading: embedded, pulled, loaded, aliased."""
    names = {m.name for m in installed_models(settings.models_dir)}
    names |= {m.name for m in pool.loaded()} | set(pool.aliases)
    return sorted(names)
