"""Embeddings in the backend (backends/native/embeddings.py): pooled as the model's file says
(a random Qwen3-Embedding of tests/families.py names its last token), checked against
llama.cpp pooling the input read whole in a context of its own; a request's short inputs
sharing decodes embed as each alone."""

from __future__ import annotations

import math

import llama_cpp
import psutil
import pytest

from localinfer.backends.base import LoadOptions
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.backends.native.embeddings import _SEQUENCES
from localinfer.errors import InvalidRequest, PromptTooLong

from ..families import arch_model, embedding_model
from ..pooled import pooled


@pytest.fixture(scope="module")
def qwen3():
    backend = LlamaCppBackend(embedding_model(), LoadOptions(n_ctx=2048, n_slots=1))
    yield backend
    backend.close()


def _direct(backend, tokens: list[int], pooling: int) -> list[float]:
    """llama.cpp's pooled embedding of `tokens` read in one micro-batch, L2-normalised."""
    vector = pooled(backend.native.model, tokens, pooling, 2048,
                    llama_cpp.llama_model_n_embd(backend.native.model))
    norm = math.sqrt(sum(v * v for v in vector))
    return [v / norm for v in vector]


def test_the_files_own_pooling_even_past_a_micro_batch(qwen3):
    short = "What do cats eat?"
    vector, n_tokens = qwen3.embed(short)
    tokens = qwen3.tokenize(short)
    assert n_tokens == len(tokens)
    last = _direct(qwen3, tokens, llama_cpp.LLAMA_POOLING_TYPE_LAST)
    mean = _direct(qwen3, tokens, llama_cpp.LLAMA_POOLING_TYPE_MEAN)
    assert vector == pytest.approx(last, abs=1e-4)
    assert max(abs(a - b) for a, b in zip(vector, mean)) > 1e-2  # (not a mean)

    long = "Cats hunt small animals and sleep in the sun. " * 120
    tokens = qwen3.tokenize(long)
    assert 1024 < len(tokens) <= 2048  # more than one micro-batch
    assert qwen3.embed(long)[0] == pytest.approx(
        _direct(qwen3, tokens, llama_cpp.LLAMA_POOLING_TYPE_LAST), abs=2e-3)


def test_one_token_inputs_beside_longer_ones_are_pooled_at_their_own_last_token(qwen3):
    """Pooled at the last token, a decode reads the inputs' other tokens first: an input of
    one token has none, and the others' sequences keep their numbers around it."""
    texts = ["x", "What do cats eat?", "y", "Kittens drink milk."]
    assert [len(qwen3.tokenize(text)) for text in texts][::2] == [1, 1]
    vectors, _ = qwen3.embed_many(texts)
    for vector, text in zip(vectors, texts):
        assert vector == pytest.approx(
            _direct(qwen3, qwen3.tokenize(text), llama_cpp.LLAMA_POOLING_TYPE_LAST), abs=1e-4)


def test_a_long_input_keeps_its_output_rows_to_a_micro_batch(qwen3, smollm2_path):
    """With embeddings on, llama.cpp makes every token of a decode an output, a row of
    logits as wide as the vocabulary: one 1,890-token input grew the process by 1.4 GiB
    (Qwen3's vocabulary). Pooled at its last token, an input's other tokens are read with
    no outputs; a causal model's mean is read a micro-batch a decode (its compute buffer
    and output rows a micro-batch's) — and is still the whole input's mean. What the
    process grows by while the first embeds (its pooled context made then) and the second
    makes its own: within 2.5 such buffers and the KV."""
    long = "Cats hunt small animals and sleep in the sun. " * 120
    process = psutil.Process()
    mean_model = LlamaCppBackend(smollm2_path, LoadOptions(n_ctx=2048, n_slots=1))
    try:
        for backend, rows in ((qwen3, _SEQUENCES), (mean_model, 512)):
            tokens = backend.tokenize(long)
            assert len(tokens) > 1024
            before = process.memory_info().rss
            vector, _ = backend.embed(long)
            width = (llama_cpp.llama_vocab_n_tokens(backend.native.vocab)
                     + llama_cpp.llama_model_n_embd(backend.native.model)) * 4
            assert process.memory_info().rss - before <= 2.5 * rows * width + (64 << 20)
        assert vector == pytest.approx(
            _direct(mean_model, tokens, llama_cpp.LLAMA_POOLING_TYPE_MEAN), abs=1e-4)
    finally:
        mean_model.close()


