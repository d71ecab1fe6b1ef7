"""What llama.cpp itself pools for one sequence read whole: a context of its own on a loaded
model, with the pooling named, the tokens in one micro-batch. The reference the embedding and
reranking tests hold the backend's answers to."""

from __future__ import annotations

from collections.abc import Sequence

import llama_cpp


def pooled(model: llama_cpp.llama_model_p, tokens: Sequence[int], pooling: int,
           n_ctx: int, width: int) -> list[float]:
    """The first `width` floats llama.cpp pools for `tokens` (a score: 1; an embedding: the
    model's width), read in one micro-batch of `n_ctx` tokens."""
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = params.n_batch = params.n_ubatch = n_ctx
    params.embeddings = True
    params.pooling_type = pooling
    ctx = llama_cpp.llama_init_from_model(model, params)
    assert ctx
    batch = llama_cpp.llama_batch_init(len(tokens), 0, 1)
    try:
        for i, token in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, i, 1
            batch.seq_id[i][0], batch.logits[i] = 0, True
        batch.n_tokens = len(tokens)
        assert llama_cpp.llama_decode(ctx, batch) == 0
        out = llama_cpp.llama_get_embeddings_seq(ctx, 0)
        assert out
        return out[:width]
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
