"""The web chat app: static files served by `localinfer serve` at `/`, and the one route the
page needs beyond the OpenAI and Ollama APIs — the model picker's rows with fit badges.

Everything the page loads ships in this package (no CDN). It calls the same API as any other
client; with an API key set (`localinfer app` makes one per launch) the page reads it from
the URL's fragment, which never reaches the server or its logs.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles

__all__ = ["STATIC", "install"]

STATIC = Path(__file__).parent / "static"
router = APIRouter(tags=["web app"])
# The page runs only its own files and talks only to its own server: a reply's Markdown
# image pointing elsewhere is not fetched (it would send whatever its URL carries, with no
# click), and no other site may frame the page or receive a form from it.
PAGE_HEADERS = {
    "Cache-Control": "no-cache",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; "
                               "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


@router.get("/", include_in_schema=False)
async def index(request: Request) -> Response:
    """The chat page for a browser; for any other client, the line Ollama's root gives."""
    if "text/html" not in request.headers.get("accept", ""):
        return Response("localinfer is running", media_type="text/plain")
    return FileResponse(STATIC / "index.html", headers=PAGE_HEADERS)


@router.get("/localinfer/models")
async def models(request: Request) -> dict[str, Any]:
    """Installed models with the planner's fit badge for this machine, then catalog models
    with an estimate; `loaded` names those in memory now."""
    from localinfer.model_rows import local_rows

    pool, settings = request.app.state.pool, request.app.state.settings
    n_ctx = pool.options.n_ctx or settings.ctx
    rows = await asyncio.to_thread(local_rows, settings, pool.hardware(), n_ctx)
    return {"models": [dataclasses.asdict(r) for r in rows],
            "loaded": [m.name for m in pool.loaded()], "default": pool.default
            or settings.default_model}


class _PageFiles(StaticFiles):
    """The page's files, each with the page's headers: /ui/index.html is the page as well."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers.update(PAGE_HEADERS)
        return response


def install(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/ui", _PageFiles(directory=STATIC), name="ui")
