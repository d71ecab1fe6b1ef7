"""Recurrent and hybrid models keep a recurrent state per sequence, which llama.cpp cannot cut
at an earlier token: it says no to most such cuts, and yes to some it cannot do (a middle
part removed, a cut within its snapshots past what the last decode allows), leaving the
state wrong. Speculative decoding, cached prefixes and cache reuse must still give what a
fresh decode of the prompt gives (the reference, tests/greedy.py), and never report cached
what was read again. Random-weight models of Qwen3.5's hybrid (Gated DeltaNet, one attention
layer in four), LFM2's (short convolutions) and Mamba2's shapes (tests/families.py)."""

from __future__ import annotations

import logging
import threading

import llama_cpp
import numpy
import pytest

from localinfer.backends.base import LoadOptions, SamplingParams, TokenEvent
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.errors import ModelLoadFailed

from ..families import ARCH_FAMILIES, arch_model, family_model
from ..greedy import Reference

pytestmark = pytest.mark.numerics

GREEDY = SamplingParams(temperature=0, max_tokens=40)
TEXT = ("The river rose in the spring and the town moved its market up the hill, where the "
        "old church stood. Every year after that the traders came back to the same square, "
        "and the songs they sang about the flood were taught to children who never saw it. ")


@pytest.fixture(scope="module", params=["qwen35", "lfm2", "mamba2"])
def arch(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def path(arch):
    return arch_model(arch)


@pytest.fixture(scope="module")
def reference(path):
    reference = Reference(path)
    yield reference
    reference.close()


def _backend(path, **options) -> LlamaCppBackend:
    return LlamaCppBackend(path, LoadOptions(**{"n_ctx": 1024, **options}), name="model")


def test_what_the_model_is_is_read_from_it(path, arch):
    with _backend(path) as backend:
        native = backend.native
        assert (native.recurrent, native.hybrid) == {
            "qwen35": (False, True), "lfm2": (False, True), "mamba2": (True, False)}[arch]
        assert native.stateful and not native.can_shift()


def _drafter(arch: str) -> str | None:
    """A llama-shaped random model of the same tokenizer (a pure recurrent model gets prompt
    lookup, and refuses it)."""
    if arch == "mamba2":
        return None
    template, vocab, added = ARCH_FAMILIES[arch]
    return str(family_model(template, vocab, added))


def test_speculative_decoding_rolls_back_what_it_rejected(path, arch, reference, caplog):
    """It crashed at the first rejected guess ("llama_decode returned -1"): the guesses
    stayed in the state. A hybrid rolls them back by llama.cpp's snapshots of its state;
    a pure recurrent model keeps none, so it decodes plainly, saying so once. Sampled, so
    most guesses are wrong (a random model's greedy text repeats one token, which every
    guess gets right); after it, the state holds exactly the reply's tokens: the same
    prompt and reply sent again reads only the last token, and its logits are a fresh
    decode's (a state that kept a rejected guess is as far off as one token too many)."""
    with caplog.at_level(logging.WARNING, "localinfer.engine"), \
            _backend(path, draft_tokens=4, draft_model=_drafter(arch)) as backend:
        prompt = backend.tokenize(TEXT * 3)
        generation = backend.generate(prompt, SamplingParams(temperature=1.5, seed=7,
                                                             max_tokens=40, logprobs=0))
        # (each written token's id, by its log probability: an event's text may hold several)
        written = [entry[0] for e in generation if isinstance(e, TokenEvent)
                   for entry in e.logprobs]
        stats = generation.stats
        got, again = _logits_after(backend, prompt + written)
    assert stats.finish_reason == "length" and len(written) == 40
    if arch == "mamba2":
        assert stats.draft_tokens == 0
        assert "speculative decoding is off" in caplog.text
        return
    assert stats.draft_tokens > stats.accepted_tokens  # (rolled back, the most of them)
    assert again.cached_tokens == len(prompt) + len(written) - 1
    _close(got, _fresh(reference, prompt + written),
           _fresh(reference, prompt + written[:-1] + written[-2:]), floor=1e-2)


def _logits_after(backend: LlamaCppBackend, tokens: list[int]):
    """A request's prompt read, and the logits it left for its first token (the engine's
    last decode, once the request is done), with its numbers."""
    generation = backend.generate(tokens, SamplingParams(temperature=0, max_tokens=1))
    generation.text()
    row = llama_cpp.llama_get_logits_ith(backend.native.ctx, -1)
    return numpy.ctypeslib.as_array(row, shape=(backend.native.n_vocab,)).copy(), \
        generation.stats


def _fresh(reference: Reference, tokens: list[int]) -> numpy.ndarray:
    llama_cpp.llama_memory_clear(reference.model.memory, True)
    return reference._decode(tokens)


def _close(got: numpy.ndarray, want: numpy.ndarray, wrong: numpy.ndarray,
           floor: float = 1e-4) -> None:
    """`got` is the fresh decode's logits (`want`), well within how far the wrong state's
    (`wrong`) are from them; `floor`: what other batch shapes' floats may move them by."""
    off = float(numpy.abs(want - wrong).max())
    assert float(numpy.abs(got - want).max()) < max(0.2 * off, floor), (off,)


def test_a_prompt_that_drops_a_middle_chunk_is_read_again_not_answered_from_the_old(
        path, reference):
    """With cache reuse on, a prompt without the cached prompt's middle chunk was answered
    as if the chunk were there (a removal in the middle is a yes that does nothing to a
    recurrent state) and reported its last chunk cached."""
    with _backend(path, cache_reuse=8) as backend:
        first, middle, last = (backend.tokenize(TEXT * 2, add_special=False)[:60],
                               backend.tokenize("A list of numbers: " + " ".join(
                                   str(n) for n in range(40)), add_special=False)[:60],
                               backend.tokenize(TEXT[::-1], add_special=False)[:60])
        more = backend.tokenize(" And the rest.", add_special=False)
        _logits_after(backend, first + middle + last)
        got, stats = _logits_after(backend, first + last + more)
    assert stats.cached_tokens <= len(first)
    _close(got, _fresh(reference, first + last + more),
           _fresh(reference, first + middle + last + more))


def test_a_conversation_whose_reply_came_back_otherwise_is_read_again(path, reference):
    """The next turn holds the cached prompt and then another reply text than the one
    cached (a client that trimmed it): the state cannot be cut back to the prompt. (With
    no checkpoint to go back to: test_checkpoints.py has those.)"""
    with _backend(path, draft_tokens=4, ctx_checkpoints=0) as backend:  # (a hybrid keeps
        # snapshots: its cuts within them are a yes that may leave it wrong)
        prompt = backend.tokenize(TEXT)
        reply = backend.generate(prompt, SamplingParams(temperature=1.5, seed=1,
                                                        max_tokens=3))
        reply.text()
        again = prompt + backend.tokenize(" A different reply. And then?", add_special=False)
        got, stats = _logits_after(backend, again)
    assert stats.cached_tokens in (0, len(prompt))
    _close(got, _fresh(reference, again), _fresh(reference, prompt[:-2] + again[-8:]))


def test_a_prefix_held_by_a_busy_slot_is_not_borrowed_past_what_it_shares(path, reference):
    """Another slot's longer state holding the same start was copied and "cut" back to the
    shared prefix: the cut is refused, and the copy held the other request's text too."""
    with _backend(path, n_slots=2) as backend:
        start = backend.tokenize(TEXT)
        busy = backend.generate(start + backend.tokenize(" One way.", add_special=False),
                                SamplingParams(temperature=0, max_tokens=400))
        writing = threading.Event()

        def read() -> None:
            for _ in busy:
                writing.set()

        first = threading.Thread(target=read)
        first.start()
        assert writing.wait(60)  # (its prompt is in its slot's state)
        other = start + backend.tokenize(" Another way, longer.", add_special=False)
        generation = backend.generate(other, GREEDY)
        text = generation.text()
        busy.cancel()
        first.join()
    assert generation.stats.cached_tokens == 0
    # (a random model writes bytes that are no UTF-8 now and then, shown as U+FFFD: the
    # reply is judged up to the first)
    valid = text.split("\ufffd")[0]
    finish = generation.stats.finish_reason if valid == text else None
    assert reference.follows(other, valid, finish) >= min(len(valid), 10)


def test_a_recurrent_draft_model_is_refused_in_one_line(smollm2_path, path):
    """A draft model reads its guesses one at a time and must forget the rejected ones,
    which a recurrent state cannot."""
    with pytest.raises(ModelLoadFailed, match="recurrent state"):
        LlamaCppBackend(smollm2_path, LoadOptions(n_ctx=256, draft_model=str(path)))


def test_the_first_decode_at_load_leaves_no_state_behind(path, reference):
    """The load decodes the start and end tokens once and empties the cache
    (NativeModel.warm_up): a recurrent state that kept them would answer the first request
    as if they came before its prompt, with no error."""
    with _backend(path) as backend:
        assert backend.native.next_position(0) == 0
        prompt = backend.tokenize(TEXT)
        generation = backend.generate(prompt, GREEDY)
        text = generation.text()
    valid = text.split("\ufffd")[0]  # (judged up to a byte that is no UTF-8, as above)
    finish = generation.stats.finish_reason if valid == text else None
    assert reference.follows(prompt, valid, finish) >= min(len(valid), 10)