def test_a_requests_inputs_sharing_decodes_embed_as_each_alone(smollm2):
    # more inputs than a decode takes, of uneven lengths; smollm2 names no pooling: mean
    texts = [f"Text {i}: " + "cats and dogs " * (i % 5) for i in range(_SEQUENCES + 6)]
    vectors, n_tokens = smollm2.embed_many(texts)
    alone = [smollm2.embed(text) for text in texts]
    assert len(vectors) == len(texts)
    for vector, (one, _) in zip(vectors, alone):
        # flash attention over the shared cells sums in another order, in half precision:
        # the same direction within rounding (a sequence that saw another's tokens would not be)
        assert sum(a * b for a, b in zip(vector, one)) > 0.999
        assert vector == pytest.approx(one, abs=0.02)
    assert n_tokens == sum(n for _, n in alone)
    assert len({round(v[0], 6) for v in vectors}) > 1

    with pytest.raises(InvalidRequest):  # an empty input: none is read
        smollm2.embed_many(["cats", ""])
    with pytest.raises(PromptTooLong):
        smollm2.embed_many(["cats", "cats " * 3000])


def test_a_read_whose_caller_has_gone_stops_at_its_next_decode(smollm2, monkeypatch):
    """Set `stop` (its client hung up) and the rest of a request's inputs are not read."""
    import threading

    from localinfer.errors import Cancelled

    stop, decodes = threading.Event(), []
    decode = smollm2.embedder._decode

    def counted(group):
        decodes.append(len(group))
        stop.set()  # (the client goes while the first decode runs)
        return decode(group)

    monkeypatch.setattr(smollm2.embedder, "_decode", counted)
    with pytest.raises(Cancelled):
        smollm2.embed_many([f"Text {i}" for i in range(4 * _SEQUENCES)], stop)
    assert len(decodes) == 1  # of at least 4
    monkeypatch.undo()
    assert len(smollm2.embed_many(["cats", "dogs"])[0]) == 2  # the next request is read


@pytest.mark.parametrize("arch", ["qwen35", "mamba2", "lfm2", "gemma3", "qwen3moe"])
def test_every_architecture_embeds_inputs_sharing_a_decode_as_each_alone(arch):
    """Hybrid (a recurrent state per sequence), recurrent, sliding-window and MoE models: 16
    sequences in one pooled context, each pooled as if read alone."""
    backend = LlamaCppBackend(arch_model(arch), LoadOptions(n_ctx=512, n_slots=1))
    try:
        texts = [f"Text {i}: " + "cats and dogs " * (i % 5) for i in range(_SEQUENCES + 4)]
        vectors, _ = backend.embed_many(texts)
        for vector, text in zip(vectors, texts):
            assert sum(a * b for a, b in zip(vector, backend.embed(text)[0])) > 0.999
    finally:
        backend.close()


@pytest.mark.parametrize("arch", ["qwen35", "mamba2", "lfm2", "gemma3", "qwen3moe"])
def test_every_architecture_means_a_long_input_in_micro_batches_as_read_whole(arch):
    """A chat model's mean over an input longer than a micro-batch is read a micro-batch a
    decode (a recurrent state, a sliding window and experts carried through the cells from
    one decode to the next): the same vector as llama.cpp's mean of the input read whole."""
    backend = LlamaCppBackend(arch_model(arch), LoadOptions(n_ctx=2048, n_slots=1))
    try:
        text = "Cats hunt small animals and sleep in the sun. " * 120
        tokens = backend.tokenize(text)
        assert 1024 < len(tokens) <= 2048  # three micro-batches or more
        vector, _ = backend.embed(text)
        whole = _direct(backend, tokens, llama_cpp.LLAMA_POOLING_TYPE_MEAN)
        assert sum(a * b for a, b in zip(vector, whole)) > 0.999
    finally:
        backend.close()


def test_an_embedding_that_is_not_a_number_is_an_error_not_a_vector(smollm2_path, tmp_path):
    """smollm2 with NaN in its output norm: every hidden state it pools is NaN. The request
    fails with a clear error (a NaN in JSON is no number a client can read), and the model
    keeps serving."""
    import shutil

    import numpy as np

    from localinfer.errors import EngineError
    from localinfer.model_store.gguf_info import gguf

    broken = tmp_path / "nan.gguf"
    shutil.copy(smollm2_path, broken)
    reader = gguf.GGUFReader(broken, "r+")
    norm = next(t for t in reader.tensors if t.name == "output_norm.weight")
    norm.data[:] = np.nan
    reader.data.flush()
    del reader
    backend = LlamaCppBackend(broken, LoadOptions(n_ctx=256))
    try:
        with pytest.raises(EngineError, match="not a number"):
            backend.embed_many(["cats", "dogs"])
        assert backend.tokenize("still here")
    finally:
        backend.close()


def test_a_chat_model_embeds_only_where_the_memory_its_context_takes_is_free(
        smollm2_path, monkeypatch):
    """A chat model's embedding context is not in its plan (an embedding model's is): it is
    made on the first embedding only where the RAM it takes is free, else the request is
    refused in one line and nothing is made; once the memory is there, it embeds."""
    from localinfer.backends import llamacpp
    from localinfer.errors import ModelLoadFailed

    backend = LlamaCppBackend(smollm2_path, LoadOptions(n_ctx=2048, n_slots=1))
    try:
        monkeypatch.setattr(llamacpp, "ram_available", lambda: 64 << 20)
        with pytest.raises(ModelLoadFailed, match=r"need [\d.]+ GiB of RAM .* 0\.06 GiB is free"):
            backend.embed("What do cats eat?")
        assert backend.embedder._ctx is None
        monkeypatch.undo()
        vector, n_tokens = backend.embed("What do cats eat?")
        assert len(vector) == llama_cpp.llama_model_n_embd(backend.native.model) and n_tokens
    finally:
        backend.close()


