"""Real model families through the unmodified clients: each family's own template writes the
tools, and its own syntax is read back — tool calls streamed as OpenAI and Ollama stream
them, reasoning apart from the answer. The models are random-weight GGUFs with the
families' real tokenizers and templates (tests/families.py); a test that needs the model to
say a given text forces it with a grammar (llama-server's `grammar` extension), so what is
tested is how the text is taken apart and sent."""

from __future__ import annotations

import json

import anthropic
import httpx
import ollama
import openai
import pytest

from ..families import family_model, install, saying
from .conftest import start_server, stop_server

pytestmark = pytest.mark.slow

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"]}}}
ASK = [{"role": "user", "content": "What's the weather in Paris?"}]
MODELS = {"qwen3": ("Qwen-Qwen3-0.6B", "qwen2"),
          "r1": ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "qwen2"),
          "llama31": ("meta-llama-Llama-3.1-8B-Instruct", "llama-bpe")}


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    home = tmp_path_factory.mktemp("families-home")
    names = {key: install(home, family_model(*source), f"{key}-tiny")
             for key, source in MODELS.items()}
    server = start_server(home, "--ctx", "1024", "--parallel", "2",
                          ready_timeout=120)
    yield server, names
    stop_server(server)


@pytest.fixture
def oai(families):
    server, _ = families
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _stream(oai, **kwargs):
    chunks = list(oai.chat.completions.create(stream=True, temperature=0, **kwargs))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and
              c.choices[0].finish_reason]
    return deltas, finish


@pytest.mark.parametrize("family", ["qwen3", "llama31"])
def test_a_required_call_streams_in_the_familys_own_syntax(families, oai, family):
    _, names = families
    deltas, finish = _stream(oai, model=names[family], messages=ASK, tools=[WEATHER],
                             tool_choice="required", max_tokens=200)
    calls = [c for d in deltas for c in d.tool_calls or []]
    # id and name first, then the arguments in fragments, as OpenAI streams a call
    assert calls[0].id and calls[0].function.name == "get_weather"
    assert len(calls) > 2 and all(c.index == 0 for c in calls)
    arguments = json.loads("".join(c.function.arguments or "" for c in calls))
    assert isinstance(arguments["city"], str)
    assert finish == ["tool_calls"]
    assert not "".join(d.content or "" for d in deltas)


def test_text_streams_before_a_call_and_the_call_follows(families, oai):
    _, names = families
    said = ('Let me look that up for you. <tool_call>\n{"name": "get_weather", '
            '"arguments": {"city": "Paris"}}\n</tool_call>')
    deltas, finish = _stream(oai, model=names["qwen3"], messages=ASK, tools=[WEATHER],
                             max_tokens=200, extra_body={"grammar": saying(said)})
    first_call = next(i for i, d in enumerate(deltas) if d.tool_calls)
    text = [d.content for d in deltas[:first_call] if d.content]
    assert len(text) > 1 and "".join(text).strip() == "Let me look that up for you."
    assert not any(d.content for d in deltas[first_call:])
    arguments = "".join(c.function.arguments or "" for d in deltas for c in d.tool_calls or [])
    assert json.loads(arguments) == {"city": "Paris"} and finish == ["tool_calls"]


def test_a_malformed_call_comes_back_as_text(families, oai):
    _, names = families
    said = "<tool_call>\nnot a call\n</tool_call>"
    reply = oai.chat.completions.create(model=names["qwen3"], messages=ASK, tools=[WEATHER],
                                        max_tokens=200, temperature=0,
                                        extra_body={"grammar": saying(said)})
    assert reply.choices[0].message.content == said
    assert not reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("family, said", [
    ("qwen3", "<think>\nFirst, the plan.\n</think>\n\nThe answer."),
    # the template opens the block itself: the reply starts inside it
    ("r1", "First, the plan.\n</think>\n\nThe answer."),
])
def test_reasoning_comes_apart_from_the_answer(families, oai, family, said):
    _, names = families
    request = dict(model=names[family], messages=[{"role": "user", "content": "Hi"}],
                   max_tokens=200, extra_body={"grammar": saying(said)})
    deltas, _ = _stream(oai, **request)
    reasoning = [getattr(d, "reasoning_content", None) for d in deltas]
    assert "".join(r for r in reasoning if r) == "First, the plan."
    assert "".join(d.content or "" for d in deltas) == "The answer."
    reply = oai.chat.completions.create(temperature=0, **request)
    message = reply.choices[0].message
    assert message.content == "The answer."
    assert message.model_extra["reasoning_content"] == "First, the plan."
    # the reasoning's tokens, counted apart, are some of the reply's
    reasoning = reply.usage.completion_tokens_details.reasoning_tokens
    assert 3 <= reasoning < reply.usage.completion_tokens
    assert reply.model_extra["timings"]["reasoning_n"] == reasoning


