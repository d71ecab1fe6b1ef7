"""Reranking through a real server, as retrieval clients call it (httpx: no client library
but Cohere's speaks it): two random-weight rerankers of real shapes — a BERT cross-encoder
and a Qwen3-Reranker (tests/families.py `reranker_model`) — whose scores mean nothing but
are the same for the same pair. A score is checked against llama.cpp computing it directly,
on the pair written as llama-server writes it."""

from __future__ import annotations

import ctypes
import math
from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import pytest

from ..families import QWEN3_RERANK_PROMPT, install, reranker_model
from ..pooled import pooled
from .conftest import Server, start_server, stop_server

QUERY = "What do cats eat?"
DOCUMENTS = ["Cats are carnivores: they eat meat, mostly small animals.",
             "The stock market fell sharply on Tuesday.",
             "A cat's diet needs taurine, found in fish and meat.",
             "Paris is the capital of France.",
             "Kittens drink their mother's milk."]
# how far a causal reranker's score of a pair moves when other pairs share its decode
# (flash attention sums over the shared cells in another order); an encoder's does not move
MOVES = {"bert": 1e-6, "qwen3": 2e-3}


@pytest.fixture(scope="module")
def rerankers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict]]:
    home = tmp_path_factory.mktemp("rerank-home")
    names = {arch: install(home, reranker_model(arch), f"{arch}-reranker")
             for arch in ("bert", "qwen3")}
    server = start_server(home, "--model", "smollm2:135m", "--ctx", "512", "--parallel", "1")
    yield server, names
    stop_server(server)


def _rerank(server: Server, path: str = "/v1/rerank", **body) -> dict:
    reply = server.post(path, json=body)
    assert reply.status_code == 200, reply.text
    return reply.json()


@pytest.mark.parametrize("arch", ["bert", "qwen3"])
def test_results_best_first_each_scored_as_alone(rerankers, arch):
    server, names = rerankers
    model = names[arch]
    answer = _rerank(server, model=model, query=QUERY, documents=DOCUMENTS,
                     return_documents=True)
    assert answer["model"] == model and answer["object"] == "list"
    results = answer["results"]
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    assert sorted(r["index"] for r in results) == list(range(len(DOCUMENTS)))
    assert all(r["document"]["text"] == DOCUMENTS[r["index"]] for r in results)

    alone = [_rerank(server, model=model, query=QUERY, documents=[d]) for d in DOCUMENTS]
    by_index = {r["index"]: r["relevance_score"] for r in results}
    for i, one in enumerate(alone):
        assert one["results"][0]["index"] == 0
        assert by_index[i] == pytest.approx(one["results"][0]["relevance_score"],
                                            abs=MOVES[arch])
    n_tokens = sum(one["usage"]["prompt_tokens"] for one in alone)
    assert answer["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
    assert len({round(s, 6) for s in scores}) > 1  # (the documents are told apart)

    # top_n: the best n, in the same order; documents as {text} objects; every route
    top = _rerank(server, "/rerank", model=model, query=QUERY, top_n=2,
                  documents=[{"text": d} for d in DOCUMENTS])
    assert [r["index"] for r in top["results"]] == [r["index"] for r in results[:2]]
    assert "document" not in top["results"][0]
    assert top["usage"] == answer["usage"]
    for path in ("/v1/reranking", "/reranking"):
        again = _rerank(server, path, model=model, query=QUERY, documents=DOCUMENTS, top_n=99)
        assert [r["index"] for r in again["results"]] == [r["index"] for r in results]


def _pair_tokens(model, vocab, query: str, document: str) -> list[int]:
    """The pair as llama-server's format_prompt_rerank writes it (written again here)."""
    def tokens(text: str, parse_special: bool) -> list[int]:
        data = text.encode()
        buf = (llama_cpp.llama_token * (len(data) + 8))()
        n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, len(buf), False,
                                     parse_special)
        return list(buf[:n])

    prompt = llama_cpp.llama_model_chat_template(model, b"rerank")
    if prompt:
        assert prompt.decode() == QWEN3_RERANK_PROMPT
        text = prompt.decode().replace("{query}", query).replace("{document}", document)
        return tokens(text, True)
    bos, sep = llama_cpp.llama_vocab_bos(vocab), llama_cpp.llama_vocab_sep(vocab)
    # bge's WordPiece adds [CLS] and [SEP] but no end of text
    assert llama_cpp.llama_vocab_get_add_bos(vocab) and llama_cpp.llama_vocab_get_add_sep(vocab)
    assert not llama_cpp.llama_vocab_get_add_eos(vocab)
    return [bos, *tokens(query, False), sep, *tokens(document, False)]


