"""The unmodified `anthropic` client against a real `localinfer serve`: the Messages API."""

from __future__ import annotations

import anthropic
import pytest

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0}  # (the client has no sampling arguments: the body carries it)


@pytest.fixture(scope="module")
def client(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def test_a_message_with_its_stop_reason_and_usage(client):
    reply = client.messages.create(model="smollm2:135m", max_tokens=8, messages=QUESTION,
                                   system="Answer in one word.", extra_body=GREEDY)
    assert reply.role == "assistant" and reply.type == "message"
    assert [b.type for b in reply.content] == ["text"] and reply.content[0].text
    assert reply.stop_reason in ("end_turn", "max_tokens")
    assert reply.usage.input_tokens > 10 and 1 <= reply.usage.output_tokens <= 8
    capped = client.messages.create(model="smollm2:135m", max_tokens=2, extra_body=GREEDY,
                                    messages=[{"role": "user", "content": "Tell me a story."}])
    assert capped.stop_reason == "max_tokens" and capped.usage.output_tokens == 2


def test_a_stop_sequence_is_named_where_it_ended_the_reply(client):
    vowels = ["e", "a", "o", "i"]  # (forty tokens of English without one: not from this model)
    reply = client.messages.create(model="smollm2:135m", max_tokens=40, messages=QUESTION,
                                   extra_body=GREEDY, stop_sequences=vowels)
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence in vowels
    assert not any(v in reply.content[0].text for v in vowels)  # cut before it


def test_the_stream_is_anthropics_events_and_equals_its_text(client):
    with client.messages.stream(model="smollm2:135m", max_tokens=12, messages=QUESTION,
                                extra_body=GREEDY) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == final.content[0].text
    assert final.stop_reason in ("end_turn", "max_tokens") and final.usage.output_tokens >= 1
    kinds = []
    with client.messages.stream(model="smollm2:135m", max_tokens=4, messages=QUESTION) as s:
        kinds = [event.type for event in s]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_delta" in kinds and "message_delta" in kinds


def test_bad_requests_are_anthropic_errors(client):
    with pytest.raises(anthropic.BadRequestError, match="image"):
        client.messages.create(model="smollm2:135m", max_tokens=4, messages=[{
            "role": "user", "content": [{"type": "image", "source": {
                "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}])
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="no-such-model", max_tokens=4, messages=QUESTION)
    assert missing.value.body["error"]["type"] == "not_found_error"


@pytest.mark.slow
def test_the_clients_own_key_header_is_taken(tmp_path):
    from .conftest import start_server, stop_server

    server = start_server(tmp_path / "home", "--api-key", "sekrit-key-1", "--ctx", "256",
                          "--parallel", "1")
    try:
        good = anthropic.Anthropic(base_url=server.url, api_key="sekrit-key-1", max_retries=0)
        reply = good.messages.create(model="smollm2:135m", max_tokens=2, messages=QUESTION)
        assert reply.content[0].text is not None
        bad = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as refused:
            bad.messages.create(model="smollm2:135m", max_tokens=2, messages=QUESTION)
        assert refused.value.body["error"]["type"] == "authentication_error"
    finally:
        stop_server(server)
