"""Generation on the real models through the engine (no mocks of llama.cpp)."""

from __future__ import annotations

import time

import pytest

from localinfer.backends.base import DoneEvent, SamplingParams, TokenEvent
from localinfer.errors import InvalidRequest, PromptTooLong

from ..greedy import eog_ban

GREEDY = SamplingParams(temperature=0, max_tokens=40)
QUESTION = [{"role": "user", "content": "Name three fruits and say why people like them."}]


def _collect(generation):
    received = []  # (arrival time, event)
    for event in generation:
        received.append((time.perf_counter(), event))
    return received


def test_tokens_stream_before_the_end(smollm2):
    received = _collect(smollm2.chat(QUESTION, GREEDY))
    tokens = [(t, e) for t, e in received if isinstance(e, TokenEvent)]
    assert len(tokens) >= 10
    assert isinstance(received[-1][1], DoneEvent)
    # the first piece reached us well before the last one, not all at once at the end
    assert tokens[-1][0] - tokens[0][0] > 0.02


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_stats_are_consistent(model, request):
    backend = request.getfixturevalue(model)
    prompt = backend.tokenize(backend.apply_chat_template(QUESTION))
    generation = backend.generate(prompt, SamplingParams(temperature=0, max_tokens=24))
    text = generation.text()
    s = generation.stats
    assert text.strip()
    assert s.prompt_tokens == len(prompt)
    assert 0 <= s.cached_tokens < len(prompt)
    assert s.generated_tokens == len(s.token_times) >= 2
    assert 0 < s.queue_time <= s.ttft <= s.e2el
    assert s.decode_tps == pytest.approx((s.generated_tokens - 1) / (s.e2el - s.ttft))
    assert s.tpot == pytest.approx((s.e2el - s.ttft) / (s.generated_tokens - 1))
    assert sum(s.itls) == pytest.approx(s.e2el - s.ttft)
    assert s.prefill_tps > 0 and s.finish_reason in ("stop", "length")


def test_fixed_seed_reproduces_sampled_output(smollm2):
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1234,
                            max_tokens=30)
    first = smollm2.chat(QUESTION, params).text()
    second = smollm2.chat(QUESTION, params).text()
    assert first == second
    others = {smollm2.chat(QUESTION, SamplingParams(temperature=1.0, top_k=0, top_p=1.0,
                                                      min_p=0.0, seed=s, max_tokens=30)).text()
              for s in (1, 2, 3)}
    assert len(others | {first}) > 1  # the seed matters: not every seed gives the same reply


def test_max_tokens_is_respected(smollm2):
    generation = smollm2.chat(QUESTION, SamplingParams(temperature=0, max_tokens=5,
                                                       logit_bias=eog_ban(smollm2.native)))
    generation.text()
    assert generation.stats.generated_tokens == 5
    assert generation.stats.finish_reason == "length"


def test_stop_string_split_across_tokens(smollm2):
    events = [e for e in smollm2.chat(QUESTION, GREEDY) if isinstance(e, TokenEvent)]
    pieces = [e.text for e in events]
    full = "".join(pieces)
    # a stop string made of the end of one token and the start of the next
    for i in range(3, len(pieces) - 1):
        stop = pieces[i][-2:] + pieces[i + 1][:2]
        if len(stop) >= 3 and full.find(stop) == len("".join(pieces[:i + 1])) - len(pieces[i][-2:]):
            break
    else:
        pytest.skip("no token pair formed a stop string that appears only once")
    generation = smollm2.chat(QUESTION, SamplingParams(temperature=0, max_tokens=40, stop=(stop,)))
    text = generation.text()
    assert text == full[: full.find(stop)]
    assert generation.stats.finish_reason == "stop"