def _direct_score(path: Path, query: str, document: str) -> tuple[float, int]:
    """llama.cpp scoring one pair in a context of its own with rank pooling (what
    llama-server's --reranking makes), and the pair's length."""
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(str(path).encode(),
                                                 llama_cpp.llama_model_default_params())
    try:
        pair = _pair_tokens(model, llama_cpp.llama_model_get_vocab(model), query, document)
        (score,) = pooled(model, pair, llama_cpp.LLAMA_POOLING_TYPE_RANK, 512, 1)
        return score, len(pair)
    finally:
        llama_cpp.llama_model_free(model)


@pytest.mark.parametrize("arch", ["bert", "qwen3"])
def test_score_is_llama_cpps_own(rerankers, arch):
    server, names = rerankers
    for document in DOCUMENTS[:2]:
        expected, n_tokens = _direct_score(reranker_model(arch), QUERY, document)
        answer = _rerank(server, model=names[arch], query=QUERY, documents=[document])
        # a causal reranker's last token is read in a decode of its own (the others with no
        # output rows: backends/native/embeddings.py), and llama.cpp's attention sums one
        # query row in another order than a tile of them: 1e-4 here
        assert answer["results"][0]["relevance_score"] == pytest.approx(
            expected, abs=1e-5 if arch == "bert" else 1e-3)
        assert answer["usage"]["prompt_tokens"] == n_tokens


