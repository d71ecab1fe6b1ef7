"""Errors as each dialect spells them, with the status code each kind deserves.

A prompt that does not fit the context is worded as each API words it, because agents
recover from it by that wording: Claude Code compacts its conversation on Anthropic's
"prompt is too long: N tokens > M maximum", Codex and the OpenAI SDKs read the code
`context_length_exceeded`."""

from __future__ import annotations

import errno

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from localinfer.errors import (
    Cancelled,
    ContextError,
    DiskFull,
    EngineBusy,
    EngineClosed,
    HubError,
    InvalidRequest,
    LocalinferError,
    ModelError,
    ModelFileMissing,
    ModelNotFound,
    PromptTooLong,
    RunnerDied,
    user_message,
)

__all__ = ["ApiError", "error_body", "error_response", "install_handlers", "status_for"]


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


def status_for(exc: LocalinferError) -> tuple[int, str]:
    if isinstance(exc, Cancelled):  # nobody reads it: the client went away
        return 499, "client_closed_request"
    if isinstance(exc, HubError):  # the hub could not be reached, or said no: not our fault
        return 502, "upstream_error"
    if isinstance(exc, DiskFull):
        return 507, "insufficient_storage"
    if isinstance(exc, (ModelNotFound, ModelFileMissing)):
        return 404, "not_found_error"
    if isinstance(exc, (InvalidRequest, ContextError)):
        return 400, "invalid_request_error"
    if isinstance(exc, (EngineBusy, EngineClosed, RunnerDied)):
        return 503, "server_busy"
    if isinstance(exc, ModelError):
        return 500, "model_error"
    return 500, "server_error"


def is_openai(request: Request) -> bool:
    return request.url.path.startswith("/v1/")


# Anthropic's error types by status (its clients raise by status and show the message)
_ANTHROPIC = {400: "invalid_request_error", 401: "authentication_error",
              403: "permission_error", 404: "not_found_error", 413: "request_too_large",
              429: "rate_limit_error", 503: "overloaded_error"}
# OpenAI's error types for the guard's refusals, whoever answers them: the guard itself (a
# sized body too large) or a route (a chunked body found too large as it is read)
_OPENAI = {401: "authentication_error", 403: "permission_error", 413: "request_too_large"}


def error_body(path: str, status: int, message: str, kind: str | None = None,
               code: str | None = None, param: str | None = None) -> dict:
    """OpenAI: {"error": {"message", "type", "param", "code"}}; Anthropic (/v1/messages and
    its count_tokens): {"type": "error", "error": {"type", "message"}}; Ollama and the rest:
    {"error": "..."}. kind: OpenAI's error type, else the status's."""
    if path.startswith("/v1/messages"):
        return {"type": "error", "error": {"type": _ANTHROPIC.get(status, "api_error"),
                                           "message": message}}
    if path.startswith("/v1/"):
        kind = kind or _OPENAI.get(status, "invalid_request_error")
        return {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return {"error": message}


def error_response(request: Request, status: int, message: str, kind: str | None = None,
                   code: str | None = None, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(request.url.path, status, message, kind, code, param),
                        status_code=status)


def too_long_message(path: str, exc: PromptTooLong) -> tuple[str, str | None, str | None]:
    """A prompt past the context as the API at `path` words it: the message, and OpenAI's
    code and param."""
    n, limit = exc.n_prompt, exc.n_ctx
    if path.startswith("/v1/messages"):  # Anthropic's own words (Claude Code compacts on them)
        return f"prompt is too long: {n} tokens > {limit} maximum", None, None
    if path.startswith("/v1/responses"):
        return (f"Your input exceeds the context window of this model: {n} tokens > {limit}. "
                f"Please adjust your input and try again.", "context_length_exceeded", "input")
    if path.startswith("/v1/"):
        return (f"This model's maximum context length is {limit} tokens. However, your "
                f"{'messages' if 'chat' in path else 'prompt'} resulted in "
                f"{'at least ' if exc.at_least else ''}{n} tokens. Please reduce the length "
                f"of the {'messages' if 'chat' in path else 'prompt'}.",
                "context_length_exceeded", "messages" if "chat" in path else "prompt")
    if path.startswith("/api/"):  # Ollama's words, which its clients look for
        return (f"the input length exceeds the context length ({'at least ' * exc.at_least}"
                f"{n} tokens > {limit}) — raise options.num_ctx or shorten the input",
                None, None)
    return str(exc), None, None


def too_long(request: Request, exc: PromptTooLong) -> JSONResponse:
    message, code, param = too_long_message(request.url.path, exc)
    return error_response(request, 400, message, code=code, param=param)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        if err.get("type") == "json_invalid":  # (its "location" is a character offset)
            at = err.get("loc", ("body", "?"))[-1]
            why = (err.get("ctx") or {}).get("error") or err.get("msg")
            return f"the body is not valid JSON: {why} (at character {at})"
        if err.get("type") == "missing" and tuple(err.get("loc", ())) == ("body",):
            return "the body is empty — send a JSON object"
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{where}: {err.get('msg')}" if where else str(err.get("msg")))
    return "invalid request — " + "; ".join(parts)


def install_handlers(app) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(request, exc.status, exc.message, exc.kind)

    @app.exception_handler(LocalinferError)
    async def _domain_error(request: Request, exc: LocalinferError) -> JSONResponse:
        if isinstance(exc, PromptTooLong):
            return too_long(request, exc)
        status, kind = status_for(exc)
        return error_response(request, status, str(exc), kind)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(request, 400, _validation_message(exc))

    @app.exception_handler(UnicodeEncodeError)
    async def _not_unicode(request: Request, exc: UnicodeEncodeError) -> JSONResponse:
        # JSON may spell a lone surrogate ("\ud800"), which no UTF-8 text can hold
        return error_response(request, 400, "the request holds text that is not valid "
                                            f"Unicode ({exc.reason}) — send UTF-8 text")

    @app.exception_handler(OSError)
    async def _disk(request: Request, exc: OSError) -> JSONResponse:
        if not exc.filename:  # not the disk's: a bug, logged as one
            return await _unexpected(request, exc)
        return error_response(request, 507 if exc.errno == errno.ENOSPC else 500,
                              user_message(exc), "server_error")

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        return error_response(request, exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        request.app.state.log.exception("unexpected error on %s", request.url.path)
        return error_response(request, 500, f"internal error: {type(exc).__name__}", "server_error")
