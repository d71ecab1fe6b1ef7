"""llama-server's `/infill`: code completion as the llama.vscode and llama.vim plugins ask for
it, a converter onto the one generate path with the model's own FIM prompt (app/chat_formats/fim.py).

It takes `input_prefix`, `input_suffix`, `input_extra` (other files: `filename`, `text`),
`prompt` (text after the middle mark), `n_predict`, `stream`, `stop`, `temperature`,
`top_k`, `top_p`, `min_p`, `seed`, `logit_bias` (`[[id, bias], …]` or `{"id": bias}`;
false bans), `grammar`, `n_indent` (a line after the first indented less ends the
completion before it), `t_max_predict_ms` (past it, the completion ends at its first
newline), `ignore_eos`, and `model` (ours: which model; the loaded one else).
The answer is llama-server's: `content`, `stop`, `tokens_predicted`, `tokens_evaluated`,
`tokens_cached`, `timings`; streamed, SSE lines of `content` then the one with `stop: true`.
A request whose client hangs up is cancelled at once, streamed or not.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Optional, Union

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import Field

from localinfer.api import core
from localinfer.api.errors import ApiError
from localinfer.api.metrics import observe
from localinfer.backends.base import DoneEvent, ErrorEvent, RequestStats, SamplingParams
from localinfer.chat_formats.fim import Infill

__all__ = ["router"]

router = APIRouter(tags=["infill"])


class ExtraChunk(core.Lenient):
    filename: str = Field("", max_length=1024)
    text: str = ""


class InfillRequest(core.Lenient):
    model: Optional[str] = Field(None, max_length=200)
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[ExtraChunk] = Field(default_factory=list, max_length=1024)
    prompt: str = ""
    n_predict: int = Field(-1, ge=-1)
    stream: bool = False
    stop: Union[str, list[str], None] = None
    temperature: float = core.sampling_field("temperature", 0.8)
    top_k: int = core.sampling_field("top_k", 40)
    top_p: float = core.sampling_field("top_p", 0.95)
    min_p: float = core.sampling_field("min_p", 0.05)
    seed: Optional[int] = core.sampling_field("seed", None)
    logit_bias: Union[list[list[Union[int, float, bool]]], dict[str, Union[float, bool]],
                      None] = Field(None, max_length=1024)
    grammar: Optional[str] = Field(None, max_length=512 * 1024)
    n_indent: int = Field(0, ge=0, le=1024)
    t_max_predict_ms: int = Field(0, ge=0)
    ignore_eos: bool = False

    def params(self) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                              min_p=self.min_p, seed=self.seed,
                              max_tokens=self.n_predict if self.n_predict > 0 else None,
                              stop=tuple(stop), logit_bias=self._bias(), grammar=self.grammar,
                              min_indent=self.n_indent,
                              line_time_limit=self.t_max_predict_ms / 1000 or None,
                              ignore_eos=self.ignore_eos)

    def _bias(self) -> dict[int, float]:
        """llama-server's two shapes; a bias of false bans the token."""
        pairs = (list(self.logit_bias.items()) if isinstance(self.logit_bias, dict)
                 else self.logit_bias or [])
        bias = {}
        for pair in pairs:
            if len(pair) != 2:
                raise ApiError(400, "logit_bias takes [token id, bias] pairs")
            token, value = pair
            if isinstance(token, bool) or not str(token).lstrip("-").isdigit():
                raise ApiError(400, "logit_bias takes token ids")
            bias[int(token)] = -100.0 if value is False else float(value)
        return bias

    def infill(self) -> Infill:
        return Infill(self.input_prefix, self.input_suffix,
                      tuple((c.filename, c.text) for c in self.input_extra), self.prompt)


def _stop_type(stats: RequestStats) -> str:
    if stats.finish_reason == "length":
        return "limit"
    return "word" if stats.stop_string is not None else "eos"


def _final(job: core.Job, stats: RequestStats, content: str) -> dict[str, Any]:
    """llama-server's closing fields, with its names for the timings."""
    figures = stats.figures()
    return {"content": content, "stop": True, "model": job.model.name,
            "tokens_predicted": stats.generated_tokens, "tokens_evaluated": job.prompt_tokens,
            "tokens_cached": stats.cached_tokens, "stop_type": _stop_type(stats),
            "stopping_word": stats.stop_string or "", "truncated": False,
            # llama-server's meanings win where the names meet: prompt_n is what was read
            "timings": {**figures.to_timings(),
                        "prompt_n": job.prompt_tokens - stats.cached_tokens,
                        "cache_n": stats.cached_tokens,
                        "prompt_ms": (figures.prefill_s or 0) * 1000,
                        "prompt_per_second": figures.prefill_tps,
                        "predicted_n": stats.generated_tokens,
                        "predicted_ms": (figures.decode_s or 0) * 1000,
                        "predicted_per_second": figures.decode_tps}}


@router.post("/infill")
async def infill(body: InfillRequest, request: Request):
    job = await core.start(request.app.state.pool, body.model, body.params(),
                           infill=body.infill())
    if body.stream:
        return StreamingResponse(_stream(job), media_type="text/event-stream")
    collected = await core.unless_gone(request, job.collect())
    if collected is None:
        return Response(status_code=499)  # (nobody reads it: the client has gone)
    text, stats = collected
    observe(job, stats)
    return _final(job, stats, text)


async def _stream(job: core.Job) -> AsyncIterator[str]:
    async for event in job.events():
        if isinstance(event, ErrorEvent):
            yield core.sse({"error": {"message": str(event.error), "type": "server_error"}})
            return
        if isinstance(event, DoneEvent):
            observe(job, event.stats)
            yield core.sse(_final(job, event.stats, ""))
            return
        if event.text:
            yield core.sse({"content": event.text, "stop": False})
