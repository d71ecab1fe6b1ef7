"""A tool call cut by the reply's token limit is not a finished call: each dialect says the
limit ended it (its arguments are not whole JSON), as OpenAI, Anthropic and the Responses
API do — an agent that read "tool_calls" ran the tool on arguments it could not parse."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

ASK = [{"role": "user", "content": "What's the weather in Paris?"}]
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}},
              "required": ["city"]}
WHOLE = 60  # tokens: room for the whole call


def _cut(whole_tokens: int) -> int:
    """A limit two tokens short of the whole call's end: past its name, inside its
    arguments, wherever this CPU's greedy path put the tokens."""
    assert whole_tokens > 6, whole_tokens
    return whole_tokens - 2


def _not_whole(arguments: str) -> bool:
    try:
        json.loads(arguments)
    except ValueError:
        return True
    return False


@pytest.mark.parametrize("stream", [False, True])
def test_openai_says_length(server, stream):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    args = dict(model="smollm2:135m", temperature=0, max_tokens=WHOLE, messages=ASK,
                tools=[{"type": "function", "function": {"name": "get_weather",
                                                         "parameters": PARAMETERS}}],
                tool_choice="required")
    whole = client.chat.completions.create(**args)
    assert whole.choices[0].finish_reason == "tool_calls"
    args["max_tokens"] = _cut(whole.usage.completion_tokens)
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **args))
        finish = [c.finish_reason for ch in chunks for c in ch.choices if c.finish_reason]
        arguments = "".join(t.function.arguments or "" for ch in chunks for c in ch.choices
                            for t in c.delta.tool_calls or [])
    else:
        reply = client.chat.completions.create(**args)
        finish = [reply.choices[0].finish_reason]
        arguments = "".join(t.function.arguments for t in reply.choices[0].message.tool_calls
                            or [])
    assert finish == ["length"] and arguments and _not_whole(arguments)


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_says_max_tokens(server, stream):
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    args = dict(model="smollm2:135m", max_tokens=WHOLE, messages=ASK,
                extra_body={"temperature": 0},
                tools=[{"name": "get_weather", "input_schema": PARAMETERS}],
                tool_choice={"type": "any"})
    whole = client.messages.create(**args)
    assert whole.stop_reason == "tool_use"
    args["max_tokens"] = _cut(whole.usage.output_tokens)
    if stream:
        with client.messages.stream(**args) as events:
            reply = events.get_final_message()
    else:
        reply = client.messages.create(**args)
    assert reply.stop_reason == "max_tokens"
    assert [block.name for block in reply.content if block.type == "tool_use"] == ["get_weather"]


def test_responses_marks_the_call_incomplete(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    args = dict(model="smollm2:135m", input="What's the weather in Paris?", temperature=0,
                max_output_tokens=WHOLE, tool_choice="required",
                tools=[{"type": "function", "name": "get_weather", "parameters": PARAMETERS}])
    whole = client.responses.create(**args)
    assert whole.status == "completed"
    assert [i.status for i in whole.output if i.type == "function_call"] == ["completed"]
    args["max_output_tokens"] = _cut(whole.usage.output_tokens)
    response = client.responses.create(**args)
    calls = [item for item in response.output if item.type == "function_call"]
    assert response.status == "incomplete" and calls and calls[-1].status == "incomplete"
    assert _not_whole(calls[-1].arguments)