def test_prompt_longer_than_context_is_refused_and_engine_keeps_working(smollm2):
    long_prompt = smollm2.tokenize("hello " * 2000)
    with pytest.raises(PromptTooLong, match=r"prompt is \d+ tokens but the context holds 1024"):
        smollm2.generate(long_prompt, GREEDY)
    assert smollm2.chat(QUESTION, SamplingParams(temperature=0, max_tokens=3)).text()


def test_bad_token_ids_and_empty_prompt_are_refused(smollm2):
    with pytest.raises(InvalidRequest, match="outside the vocabulary"):
        smollm2.generate([1, 2, 10**9], GREEDY)
    with pytest.raises(InvalidRequest, match="empty"):
        smollm2.generate([], GREEDY)


def test_invalid_sampling_parameters():
    with pytest.raises(InvalidRequest, match="temperature"):
        SamplingParams(temperature=-0.5)
    with pytest.raises(InvalidRequest, match="max_tokens"):
        SamplingParams(max_tokens=0)


def test_cancel_frees_the_slot_within_a_step(smollm2):
    generation = smollm2.chat(QUESTION, SamplingParams(temperature=0, max_tokens=500))
    events = iter(generation)
    assert isinstance(next(events), TokenEvent)
    generation.cancel()
    for _ in events:
        pass
    assert generation.stats.finish_reason == "cancelled"
    assert generation.stats.generated_tokens < 100
    after = smollm2.chat(QUESTION, SamplingParams(temperature=0, max_tokens=4))
    assert after.text() and after.stats.finish_reason == "length"


def test_next_turn_reuses_the_cached_conversation(smollm2):
    reply = smollm2.chat(QUESTION, GREEDY).text()
    turn2 = QUESTION + [{"role": "assistant", "content": reply},
                        {"role": "user", "content": "Which one is red?"}]
    warm = smollm2.chat(turn2, GREEDY)
    assert warm.text()
    first_turn = len(smollm2.tokenize(smollm2.apply_chat_template(QUESTION)))
    assert warm.stats.cached_tokens >= first_turn


def test_prefix_cache_hit_gives_the_cold_output(smollm2, smollm2_reference):
    # (a system prompt of its own: the template's default one, which other tests' chats
    # share, would bring back one of their saved sequences, and the first run not be cold)
    prompt = smollm2.tokenize(smollm2.apply_chat_template(
        [{"role": "system", "content": "Lighthouse keeper's log."},
         {"role": "user", "content": "Describe a lighthouse at night in two sentences."}]))
    for text in ("Count to five.", "Spell cat."):  # push both slots off this prompt
        smollm2.generate(smollm2.tokenize(text), GREEDY).text()
    cold = smollm2.generate(prompt, GREEDY)
    cold_text = cold.text()
    warm = smollm2.generate(prompt, GREEDY)
    warm_text = warm.text()
    assert cold.stats.cached_tokens < len(prompt) // 2
    assert warm.stats.cached_tokens == len(prompt) - 1  # all but the token that yields logits
    # both are the greedy reply: the same text wherever the model's choice is clear (a
    # prefilled prompt and a cached one are different batch shapes: near-ties may part)
    for generation, text in ((cold, cold_text), (warm, warm_text)):
        assert smollm2_reference.follows(prompt, text, generation.stats.finish_reason) > 8


def test_model_info_names_the_quant(smollm2, gemma3):
    assert (smollm2.info.quant, gemma3.info.quant) == ("Q4_1", "Q4_K_M")
    assert (smollm2.info.architecture, gemma3.info.architecture) == ("llama", "gemma3")


def test_both_models_answer(smollm2, gemma3):
    for backend in (smollm2, gemma3):
        g = backend.chat([{"role": "user", "content": "Say hello."}],
                         SamplingParams(temperature=0, max_tokens=12))
        assert g.text().strip()
        assert backend.info.n_ctx == 1024