def test_ollama_client_gets_thinking_and_tool_calls(families):
    server, names = families
    client = ollama.Client(host=server.url)
    said = ('<think>\nCheck the weather.\n</think>\n\n<tool_call>\n{"name": "get_weather", '
            '"arguments": {"city": "Paris"}}\n</tool_call>')
    kwargs = dict(model=names["qwen3"], messages=ASK, tools=[WEATHER],
                  options={"temperature": 0, "num_predict": 200, "grammar": saying(said)})
    parts = list(client.chat(stream=True, think=True, **kwargs))
    thinking = "".join(p.message.thinking or "" for p in parts)
    calls = [c for p in parts for c in p.message.tool_calls or []]
    assert thinking == "Check the weather."
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})]
    assert not "".join(p.message.content or "" for p in parts)
    whole = client.chat(stream=False, think=True, **kwargs)
    assert whole.message.thinking == "Check the weather."
    assert whole.message.tool_calls[0].function.arguments == {"city": "Paris"}
    # think off: the template is told, and thinking the model writes anyway is not shown
    off = client.chat(stream=False, think=False, **kwargs)
    assert not off.message.thinking and off.message.tool_calls


def test_capabilities_follow_the_template(families):
    server, names = families
    client = ollama.Client(host=server.url)
    assert client.show(names["qwen3"]).capabilities == ["completion", "tools", "thinking"]
    assert client.show(names["llama31"]).capabilities == ["completion", "tools"]


def test_a_bad_grammar_is_a_400(families):
    server, names = families
    response = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "model": names["qwen3"], "messages": ASK, "grammar": "root ::= (", "max_tokens": 4})
    assert response.status_code == 400 and "grammar" in response.json()["error"]["message"]


def test_responses_api_streams_reasoning_and_a_call_and_takes_its_output_back(families):
    server, names = families
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    tool = {"type": "function", **WEATHER["function"]}  # (the Responses API's flat shape)
    said = ('<think>\nCheck the weather.\n</think>\n\n<tool_call>\n{"name": "get_weather", '
            '"arguments": {"city": "Paris"}}\n</tool_call>')
    with client.responses.stream(model=names["qwen3"], input="Weather in Paris?", tools=[tool],
                                 max_output_tokens=200,
                                 extra_body={"grammar": saying(said)}) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.reasoning_text.delta" in kinds
    assert kinds.count("response.function_call_arguments.delta") > 1
    assert [item.type for item in final.output] == ["reasoning", "function_call"]
    assert final.output[0].content[0].text == "Check the weather."
    call = final.output[1]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    # the call's output continues the stored conversation, the call in its place (tools
    # are sent again: a response carries none over)
    follow = client.responses.create(
        model=names["qwen3"], previous_response_id=final.id, max_output_tokens=4, tools=[tool],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert follow.usage.input_tokens > final.usage.input_tokens + 20


def test_responses_api_forces_a_call_in_the_familys_syntax(families):
    server, names = families
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    tool = {"type": "function", **WEATHER["function"]}
    response = client.responses.create(model=names["llama31"], input="Weather in Paris?",
                                       tools=[tool], tool_choice="required",
                                       max_output_tokens=200, temperature=0)
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert call.name == "get_weather" and isinstance(json.loads(call.arguments)["city"], str)


def test_anthropic_client_gets_thinking_and_tool_use_and_sends_results_back(families):
    server, names = families
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    tool = {"name": "get_weather", "description": "Current weather in a city",
            "input_schema": WEATHER["function"]["parameters"]}
    said = ('<think>\nCheck the weather.\n</think>\n\n<tool_call>\n{"name": "get_weather", '
            '"arguments": {"city": "Paris"}}\n</tool_call>')
    request = dict(model=names["qwen3"], max_tokens=200, tools=[tool], messages=ASK,
                   extra_body={"grammar": saying(said)})
    with client.messages.stream(**request) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "tool_use"]
    assert final.content[0].thinking == "Check the weather."
    assert final.content[1].name == "get_weather" and final.content[1].input == {"city": "Paris"}
    assert final.stop_reason == "tool_use" and "content_block_delta" in kinds
    whole = client.messages.create(**request)
    assert [b.type for b in whole.content] == ["thinking", "tool_use"]
    # the result goes back as a tool_result block; tool_choice "any" forces a call
    again = client.messages.create(
        model=names["qwen3"], max_tokens=200, tools=[tool], tool_choice={"type": "any"},
        messages=[*ASK, {"role": "assistant", "content": whole.content},
                  {"role": "user", "content": [{"type": "tool_result",
                                                "tool_use_id": whole.content[1].id,
                                                "content": "sunny, 21 C"}]}])
    assert again.stop_reason == "tool_use" and again.content[-1].name == "get_weather"
    assert again.usage.input_tokens > whole.usage.input_tokens


