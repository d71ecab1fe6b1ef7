"""Logit bias, penalties, grammar, embeddings, engine stats and the asyncio event stream."""

from __future__ import annotations

import asyncio
import ctypes
import json
import math
import time

import llama_cpp
import numpy
import pytest

from localinfer.backends.engine import batch as batch_module
from localinfer.backends.base import DoneEvent, SamplingParams, TokenEvent
from localinfer.backends.native.model import SamplerChain
from localinfer.chat_formats.grammar import ANY_JSON, json_schema_grammar
from localinfer.errors import EngineError, InvalidRequest

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def _first_token(backend, params):
    return next(e.token for e in backend.chat(QUESTION, params) if isinstance(e, TokenEvent))


def test_logit_bias_bans_the_greedy_choice(smollm2):
    greedy = SamplingParams(temperature=0, max_tokens=1)
    banned = _first_token(smollm2, greedy)
    other = _first_token(smollm2, SamplingParams(temperature=0, max_tokens=1,
                                                 logit_bias={banned: -100}))
    assert other != banned
    # a strong positive bias makes a chosen token the greedy pick
    forced = smollm2.tokenize(" banana", add_special=False)[0]
    assert _first_token(smollm2, SamplingParams(temperature=0, max_tokens=1,
                                                logit_bias={forced: 50})) == forced


def _distinct_tokens(backend, text, **penalties):
    prompt = backend.tokenize(text, add_special=False)
    generation = backend.generate(prompt, SamplingParams(temperature=0, max_tokens=16, **penalties))
    return len({e.token for e in generation if isinstance(e, TokenEvent)})


@pytest.mark.parametrize("text,penalty", [("1, 1, 1, 1, 1, 1, 1,", "frequency_penalty"),
                                          ("the the the the the the", "presence_penalty")])
def test_penalties_reduce_repetition(smollm2, text, penalty):
    assert _distinct_tokens(smollm2, text, **{penalty: 2.0}) > _distinct_tokens(smollm2, text)


SHORTCUT_CASES = {
    "greedy": SamplingParams(temperature=0, max_tokens=40),
    "greedy, repeat penalty": SamplingParams(temperature=0, repeat_penalty=1.5, max_tokens=40),
    "Ollama's defaults": SamplingParams(temperature=0.8, top_k=40, top_p=0.9,
                                        repeat_penalty=1.1, seed=7, max_tokens=40),
    "frequency and presence": SamplingParams(temperature=1.0, top_k=20, frequency_penalty=1.0,
                                             presence_penalty=0.5, seed=3, max_tokens=40),
    "negative presence (no cut)": SamplingParams(temperature=1.0, top_k=20, seed=5,
                                                 presence_penalty=-2.0, max_tokens=40),
    "localinfer's defaults": SamplingParams(seed=11, max_tokens=40),
    "no top_k (no cut)": SamplingParams(temperature=1.0, top_k=0, top_p=0.9, seed=13,
                                        max_tokens=40),
    # a bias before the cut (more: test_a_bias_before_the_cut_picks_what_llama_cpp_picks):
    # a token raised from far below the best logit; the end tokens banned; 1,000 tokens
    # biased, which llama.cpp would look for among the candidates one by one
    "logit bias, a raise": SamplingParams(seed=23, max_tokens=40, logit_bias=((4000, 100.0),)),
    "greedy, ignore_eos": SamplingParams(temperature=0, ignore_eos=True, max_tokens=40),
    "ignore_eos, Ollama's defaults": SamplingParams(temperature=0.8, top_k=40, top_p=0.9,
                                                    repeat_penalty=1.1, seed=19,
                                                    ignore_eos=True, max_tokens=40),
    "1,000 tokens biased (no cut)": SamplingParams(
        temperature=1.5, top_k=100, top_p=1.0, min_p=0.0, seed=17, max_tokens=40,
        logit_bias=tuple((t, -100.0) for t in range(1000))),
    # a grammar asked of the drawn token only, and of every token where it refuses that one
    "greedy, JSON grammar": SamplingParams(temperature=0, grammar=ANY_JSON, max_tokens=40),
    "greedy, JSON grammar and penalties": SamplingParams(temperature=0, grammar=ANY_JSON,
                                                         repeat_penalty=1.3, max_tokens=40),
}
# where the chain's first sampler is a cut to the best candidates: the chain is given only
# the tokens near the best logit
CUT_CASES = {"greedy, repeat penalty", "Ollama's defaults", "frequency and presence",
             "localinfer's defaults", "logit bias, a raise", "greedy, ignore_eos",
             "ignore_eos, Ollama's defaults"}


