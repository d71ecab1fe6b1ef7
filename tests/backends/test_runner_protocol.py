"""The runner's protocol: each message crosses as itself, errors by their registered type."""

from __future__ import annotations

import pickle

import pytest

from localinfer.backends.base import (DoneEvent, ErrorEvent, LoadOptions, ModelInfo,
                                     SamplingParams, TokenEvent)
from localinfer.backends.metrics import RequestStats
from localinfer.backends.rpc.library import RpcUnavailable
from localinfer.backends.runner import protocol as p
from localinfer.errors import (EngineError, InvalidRequest, LocalinferError, ModelError,
                               PromptTooLong, RunnerDied)

PARAMS = SamplingParams(temperature=0, max_tokens=4, stop=("\n",), logit_bias={3: -100})
INFO = ModelInfo("m", "/m.gguf", "llama", "Q4_1", 256, 8192, 2, 135_000_000, 98_000_000)
STATS = RequestStats(submitted_at=1.0, token_times=[1.1, 1.2], prompt_tokens=3,
                     finish_reason="stop")
MESSAGES = [{"role": "user", "content": "hi"}]


def _crossed(message: object) -> object:
    return pickle.loads(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


EVERY = [
    p.Tokenize("hi", add_special=False), p.Detokenize([1, 2]),
    p.ApplyChatTemplate(MESSAGES, True, {"tools": []}), p.PromptTokens(MESSAGES, None, ()),
    p.Generate([1, 2, 3], PARAMS), p.Start(PARAMS, MESSAGES, None, None, ()), p.Embed("hi"), p.Rerank("q", ["a", "b"]),
    p.Stats(), p.FewestTokens(12), p.InfillTokens("a", "b", [("f.py", "x")], "", 64),
    p.Load(p.VERSION, "/m.gguf", LoadOptions(n_ctx=256), "m", {"localinfer": 20}),
    p.Request(7, p.Tokenize("hi")), p.Cancel(7), p.CancelAll(), p.Close(), p.Ready(INFO),
    p.LoadFailed(p.WireError.of(InvalidRequest("no"))), p.Reply(7, [1, 2]),
    p.Refused(7, p.WireError.of(PromptTooLong(300, 256))),
    p.Events([p.Token(7, "a", 5, 0, ()), p.Done(7, STATS),
              p.Failed(8, p.WireError.of(RunnerDied("gone")))]),
    p.Beat(12), p.Closed(),
]


@pytest.mark.parametrize("message", EVERY, ids=lambda m: type(m).__name__)
def test_each_message_crosses_as_itself(message):
    assert _crossed(message) == message
    assert not hasattr(message, "__dict__")  # slots: its fields are all it carries
    crossed = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    assert b"__dict__" not in crossed and b"copyreg" not in crossed  # its class + its fields


def test_every_call_is_covered():
    assert {type(m) for m in EVERY} >= set(p.CALLS)


def test_events_become_the_engines_events_again():
    token, done, failed = _crossed(p.Events([p.outgoing(1, TokenEvent("a", 5, 0)),
                                             p.outgoing(1, DoneEvent(STATS)),
                                             p.outgoing(2, ErrorEvent(RunnerDied("x")))])).batch
    assert token.event() == TokenEvent("a", 5, 0) and done.event() == DoneEvent(STATS)
    assert isinstance(failed.event().error, RunnerDied)


def test_errors_arrive_as_their_registered_type_with_their_figures():
    error = _crossed(p.WireError.of(PromptTooLong(300, 256))).error()
    assert type(error) is PromptTooLong and (error.n_prompt, error.n_ctx) == (300, 256)
    assert str(error) == str(PromptTooLong(300, 256))
    assert type(p.WireError.of(RpcUnavailable("no rpc")).error()) is RpcUnavailable
    # a type the registry lacks: the nearest it is made from that it has
    class QuantGone(ModelError):  # (a subclass of our errors that no registry lists)
        pass

    gone = p.WireError.of(QuantGone("the quant went away")).error()
    assert type(gone) is ModelError and str(gone) == "the quant went away"


def test_errors_the_registry_does_not_know_arrive_as_engine_errors():
    class Private(LocalinferError):
        pass

    for exc, text in [(Private("mine"), "mine"), (KeyError("k"), "KeyError: 'k'")]:
        error = p.WireError.of(exc).error()
        assert type(error) is EngineError and str(error) == text
    newer = p.WireError("SomethingNew", "from a newer runner", {}).error()  # a name unknown here
    assert type(newer) is EngineError and str(newer) == "from a newer runner"
    bad_text = p.WireError.of(UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"))
    assert type(bad_text.error()) is InvalidRequest and "Unicode" in str(bad_text.error())


def test_the_hello_is_a_plain_tuple():
    """Any two versions read each other's hello: it never becomes a class of the protocol."""
    assert _crossed((p.HELLO, p.VERSION)) == ("localinfer runner", p.VERSION)