def test_an_auto_call_the_model_opens_is_held_to_the_tools_schema(families, oai):
    """With tool_choice auto the reply is the model's own until it opens a call; from there
    a lazy grammar holds it to the family's syntax and the tool's schema. Here the opening
    mark is made the model's every first choice (a logit bias on Qwen's `<tool_call>`
    token): without the grammar a random model writes noise after it, which comes back as
    text; with it, a call."""
    _, names = families
    reply = oai.chat.completions.create(
        model=names["qwen3"], messages=ASK, tools=[WEATHER], temperature=0, max_tokens=200,
        logit_bias={"151657": 100})
    message = reply.choices[0].message
    # (biased to open call after call, it may be cut at max_tokens in a later one: "length")
    assert reply.choices[0].finish_reason in ("tool_calls", "length") and message.tool_calls
    first = message.tool_calls[0].function
    assert first.name == "get_weather" and isinstance(json.loads(first.arguments)["city"], str)


def test_tools_too_costly_to_hold_to_their_schema_are_left_free_with_auto(families, oai):
    """With `auto` a grammar is a help: tools whose schemas would cost too much are offered
    unheld; a call the request requires of them is refused, naming the limit."""
    _, names = families
    huge = {"type": "function", "function": {
        "name": "write", "parameters": {"type": "object", "properties": {
            "text": {"type": "string", "maxLength": 50_000}}}}}
    reply = oai.chat.completions.create(model=names["qwen3"], messages=ASK, tools=[huge],
                                        max_tokens=4)
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    with pytest.raises(openai.BadRequestError, match="1,000|1000"):
        oai.chat.completions.create(model=names["qwen3"], messages=ASK, tools=[huge],
                                    tool_choice="required", max_tokens=4)


def test_a_reasoning_budget_closes_the_block_and_the_answer_follows(families, oai):
    """DeepSeek-R1's template opens the reasoning block in the prompt, and a random model
    never closes it: each reply here would be all reasoning. With a budget the block ends
    after that many tokens (a line break and its closing mark written for the model: two
    more), and the answer follows; OpenAI's effort "minimal" is a budget of none,
    Anthropic's budget_tokens the same path. Counted in tokens, whichever the model picks
    (line breaks and spaces banned, it writes " Inv" again and again; then, the block
    closed, the closing mark again and again: it repeats its last token)."""
    server, names = families
    words = {"198": -100, "220": -100, "256": -100, "271": -100}

    def reply(**asked):
        answer = oai.chat.completions.create(model=names["r1"], messages=ASK, max_tokens=30,
                                             temperature=0, logit_bias=words, extra_body=asked)
        return (answer.usage.completion_tokens_details.reasoning_tokens,
                answer.choices[0].message.content or "")

    assert reply() == (30, "")  # (all of it reasoning)
    for budget in (3, 10):
        reasoning, answer = reply(reasoning_budget_tokens=budget)
        assert reasoning == budget + 2 and answer  # (the answer after the block)
    reasoning, answer = reply(reasoning_effort="minimal")
    assert reasoning <= 2 and answer
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)

    def text(budget: int) -> str:
        message = client.messages.create(model=names["r1"], max_tokens=30, messages=ASK,
                                         thinking={"type": "enabled", "budget_tokens": budget},
                                         extra_body={"temperature": 0})
        return "".join(block.text for block in message.content if block.type == "text")

    assert text(1 << 20) == "" and text(4)
