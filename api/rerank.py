"""Reranking, in the Jina / Cohere shape that llama-server serves (`/rerank`, `/reranking`,
`/v1/rerank`, `/v1/reranking`): what editors' and frameworks' retrieval calls (Continue,
LangChain, LlamaIndex, Open WebUI) to order the chunks it found by their relevance.

    {model, query, documents: [text | {text}], top_n?, return_documents?}
    → {id, model, object: "list", usage: {prompt_tokens, total_tokens},
       results: [{index, relevance_score, document?: {text}}]}   best first, top_n of them

Cohere's v2 (`/v2/rerank`, its SDK's ClientV2.rerank) is the same shape with `meta`, and
`max_tokens_per_doc` cuts each document to that many tokens before it is scored. Hugging
Face's text-embeddings-inference shape (`/rerank` with `texts`, as Haystack's TEI ranker sends
it) answers a list `[{index, score, text?}]`, best first, the scores through a sigmoid unless
`raw_scores` (TEI's own rule); `truncate` cuts a document to what the context leaves it.

Each document is scored with the query by a reranker model (backends/native/rerank.py); a model
that is not one is refused, as is a request past MAX_DOCUMENTS or a pair past the context
(before anything is scored). Ollama has no rerank route, so there is no Ollama shape.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from typing import Any, Optional, Union

from fastapi import APIRouter, Request
from pydantic import Field

from localinfer.api import core
from localinfer.api.errors import ApiError
from localinfer.pool import LoadedModel

__all__ = ["MAX_DOCUMENTS", "router"]

router = APIRouter(tags=["rerank"])

MAX_DOCUMENTS = 1000  # in one request (Cohere's own limit)


class Document(core.Lenient):
    text: str


class RerankRequest(core.Lenient):
    model: str = Field("", max_length=200)
    query: str
    documents: list[Union[str, Document]] = Field(min_length=1, max_length=MAX_DOCUMENTS)
    top_n: Optional[int] = Field(None, ge=1)
    return_documents: bool = False
    max_tokens_per_doc: Optional[int] = Field(None, ge=1)  # Cohere v2's

    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


class TeiRerankRequest(core.Lenient):
    """text-embeddings-inference's /rerank body."""

    model: str = Field("", max_length=200)  # (TEI serves one model; here: which, or the default)
    query: str
    texts: list[str] = Field(min_length=1, max_length=MAX_DOCUMENTS)
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool = False


def check_reranker(loaded: LoadedModel, path: str) -> None:
    """A 400 for a model that is not a reranker, worded as OpenAI words an endpoint a model
    does not serve."""
    if not loaded.info.rerank:
        endpoint = path.strip("/")
        raise ApiError(400, f"{loaded.name} is not a reranker and thus not supported in the "
                            f"{endpoint} endpoint — use a reranker GGUF (rank pooling or a "
                            f"classification head: bge-reranker-v2-m3, Qwen3-Reranker)")


async def _scores(request: Request, model: str, query: str, texts: list[str],
                  max_tokens: Optional[int] = None, fit: bool = False
                  ) -> tuple[LoadedModel, list[float], int]:
    """The reranker's score of each text with the query; each text first cut to `max_tokens`,
    or with `fit` to what the context leaves beside the query."""
    async with request.app.state.pool.use(core.check_model_name(model or None)) as loaded:
        check_reranker(loaded, request.url.path)
        backend = loaded.backend
        if fit:  # (the pair's template and special tokens: a few dozen at most)
            query_tokens = await asyncio.to_thread(backend.tokenize, query, add_special=False)
            room = (loaded.options.n_ctx or 0) - len(query_tokens)
            max_tokens = min(max_tokens or room, max(1, room - 64))
        if max_tokens:
            texts = await asyncio.to_thread(_cut, backend, texts, max_tokens)
        scores, n_tokens = await core.read_while_there(request, backend.rerank, query, texts)
    return loaded, scores, n_tokens


def _cut(backend: Any, texts: list[str], max_tokens: int) -> list[str]:
    out = []
    for text in texts:
        tokens = backend.tokenize(text, add_special=False)
        out.append(text if len(tokens) <= max_tokens else backend.detokenize(tokens[:max_tokens]))
    return out


@router.post("/rerank")
async def rerank_or_tei(body: Union[RerankRequest, TeiRerankRequest], request: Request) -> Any:
    """llama-server's /rerank, or text-embeddings-inference's where the body names `texts`."""
    if isinstance(body, TeiRerankRequest):
        return await tei_rerank(body, request)
    return await rerank(body, request)


async def tei_rerank(body: TeiRerankRequest, request: Request) -> list[dict[str, Any]]:
    _, scores, _ = await _scores(request, body.model, body.query, body.texts, fit=body.truncate)
    results = []
    for i in sorted(range(len(scores)), key=lambda i: -scores[i]):
        score = scores[i] if body.raw_scores else _sigmoid(scores[i])
        results.append({"index": i, "score": score,
                        **({"text": body.texts[i]} if body.return_text else {})})
    return results


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))


@router.post("/reranking")
@router.post("/v1/rerank")
@router.post("/v1/reranking")
@router.post("/v2/rerank")
async def rerank(body: RerankRequest, request: Request) -> dict[str, Any]:
    texts = body.texts()
    loaded, scores, n_tokens = await _scores(request, body.model, body.query, texts,
                                             body.max_tokens_per_doc)
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[:body.top_n]
    results = []
    for i in order:
        result: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
        if body.return_documents:
            result["document"] = {"text": texts[i]}
        results.append(result)
    version = "2" if request.url.path.startswith("/v2/") else "1"
    return {"id": f"rerank-{uuid.uuid4().hex}", "model": loaded.name, "object": "list",
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
            "results": results,
            # Cohere's: a search unit is a query with up to 100 documents
            "meta": {"api_version": {"version": version},
                     "billed_units": {"search_units": -(-len(texts) // 100)}}}