class _Twin:
    """A request's sampler with the shortcuts, and llama.cpp's plain chain beside it: both
    sample the same logits row each step, and any pick on which they differ is noted."""

    argmax = False  # each stream samples its own row here, through both chains
    constrained = False

    def __init__(self, native, params, prompt=()):
        self.fast = SamplerChain(native, params, prompt)
        SamplerChain.shortcuts = False
        try:
            self.plain = SamplerChain(native, params, prompt)
        finally:
            SamplerChain.shortcuts = True
        self.picks: list[tuple[int, int]] = []
        _Twin.made.append(self)

    def sample(self, native, batch_index: int) -> int:
        token = self.fast.sample(native, batch_index)
        self.picks.append((token, self.plain.sample(native, batch_index)))
        return token

    def close(self) -> None:
        self.fast.close()
        self.plain.close()


POEM = [{"role": "user", "content": "Write a short poem about the sea, repeating its words."}]


def _twin_reply(backend, monkeypatch, params: SamplingParams) -> _Twin:
    """A reply to POEM drawn through a _Twin: the picks of both chains, each the same."""
    monkeypatch.setattr(_Twin, "made", [], raising=False)
    native = backend.native
    monkeypatch.setattr(native, "sampler", lambda params, prompt=(): _Twin(native, params, prompt))
    backend.chat(POEM, params).text()
    (twin,) = _Twin.made
    assert len(twin.picks) >= 5  # (a sampled reply may end early, on another CPU's floats)
    assert all(fast == plain for fast, plain in twin.picks), twin.picks
    return twin


@pytest.mark.numerics
@pytest.mark.parametrize("case", SHORTCUT_CASES)
@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_sampling_shortcuts_pick_what_llama_cpp_picks(request, monkeypatch, model, case):
    """Greedy as an argmax, penalties after a cut to the best candidates, a chain that cuts
    first given only the tokens near the best logit: same tokens as llama.cpp's plain chain,
    on a 49k and a 262k vocabulary. Both chains sample the same logits at every step (two
    runs would be two batch shapes, whose floats may differ)."""
    twin = _twin_reply(request.getfixturevalue(model), monkeypatch, SHORTCUT_CASES[case])
    if case in CUT_CASES:  # (a draw whose gap held too many tokens goes to llama.cpp's)
        assert twin.fast.cut_draws >= len(twin.picks) // 2, (twin.fast.cut_draws, twin.picks)
    else:
        assert twin.fast.cut_draws == 0
    if case == "logit bias, a raise":  # (drawn from far below the best logit)
        assert any(fast == 4000 for fast, _ in twin.picks), twin.picks


@pytest.mark.numerics
@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_a_bias_before_the_cut_picks_what_llama_cpp_picks(request, monkeypatch, model):
    """A logit bias comes first in the chain; with a few tokens biased, the chain is still
    given only the tokens near the best logit: as many more as tokens are biased, and the
    biased with them. The same tokens as llama.cpp's plain chain, with the reply's
    commonest pieces banned over a flat distribution (often the best logits: the draw comes
    from below them), and an end token raised where `ignore_eos` bans it (two entries for
    one token, which llama.cpp sums where it finds the token at its own index and not where
    it looks for it among candidates: an editor's /infill request)."""
    backend = request.getfixturevalue(model)
    common = {t for piece in ("The", " The", " the", " sea", ",", ".", "\n", " and", " a",
                              " of", " waves", " I", " to", " in", " is", " its")
              for t in backend.tokenize(piece, add_special=False)}
    end = backend.native.eog_tokens()[0]
    twin = _twin_reply(backend, monkeypatch, SamplingParams(
        temperature=1.5, top_k=100, top_p=1.0, min_p=0.0, seed=17, max_tokens=40,
        ignore_eos=True, logit_bias=((end, 100.0), *((t, -100.0) for t in common))))
    assert twin.fast.cut_draws >= len(twin.picks) // 2, (twin.fast.cut_draws, twin.picks)
    assert not set(common) & {fast for fast, _ in twin.picks}


