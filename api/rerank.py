"""Reranking, in the Jina / Cohere shape that llama-server serves (`/rerank`, `/reranking`,
`/v1/rerank`, `/v1/reranking`): what editors' and frameworks' retrieval calls (Continue,
LangChain, LlamaIndex, Open WebUI) to order the chunks it found by their relevance.

    {model, query, documents: [text | {text}], top_n?, return_documents?}
    → {id, model, object: "list", usage: {prompt_tokens, total_tokens},
       results: [{index, relevance_score, document?: {text}}]}   best first, top_n of them

Each document is scored with the query by a reranker model (backends/native/rerank.py); a model
that is not one is refused, as is a request past MAX_DOCUMENTS or a pair past the context
(before anything is scored). Ollama has no rerank route, so there is no Ollama shape.
"""

from __future__ import annotations

import asyncio
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

    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


def check_reranker(loaded: LoadedModel, path: str) -> None:
    """A 400 for a model that is not a reranker, worded as OpenAI words an endpoint a model
    does not serve."""
    if not loaded.info.rerank:
        endpoint = path.strip("/")
        raise ApiError(400, f"{loaded.name} is not a reranker and thus not supported in the "
                            f"{endpoint} endpoint — use a reranker GGUF (rank pooling or a "
                            f"classification head: bge-reranker-v2-m3, Qwen3-Reranker)")


@router.post("/rerank")
@router.post("/reranking")
@router.post("/v1/rerank")
@router.post("/v1/reranking")
async def rerank(body: RerankRequest, request: Request) -> dict[str, Any]:
    texts = body.texts()
    async with request.app.state.pool.use(core.check_model_name(body.model or None)) as loaded:
        check_reranker(loaded, request.url.path)
        scores, n_tokens = await asyncio.to_thread(loaded.backend.rerank, body.query, texts)
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[:body.top_n]
    results = []
    for i in order:
        result: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
        if body.return_documents:
            result["document"] = {"text": texts[i]}
        results.append(result)
    return {"id": f"rerank-{uuid.uuid4().hex}", "model": loaded.name, "object": "list",
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
            "results": results}