def test_an_embedding_models_context_is_in_its_plan_and_not_checked_again(monkeypatch):
    from localinfer.backends import llamacpp

    backend = LlamaCppBackend(embedding_model(), LoadOptions(n_ctx=2048, n_slots=1))
    try:
        monkeypatch.setattr(llamacpp, "ram_available", lambda: 64 << 20)
        assert backend.embed("What do cats eat?")[1]
    finally:
        backend.close()


def test_a_causal_models_mean_skips_its_output_layer_once_it_was_llama_cpps(smollm2_path):
    """With embeddings on, llama.cpp runs the output layer over every token (vocabulary-wide
    logits nobody reads) before it pools. The mean is taken from the rows it pools
    (`FinalRows`): on the first decode beside llama.cpp's own pooling, and once the two
    agree, the graph stops at those rows: the output layer and the pooling are not computed,
    and the vectors are still llama.cpp's."""
    backend = LlamaCppBackend(smollm2_path, LoadOptions(n_ctx=1024, n_slots=1))
    try:
        texts = ["Cats hunt small animals.", "Dogs guard the house at night, " * 30]
        first, _ = backend.embed_many(texts[:1])
        final = backend.embedder.final
        assert final is not None and final.skip
        assert final.computed_after > 1  # checked: the output layer and the pooling ran
        for text in texts:  # each alone (inputs sharing a decode sum in another order)
            vector, _ = backend.embed(text)
            assert final.computed_after == 0 and backend.embedder.final is final
            want = _direct(backend, backend.tokenize(text), llama_cpp.LLAMA_POOLING_TYPE_MEAN)
            assert vector == pytest.approx(want, abs=1e-4)
        assert backend.embed(texts[0])[0] == pytest.approx(first[0], abs=1e-6)
    finally:
        backend.close()


def test_rows_that_are_not_what_llama_cpp_pools_are_never_served(smollm2_path, monkeypatch):
    """Where the rows copied out are not what llama.cpp pools (another node: a model whose
    last hidden states go by another name), its own pooling is served and the context is made
    again without the callback; where they go missing once skipping (nothing pooled then),
    the inputs are read again with llama.cpp's pooling, and the rows are not trusted again
    (the read again checks them, and does not skip). Never a vector of uncomputed memory."""
    from localinfer.backends.native import embeddings

    text = "Cats hunt small animals and sleep in the sun. " * 50  # past a micro-batch: chunks
    for case in ("another node", "rows gone", "rows gone once"):
        backend = LlamaCppBackend(smollm2_path, LoadOptions(n_ctx=1024, n_slots=1))
        try:
            want = _direct(backend, backend.tokenize(text), llama_cpp.LLAMA_POOLING_TYPE_MEAN)
            with monkeypatch.context() as patch:
                if case == "another node":  # the last layer's output, before the final norm
                    n_layer = llama_cpp.llama_model_n_layer(backend.native.model)
                    patch.setattr(embeddings.FinalRows, "NAME", f"l_out-{n_layer - 1}".encode())
                else:
                    backend.embed_many(["a first input, checked"])
                    assert backend.embedder.final.skip
                    real, calls = embeddings.ggml.tensor_floats, []

                    def floats(tensor):  # none at all, or none the first time only
                        calls.append(tensor)
                        return None if case == "rows gone" or len(calls) == 1 else real(tensor)

                    patch.setattr(embeddings.ggml, "tensor_floats", floats)
                for _ in range(2):
                    vector, _ = backend.embed(text)
                    assert vector == pytest.approx(want, abs=1e-4), case
                    assert backend.embedder.final is None
        finally:
            backend.close()


def test_a_cut_input_keeps_the_end_token_its_vocabulary_adds():
    """Ollama's truncate: cut to the context; a last-token pooling reads the end token, so
    one the vocabulary adds stays last."""
    import types

    def cut(tokens, adds_eos):
        backend = types.SimpleNamespace(native=types.SimpleNamespace(
            adds_eos=lambda: adds_eos, eos=lambda: 2))
        return LlamaCppBackend._cut(backend, tokens, 3)

    assert cut([1, 5, 6, 7, 2], adds_eos=True) == [1, 5, 2]
    assert cut([1, 5, 6, 7, 2], adds_eos=False) == [1, 5, 6]
    assert cut([1, 5, 6, 7, 8], adds_eos=True) == [1, 5, 6]  # (no end token to keep)
    assert cut([1, 5, 2], adds_eos=True) == [1, 5, 2]  # within the context: as it is