def test_banned_tokens_near_the_best_widen_the_cut(smollm2, monkeypatch):
    """Rows made for it: 105 tokens near the best logit, 20 of them banned, the next 200
    just past the first gap. The best 100 after the bias reach into those 200, so the
    chain must see as many more as tokens are biased (a window of 105 held too few: 85 it
    may draw from, where llama.cpp's whole-vocabulary chain draws from 100). Each draw
    against that chain on the same row, with the same seed."""
    from localinfer.backends.native.model import _Candidates

    native = smollm2.native
    rng = numpy.random.default_rng(3)
    banned = tuple((int(t), -100.0) for t in rng.choice(105, 20, replace=False) + 1000)
    params = SamplingParams(temperature=2.0, top_k=100, top_p=1.0, min_p=0.0, seed=9,
                            logit_bias=banned)
    monkeypatch.setattr(_Twin, "made", [], raising=False)
    twin = _Twin(native, params)
    fast, plain = twin.fast, twin.plain
    whole = _Candidates(native.n_vocab)
    row = numpy.empty(native.n_vocab, dtype=numpy.float32)
    monkeypatch.setattr(llama_cpp, "llama_get_logits_ith", lambda ctx, i: row.ctypes.data_as(
        ctypes.POINTER(ctypes.c_float)))
    try:
        for _ in range(60):
            row[:] = rng.uniform(-20.0, -10.0, native.n_vocab)
            row[1000:1105] = rng.uniform(9.0, 10.0, 105)
            row[2000:2200] = rng.uniform(5.0, 5.9, 200)
            token = fast.sample(native, 0)
            llama_cpp.llama_sampler_apply(plain.chain, whole.fill(row))
            assert token == whole.selected()
            llama_cpp.llama_sampler_accept(plain.chain, token)
    finally:
        twin.close()
    assert fast.cut_draws == 60


@pytest.mark.parametrize("seed", range(4))
def test_a_sampled_reply_under_a_grammar_keeps_to_it(smollm2, seed):
    """The token is drawn first and the grammar asked of it alone; a refused one is drawn
    again over what the grammar allows, so a hot sampler still writes the schema's JSON."""
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer", "maximum": 150}},
              "required": ["name", "age"]}
    params = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, seed=seed, max_tokens=60,
                            grammar=json_schema_grammar(schema))
    generation = smollm2.chat(QUESTION, params)
    data = json.loads(generation.text())
    assert set(data) == {"name", "age"} and isinstance(data["age"], int)


