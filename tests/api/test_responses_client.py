"""The Responses API through the unmodified `openai` client (`responses.create`, streamed
and not, and its `responses.stream` helper): text, structured output, a stored response
continued by previous_response_id, and refusals."""

from __future__ import annotations

import json

import openai
import pytest

from .conftest import NO_END


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_text_in_text_out(client):
    response = client.responses.create(model="smollm2:135m", input="Say hello.",
                                       instructions="Answer in one word.", temperature=0,
                                       max_output_tokens=8)
    assert response.object == "response" and response.output_text
    assert response.output[0].type == "message" and response.output[0].role == "assistant"
    assert response.usage.input_tokens > 5 and 0 < response.usage.output_tokens <= 8
    assert response.status in ("completed", "incomplete")


def test_a_reply_cut_by_max_output_tokens_is_incomplete(client):
    response = client.responses.create(model="smollm2:135m", input="Count to fifty.",
                                       max_output_tokens=4, extra_body={"logit_bias": NO_END})
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"


def test_the_chat_completions_sampling_fields_apply_as_llama_server_takes_them(client):
    # (llama-server passes a Responses body's other fields on to its chat completion)
    ended = client.responses.create(model="smollm2:135m", input="Count to fifty.",
                                    temperature=0, max_output_tokens=8,
                                    extra_body={"logit_bias": {"2": 100}})
    assert ended.status == "completed" and ended.usage.output_tokens <= 1
    # (a stop every reply of 16 words and more meets: without it, 16 tokens and "incomplete")
    stopped = client.responses.create(model="smollm2:135m", input="Count to fifty.",
                                      temperature=0, max_output_tokens=16,
                                      extra_body={"logit_bias": NO_END, "stop": [" "]})
    assert stopped.status == "completed" and " " not in stopped.output_text


def test_streamed_events_add_up_to_the_response(client):
    events = list(client.responses.create(model="smollm2:135m", input="Tell me a story.",
                                          max_output_tokens=12, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    # (completed, or incomplete for a story cut at 12 tokens)
    assert kinds[-1] == f"response.{events[-1].response.status}"
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert "response.output_item.added" in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas and deltas == events[-1].response.output_text
    with client.responses.stream(model="smollm2:135m", input="Tell me a story.",
                                 max_output_tokens=12) as stream:
        # (its get_final_response wants response.completed: a story cut at 12 tokens ends
        # with response.incomplete, as OpenAI's does, which the helper passes on)
        last = list(stream)[-1]
    assert last.type in ("response.completed", "response.incomplete")
    assert last.response.output_text


def test_previous_response_id_continues_a_stored_response(client):
    first = client.responses.create(model="smollm2:135m", input="My name is Ada.",
                                    temperature=0, max_output_tokens=8)
    alone = client.responses.create(model="smollm2:135m", input="What is my name?",
                                    temperature=0, max_output_tokens=8, store=False)
    after = client.responses.create(model="smollm2:135m", input="What is my name?",
                                    temperature=0, max_output_tokens=8,
                                    previous_response_id=first.id)
    # the stored conversation comes first: its input, then the reply, then the new input
    assert after.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens
    with pytest.raises(openai.NotFoundError, match="no stored response"):
        client.responses.create(model="smollm2:135m", input="Hi",
                                previous_response_id=alone.id)


def test_structured_output_follows_the_schema(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
              "required": ["city"], "additionalProperties": False}
    response = client.responses.create(
        model="smollm2:135m", input="Where is the Eiffel tower?", temperature=0,
        max_output_tokens=40,
        text={"format": {"type": "json_schema", "name": "place", "schema": schema}})
    assert list(json.loads(response.output_text)) == ["city"]


_PNG = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGNg"
        "ZGIGAAAOAAfXb+R4AAAAAElFTkSuQmCC")  # one pixel


@pytest.mark.parametrize("bad, says", [
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}]},
     "only text parts and input_image"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": _PNG}]}]},
     "takes no images"),
    ({"input": "hi", "tools": [{"type": "namespace", "name": "ns", "tools": "x"}]},
     "namespace needs"),
    ({"input": [{"type": "computer_call"}]}, "not supported"),
])
def test_what_it_cannot_do_is_a_400_naming_it(client, bad, says):
    with pytest.raises(openai.BadRequestError, match=says):
        client.responses.create(model="smollm2:135m", **bad)


def test_stored_responses_are_bounded_oldest_first(monkeypatch):
    """The store keeps the last MAX_STORED responses and at most MAX_STORED_BYTES of them;
    one let go is a 404 naming it."""
    from localinfer.api import responses
    from localinfer.api.errors import ApiError

    monkeypatch.setattr(responses, "MAX_STORED", 3)
    monkeypatch.setattr(responses, "MAX_STORED_BYTES", 400)
    store = responses._Store()

    def kept(text: str) -> responses._Kept:
        return responses._Kept([{"role": "user", "content": text}], {}, [])

    for i in range(4):
        store.put(f"resp_{i}", kept(f"question {i}"))
    with pytest.raises(ApiError, match="no stored response 'resp_0'"):
        store.get("resp_0")
    assert store.get("resp_3") == [{"role": "user", "content": "question 3"}]
    store.put("resp_big", kept("x" * 300))  # past the bytes
    with pytest.raises(ApiError):
        store.get("resp_1")
    assert store.get("resp_big")[0]["content"] == "x" * 300


def test_a_stored_response_is_read_back_listed_and_deleted(client):
    """GET /v1/responses/{id}, its input_items, DELETE: they were 404s while
    previous_response_id found the same response."""
    first = client.responses.create(model="smollm2:135m", input="Say hi.", max_output_tokens=4)
    again = client.responses.retrieve(first.id)
    assert (again.id, again.status, again.output_text) == (first.id, first.status,
                                                           first.output_text)
    turns = [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"},
             {"role": "user", "content": "three"}]
    streamed = client.responses.create(model="smollm2:135m", input=turns, max_output_tokens=4,
                                       stream=True)
    done = [e.response for e in streamed if e.type.startswith("response.")
            and e.type.split(".")[1] in ("completed", "incomplete")][-1]
    assert client.responses.retrieve(done.id).status == done.status
    listed = client.responses.input_items.list(done.id, order="asc")
    assert [item.content for item in listed.data] == ["one", "two", "three"]
    assert [i.id for i in client.responses.input_items.list(done.id).data] == [
        i.id for i in reversed(listed.data)]  # (newest first unless asked)
    page = client.responses.input_items.list(done.id, order="asc", limit=2)
    assert len(page.data) == 2 and page.has_more
    rest = client.responses.input_items.list(done.id, order="asc", after=page.data[-1].id)
    assert [item.content for item in rest.data] == ["three"] and not rest.has_more
    with pytest.raises(openai.NotFoundError):  # (an item it does not hold)
        client.responses.input_items.list(done.id, after="msg_nosuch")
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="smollm2:135m", input="More.", max_output_tokens=4,
                                previous_response_id=first.id)
