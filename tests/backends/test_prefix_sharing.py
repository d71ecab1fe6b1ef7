"""A request takes another slot's KV for a shared prefix (the same system prompt)."""

from __future__ import annotations

import pytest

from localinfer.backends.base import LoadOptions, SamplingParams, TokenEvent
from localinfer.backends.engine.draft import common_prefix
from localinfer.backends.llamacpp import LlamaCppBackend

from ..greedy import eog_ban

SYSTEM = "You are a helpful assistant who answers questions about geography in full sentences. " * 3
QUESTIONS = ["What is the capital of Japan?", "Name the largest ocean.", "What is the tallest mountain?"]
GREEDY = SamplingParams(temperature=0, max_tokens=12)


def _messages(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


@pytest.fixture(scope="module")
def four_slots(smollm2_path):
    backend = LlamaCppBackend(smollm2_path, LoadOptions(n_ctx=1024, n_slots=4), name="smollm2:135m")
    yield backend
    backend.close()


def test_free_slots_borrow_the_prefix_of_a_busy_one(four_slots, smollm2_reference):
    busy = four_slots.chat(_messages("What is the capital of France?"),
                           SamplingParams(temperature=0, max_tokens=200,
                                          logit_bias=eog_ban(four_slots.native)))
    events = iter(busy)
    assert isinstance(next(events), TokenEvent)  # its prompt's KV is in place
    prompts = [four_slots.tokenize(four_slots.apply_chat_template(_messages(q))) for q in QUESTIONS]
    generations = [four_slots.generate(p, GREEDY) for p in prompts]
    warm = [g.text() for g in generations]
    busy.cancel()
    for _ in events:
        pass
    # each prefilled little more than its question (the system prompt is most of the prompt)
    assert all(g.stats.cached_tokens > g.stats.prompt_tokens * 0.7 for g in generations)
    # and the copied KV gives what a fresh prefill gives: each reply is the reference's greedy
    # reply to the whole prompt, token by token (up to near-ties: see tests/greedy.py)
    for prompt, text, g in zip(prompts, warm, generations):
        assert smollm2_reference.follows(prompt, text, g.stats.finish_reason) >= 6


def test_a_file_whose_first_lines_went_keeps_the_rest_cached(smollm2):
    """An editor's window over a file moves down a few lines: the prompt loses text the slot
    holds and goes on with the rest of it. That rest (over 256 tokens: --cache-reuse's
    default) is moved into place in llama.cpp's cache, not read again; the slot then holds
    exactly the new prompt — llama.cpp refuses a decode whose positions do not follow the
    sequence's, and the same prompt again is all cached."""
    head = smollm2.tokenize("# reuse check: a file seen through a moving window\n")
    gone = smollm2.tokenize("".join(f"line_{i} = {i}\n" for i in range(8)), add_special=False)
    rest = smollm2.tokenize("".join(f"value_{i} = compute({i}) * {i % 5}\n"
                                    for i in range(40)), add_special=False)
    assert len(rest) > 256
    first = smollm2.generate(head + gone + rest, GREEDY)
    first.text()
    assert first.stats.finish_reason == "length"
    typed = smollm2.tokenize("result = ", add_special=False)
    second = smollm2.generate(head + rest + typed, GREEDY)
    assert second.text() and second.stats.finish_reason == "length"
    assert second.stats.cached_tokens >= len(head) + len(rest)
    again = smollm2.generate(head + rest + typed, GREEDY)
    again.text()
    assert again.stats.cached_tokens == len(head + rest + typed) - 1


@pytest.mark.parametrize("n, unified", [(2, False), (4, False), (4, True)])
def test_prompts_arriving_together_read_their_shared_start_once(smollm2_path, smollm2_reference,
                                                                n, unified):
    """Requests with one long system prompt, taken in the same step (the engine held until
    all are queued): the first reads the system prompt, the others wait for it and take its
    KV, then read their questions (Engine._share_reads; with two, the one left reading is
    the one that waited; in one pool of cells, --kv-unified, the copy shares the cells).
    Before, each read it side by side, n times the work. Each reply is still the
    reference's."""
    import threading

    system = "You are a careful librarian who answers questions about old maps. " * 12
    messages = [[{"role": "system", "content": system}, {"role": "user", "content": q}]
                for q in (QUESTIONS + ["Which river is the longest?"])[:n]]
    with LlamaCppBackend(smollm2_path, LoadOptions(n_ctx=1024, n_slots=4,
                                                   kv_unified=unified)) as backend:
        prompts = [backend.tokenize(backend.apply_chat_template(m)) for m in messages]
        shared = min(common_prefix(prompts[0], p) for p in prompts[1:])
        assert shared > 120 and all(len(p) - shared < 30 for p in prompts)
        entered, gate = threading.Event(), threading.Event()
        held = threading.Thread(target=backend.engine.call,
                                args=(lambda: entered.set() or gate.wait(30),))
        held.start()
        assert entered.wait(30)  # the engine thread waits in it, between two steps
        before = backend.stats().tokens_evaluated
        generations = [backend.generate(p, GREEDY) for p in prompts]
        gate.set()
        held.join(30)
        texts = [g.text() for g in generations]
        evaluated = backend.stats().tokens_evaluated - before
    # the system prompt once, each question once (and the template's tokens around them)
    assert evaluated < max(map(len, prompts)) + sum(len(p) - shared for p in prompts) + 8
    assert sorted(g.stats.cached_tokens >= shared - 1 for g in generations) == [
        False] + [True] * (n - 1)
    for prompt, text, g in zip(prompts, texts, generations):
        assert smollm2_reference.follows(prompt, text, g.stats.finish_reason) >= 6