def test_what_is_refused_and_what_is_shown(rerankers):
    server, names = rerankers
    bert = names["bert"]

    def refused(path: str, body: dict, status: int = 400) -> str:
        reply = server.post(path, json=body)
        assert reply.status_code == status, reply.text
        error = reply.json()["error"]
        return error["message"] if isinstance(error, dict) else error

    assert "documents" in refused("/v1/rerank", {"model": bert, "query": QUERY,
                                                 "documents": []})
    assert "documents" in refused("/v1/rerank", {"model": bert, "query": QUERY,
                                                 "documents": ["x"] * 1001})
    assert "top_n" in refused("/v1/rerank", {"model": bert, "query": QUERY, "top_n": 0,
                                             "documents": ["x"]})
    assert "query" in refused("/rerank", {"model": bert, "documents": ["x"]})
    # a chat model is no reranker, in OpenAI's words for a model an endpoint does not serve
    message = refused("/v1/rerank", {"model": "smollm2:135m", "query": QUERY,
                                     "documents": ["x"]})
    assert message.startswith("smollm2:135m is not a reranker and thus not supported in the "
                              "v1/rerank endpoint")
    # one document past the context: nothing is scored, and the error says the numbers
    reply = server.post("/v1/rerank", json={"model": bert, "query": QUERY,
                                            "documents": ["short", "word " * 600]})
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "context_length_exceeded"
    assert "512" in reply.json()["error"]["message"]
    # a reranker neither chats nor embeds
    chat = {"model": bert, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    assert "does not support chat" in refused("/v1/chat/completions", chat)
    assert "does not support chat" in refused("/api/chat", {**chat, "stream": False})
    assert "does not support embeddings" in refused("/v1/embeddings",
                                                    {"model": bert, "input": "Hi"})
    assert "does not support embeddings" in refused("/api/embed", {"model": bert, "input": "Hi"})

    # listed, and shown as what it does
    assert {bert, names["qwen3"]} <= {m["name"] for m in server.get("/api/tags").json()["models"]}
    assert bert in {m["id"] for m in server.get("/v1/models").json()["data"]}
    for name in names.values():
        assert server.post("/api/show", json={"model": name}).json()["capabilities"] == ["rerank"]
    # the server and its runners lived through all of it
    assert _rerank(server, model=bert, query=QUERY, documents=["x"])["results"]


def _cut(path: Path, text: str, n: int) -> str:
    """The first n tokens of `text` as the model's own vocabulary reads and writes them."""
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    try:
        vocab = llama_cpp.llama_model_get_vocab(model)
        data = text.encode()
        buf = (llama_cpp.llama_token * (len(data) + 8))()
        count = llama_cpp.llama_tokenize(vocab, data, len(data), buf, len(buf), False, False)
        out = b""
        for token in buf[:min(n, count)]:
            piece = ctypes.create_string_buffer(64)
            size = llama_cpp.llama_token_to_piece(vocab, token, piece, 64, 0, False)
            out += piece.raw[:size]
        return out.decode()
    finally:
        llama_cpp.llama_model_free(model)


@pytest.mark.parametrize("arch", ["bert", "qwen3"])
def test_cohere_sdks_v1_and_v2_rerank(rerankers, arch):
    """Cohere's own client, unmodified, at both API versions; v2's max_tokens_per_doc cuts
    each document to that many tokens before it is scored."""
    import cohere

    server, names = rerankers
    model = names[arch]
    expected = _rerank(server, model=model, query=QUERY, documents=DOCUMENTS)["results"]
    v2 = cohere.ClientV2(base_url=server.url, api_key="local").rerank(
        model=model, query=QUERY, documents=DOCUMENTS, top_n=3)
    assert [r.index for r in v2.results] == [r["index"] for r in expected[:3]]
    assert [r.relevance_score for r in v2.results] == pytest.approx(
        [r["relevance_score"] for r in expected[:3]], abs=MOVES[arch])
    v1 = cohere.Client(base_url=server.url, api_key="local").rerank(
        model=model, query=QUERY, documents=DOCUMENTS, return_documents=True)
    assert [(r.index, r.document.text) for r in v1.results] == [
        (r["index"], DOCUMENTS[r["index"]]) for r in expected]

    cut = cohere.ClientV2(base_url=server.url, api_key="local").rerank(
        model=model, query=QUERY, documents=DOCUMENTS, max_tokens_per_doc=3)
    short = [_cut(reranker_model(arch), d, 3) for d in DOCUMENTS]
    assert all(len(s) < len(d) for s, d in zip(short, DOCUMENTS))
    as_cut = {r["index"]: r["relevance_score"] for r in _rerank(
        server, model=model, query=QUERY, documents=short)["results"]}
    assert {r.index: r.relevance_score for r in cut.results} == pytest.approx(
        as_cut, abs=MOVES[arch])


def test_text_embeddings_inference_shape(rerankers):
    """TEI's /rerank (Haystack's TEI ranker): `texts` in, a list best first out, the scores
    through a sigmoid unless raw_scores; truncate cuts a text past the context."""
    server, names = rerankers
    model = names["bert"]
    raw = {r["index"]: r["relevance_score"] for r in _rerank(
        server, model=model, query=QUERY, documents=DOCUMENTS)["results"]}
    reply = server.post("/rerank", json={"model": model, "query": QUERY, "texts": DOCUMENTS,
                                         "return_text": True})
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    assert [r["index"] for r in answer] == sorted(raw, key=lambda i: -raw[i])
    for r in answer:
        assert r["score"] == pytest.approx(1 / (1 + math.exp(-raw[r["index"]])), abs=1e-6)
        assert r["text"] == DOCUMENTS[r["index"]]
    plain = server.post("/rerank", json={"model": model, "query": QUERY, "texts": DOCUMENTS,
                                         "raw_scores": True}).json()
    assert {r["index"]: r["score"] for r in plain} == pytest.approx(raw, abs=1e-6)
    assert "text" not in plain[0]

    long = {"model": model, "query": QUERY, "texts": ["short", "word " * 600]}
    assert server.post("/rerank", json=long).status_code == 400  # past the context of 512
    cut = server.post("/rerank", json={**long, "truncate": True})
    assert cut.status_code == 200, cut.text
    assert sorted(r["index"] for r in cut.json()) == [0, 1]
