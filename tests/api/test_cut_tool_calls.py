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


def _inside_arguments(ask, whole_tokens: int):
    """What `ask(limit)` answers for the first limit, from two tokens short of the whole
    call's end down, that stops inside the call's arguments (the greedy path may close the
    arguments a few tokens before the call itself ends): its last item is the arguments."""
    for limit in range(_cut(whole_tokens), max(whole_tokens - 10, 4), -1):
        answer = ask(limit)
        if answer[-1] and _not_whole(answer[-1]):
            return answer
    pytest.fail(f"no limit short of {whole_tokens} tokens stopped inside the arguments")


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

    def ask(limit: int) -> tuple[list[str], str]:
        if stream:
            chunks = list(client.chat.completions.create(stream=True,
                                                         **{**args, "max_tokens": limit}))
            return ([c.finish_reason for ch in chunks for c in ch.choices if c.finish_reason],
                    "".join(t.function.arguments or "" for ch in chunks for c in ch.choices
                            for t in c.delta.tool_calls or []))
        reply = client.chat.completions.create(**{**args, "max_tokens": limit})
        return ([reply.choices[0].finish_reason],
                "".join(t.function.arguments for t in reply.choices[0].message.tool_calls
                        or []))

    finish, _ = _inside_arguments(ask, whole.usage.completion_tokens)
    assert finish == ["length"]


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

    def ask(limit: int) -> tuple[str, list, str]:
        response = client.responses.create(**{**args, "max_output_tokens": limit})
        calls = [item for item in response.output if item.type == "function_call"]
        return response.status, calls, calls[-1].arguments if calls else ""

    status, calls, _ = _inside_arguments(ask, whole.usage.output_tokens)
    assert status == "incomplete" and calls[-1].status == "incomplete"