def test_json_schema_grammar_with_penalties(smollm2):
    """Penalties see the prompt as history; a grammar must not (that aborted the process)."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    params = SamplingParams(temperature=0, max_tokens=40, repeat_penalty=1.1,
                            grammar=json_schema_grammar(schema))
    generation = smollm2.chat(QUESTION, params)
    data = json.loads(generation.text())
    assert list(data) == ["city"] and generation.stats.finish_reason == "stop"


def test_json_object_grammar_on_gemma(gemma3):
    text = gemma3.chat(QUESTION, SamplingParams(temperature=0, max_tokens=48,
                                                grammar=ANY_JSON)).text()
    assert text.lstrip().startswith("{")


def test_bad_grammar_and_bias_are_refused_before_queueing(smollm2):
    with pytest.raises(InvalidRequest, match="grammar"):
        smollm2.chat(QUESTION, SamplingParams(grammar="root ::= ("))
    with pytest.raises(InvalidRequest, match="outside the vocabulary"):
        smollm2.chat(QUESTION, SamplingParams(logit_bias={10**8: 1.0}))
    with pytest.raises(InvalidRequest, match="presence_penalty"):
        SamplingParams(presence_penalty=3)
    with pytest.raises(InvalidRequest, match="logit_bias"):
        SamplingParams(logit_bias={5: 500})
    with pytest.raises(InvalidRequest, match="schema"):
        json_schema_grammar({"type": "object", "properties": {"x": {"$ref": "#/nowhere"}}})


def test_embeddings_are_normalised_and_meaningful(smollm2):
    cat, kitten, market = (smollm2.embed(t)[0] for t in
                           ("The cat sat on the mat.", "A kitten sat on a rug.",
                            "Interest rates rose again."))
    assert math.isclose(sum(x * x for x in cat), 1.0, rel_tol=1e-5)
    dot = lambda a, b: sum(x * y for x, y in zip(a, b))  # noqa: E731
    assert dot(cat, kitten) > dot(cat, market)
    assert smollm2.embed("The cat sat on the mat.")[0] == cat  # deterministic
    with pytest.raises(InvalidRequest):
        smollm2.detokenize([-5])


def test_engine_stats_count_steps_and_tokens(smollm2):
    before = smollm2.stats()
    started = time.perf_counter()
    generation = smollm2.chat(QUESTION, SamplingParams(temperature=0, max_tokens=6))
    generation.text()
    elapsed = time.perf_counter() - started
    after = smollm2.stats()
    assert after.n_slots == 2 and after.active == 0 and after.waiting == 0
    assert after.tokens_generated - before.tokens_generated == generation.stats.generated_tokens
    assert after.tokens_evaluated - before.tokens_evaluated == generation.stats.evaluated_prompt_tokens
    assert after.steps - before.steps >= generation.stats.generated_tokens
    assert after.requests_finished == before.requests_finished + 1
    assert 0 < after.kv_cells_used <= after.kv_cells_total == 2048
    # the time inside llama_decode is part of the steps' time, which is part of the wall's
    decode = after.decode_seconds - before.decode_seconds
    step = after.step_seconds - before.step_seconds
    assert 0 < decode < step < elapsed
    assert 0 < after.engine_overhead < 1


def test_async_events_match_the_threaded_stream(smollm2, smollm2_reference):
    params = SamplingParams(temperature=0, max_tokens=12)
    prompt = smollm2.tokenize(smollm2.apply_chat_template(QUESTION))

    async def collect():
        generation = smollm2.generate(prompt, params)
        await asyncio.sleep(0.2)  # some events arrive before anyone listens: none is lost
        events = [e async for e in generation.events()]
        return events, generation

    events, generation = asyncio.run(collect())
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert isinstance(events[-1], DoneEvent) and generation.stats is events[-1].stats
    # every token's event, in order: a lost one would leave a gap in the greedy reply
    assert smollm2_reference.follows(prompt, "".join(e.text for e in tokens),
                                     generation.stats.finish_reason) >= 8


@pytest.mark.numerics
def test_greedy_streams_picked_together_match_llama_cpps_greedy(smollm2, monkeypatch):
    """Several greedy streams in one step take their tokens from one argmax over all the
    step's logits rows: each must get exactly what llama.cpp's own greedy sampler picks
    from its own row (rows in batch order, prompt rows among them), in the same step."""
    params = SamplingParams(temperature=0, max_tokens=24)
    prompts = [smollm2.tokenize(f"{topic}: once upon a time") for topic in
               ("A story about the sea", "Notes on Paris", "Recipe", "Why the sky is blue")]
    greedy = llama_cpp.llama_sampler_init_greedy()
    checked: list[tuple[int, int]] = []  # (the shared argmax's pick, llama.cpp's)
    original = batch_module.StepBatch.greedy_picks

    def checking(self, slots):
        picks = original(self, slots)
        for slot in slots:
            if picks is not None and slot.task and slot.batch_index >= 0 and slot.sampler.argmax:
                own = llama_cpp.llama_sampler_sample(greedy, self.native.ctx, slot.batch_index)
                checked.append((int(picks[slot.output_row]), own))
        return picks

    monkeypatch.setattr(batch_module.StepBatch, "greedy_picks", checking)
    generations = [smollm2.generate(p, params) for p in prompts]  # all queued at once
    replies = [[e.token for e in g if isinstance(e, TokenEvent)] for g in generations]
    llama_cpp.llama_sampler_free(greedy)
    assert all(len(r) > 10 for r in replies)
    assert len(set(map(tuple, replies))) == len(prompts)  # four different replies
    assert len(checked) > 20  # most steps picked for two streams at once
    assert all(shared == own for shared, own in checked), checked


def test_a_draw_whose_chain_selects_nothing_fails_the_request_not_the_next(monkeypatch,
                                                                            smollm2):
    """The draw over the tokens near the best logit reads the candidate llama.cpp's chain
    selected; an index outside them (none selected) ends the request with an error rather
    than writing a token read from past the candidates, and the engine serves the next."""
    monkeypatch.setattr(llama_cpp, "llama_sampler_apply", lambda chain, array: None)
    with pytest.raises(EngineError, match="sampler chose candidate -1"):
        smollm2.chat(QUESTION, SamplingParams(seed=1, max_tokens=8)).text()
    monkeypatch.undo()
    assert smollm2.chat(QUESTION, SamplingParams(seed=1, max_tokens=8)).text()