def test_concurrent_requests_share_slots_and_match_solo_output(smollm2, smollm2_reference):
    """More requests than slots: they queue, share decode steps, and each greedy reply is
    what it would be alone (the reference decodes each alone: see tests/greedy.py)."""
    questions = ["Why is the sky blue?", "What is rain?", "Describe a cat.", "What is a prime?"]
    params = SamplingParams(temperature=0, max_tokens=24)
    prompts = [smollm2.tokenize(smollm2.apply_chat_template([{"role": "user", "content": q}]))
               for q in questions]
    generations = [smollm2.generate(p, params) for p in prompts]
    together = [g.text() for g in generations]
    for prompt, text, generation in zip(prompts, together, generations):
        assert smollm2_reference.follows(prompt, text, generation.stats.finish_reason) > 8
    # with 2 slots the last two waited in the queue for a free slot
    queued = sorted(g.stats.queue_time for g in generations)
    assert queued[-1] > queued[0]


def test_detokenize_round_trips_multibyte_text(smollm2, gemma3):
    text = "Héllo wörld — ünïcode ✓ 日本"
    for backend in (smollm2, gemma3):
        assert backend.detokenize(backend.tokenize(text, add_special=False)) == text


def test_a_reply_cut_inside_a_character_ends_without_a_replacement_mark(smollm2):
    """max_tokens can stop between the bytes of one character: those bytes are held back
    (they were sent as U+FFFD)."""
    native = smollm2.native
    lead = next(t for t in range(native.n_vocab) if native.piece(t) == b"\xf0")  # 4-byte lead
    params = SamplingParams(temperature=0, max_tokens=1, logit_bias=((lead, 100.0),))
    generation = smollm2.generate(smollm2.tokenize("Hi"), params)
    assert generation.text() == ""
    assert generation.stats.generated_tokens == 1 and generation.stats.finish_reason == "length"


def test_a_long_conversation_is_fitted_to_the_context_oldest_turns_first(smollm2):
    from localinfer.repl import fit_to_context

    system = {"role": "system", "content": "Be brief."}
    turns = [{"role": "user" if i % 2 == 0 else "assistant",
              "content": f"Turn {i}: " + "the lighthouse keeper counted the steps " * 8}
             for i in range(30)]
    fitted, dropped = fit_to_context(smollm2, [system, *turns], reserve=256)
    assert dropped > 0 and fitted[0] == system and fitted[-1] == turns[-1]
    assert fitted[1:] == turns[dropped:]  # the oldest went, in order
    prompt = smollm2.tokenize(smollm2.apply_chat_template(fitted))
    assert len(prompt) <= smollm2.info.n_ctx - 256
    unchanged, none = fit_to_context(smollm2, [system, turns[0]], reserve=256)
    assert none == 0 and unchanged == [system, turns[0]]


def test_the_engine_asks_llama_cpp_about_each_token_id_once(smollm2, monkeypatch):
    """A token's end flag and bytes come from llama.cpp once per id: a ctypes call lets go of
    the GIL, and at GPU step rates getting it back cost the engine thread ~20% of a step
    (bench/step_profile.md). What is cached must still be llama.cpp's answer."""
    import llama_cpp

    prompt = smollm2.tokenize("List the days of the week:", add_special=False)
    params = SamplingParams(temperature=0, max_tokens=16)
    first = [e for e in smollm2.generate(prompt, params) if isinstance(e, TokenEvent)]
    reply = [e.token for e in first]
    # the cached bytes are what llama.cpp gives (detokenize asks it afresh, in its own buffer)
    assert "".join(e.text for e in first) == smollm2.detokenize(reply)
    native = smollm2.native
    assert native.is_eog(native.eos()) and not any(native.is_eog(t) for t in reply)
    calls = []
    for name in ("llama_vocab_is_eog", "llama_token_to_piece"):
        real = getattr(llama_cpp, name)
        monkeypatch.setattr(llama_cpp, name,
                            lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a))
    again = [e.token for e in smollm2.generate(prompt, params) if isinstance(e, TokenEvent)]
    assert again == reply
    assert calls == []  # every token of the same reply was already known
