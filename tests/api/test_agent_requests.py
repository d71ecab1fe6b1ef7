"""What coding agents really send, through the client libraries they are built on, against a
real `localinfer serve`: the first request of Claude Code 2.1.332 and of Codex 0.169,
recorded (`agent_requests/`: their headers and bodies, texts cut to 240 characters), and
the retries and errors agents recover by. The agents themselves run in test_agents.py."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import anthropic
import ollama
import openai
import pytest

from .conftest import start_server, stop_server

RECORDED = Path(__file__).parent / "agent_requests"
MODEL = "smollm2:135m"


def _recorded(name: str) -> tuple[dict[str, str], dict]:
    request = json.loads((RECORDED / f"{name}.json").read_text())
    headers = {k: v for k, v in request["headers"].items()
               if k.lower().startswith(("anthropic-", "x-", "originator", "session-", "thread-"))}
    return headers, {**request["body"], "model": MODEL}


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A server whose context holds the recorded requests (~5,000 tokens each)."""
    server = start_server(tmp_path_factory.mktemp("agents-home"), "--model", MODEL,
                          "--ctx", "8192", "--parallel", "1")
    yield server
    stop_server(server)


def _anthropic(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="sk-local", max_retries=0)


def _openai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="sk-local", max_retries=0)


def _claude_code(body: dict, headers: dict[str, str], client: anthropic.Anthropic,
                 max_tokens: int = 8):
    """Send a Claude Code body as Claude Code does: streamed, its beta headers on."""
    rest = {k: v for k, v in body.items() if k not in ("model", "messages", "max_tokens",
                                                        "stream")}
    with client.messages.stream(model=body["model"], messages=body["messages"],
                                max_tokens=max_tokens, extra_headers=headers,
                                extra_body={**rest, "temperature": 0}) as stream:
        return stream.get_final_message()


@pytest.mark.slow
def test_claude_codes_first_request_with_its_system_message_is_answered(wide):
    headers, body = _recorded("claude_code")
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["user", "system"]  # (what made it a 400: a system role in messages)
    client = _anthropic(wide)
    reply = _claude_code(body, headers, client)
    assert reply.content and reply.stop_reason in ("end_turn", "max_tokens", "tool_use")
    # the system message's text is in the prompt: without it the prompt is shorter by it
    without = {**body, "messages": [m for m in body["messages"] if m["role"] != "system"]}
    shorter = _claude_code(without, headers, client, max_tokens=1)
    words = len(json.dumps(body["messages"][1]["content"]).split())
    assert reply.usage.input_tokens - shorter.usage.input_tokens >= words
    # what an agent sends next: its own reply, a tool call and its result, another system
    # message later on; the assistant's thinking (adaptive: the template's default)
    later = body["messages"] + [
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_01", "name": "Read",
             "input": {"file_path": "/home/user/project/README.md"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": "# Project"}]},
        {"role": "system", "content": [{"type": "text", "text": "The user is away."}]}]
    again = _claude_code({**body, "messages": later}, headers, client)
    assert again.usage.input_tokens > reply.usage.input_tokens


def test_a_role_anthropic_does_not_take_is_worded_as_anthropic_words_it(server):
    with pytest.raises(anthropic.BadRequestError, match='Unexpected role "tool"') as refused:
        _anthropic(server).messages.create(model=MODEL, max_tokens=2, messages=[
            {"role": "user", "content": "Hi"}, {"role": "tool", "content": "x"}])
    assert refused.value.body["error"]["type"] == "invalid_request_error"


def test_hosted_tools_are_left_out_not_refused(server):
    """Tools that Anthropic's or OpenAI's servers run cannot run here: the request is served
    without them (it was a 400 that stopped Claude Code and Codex)."""
    reply = _anthropic(server).messages.create(
        model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "Hi"}],
        tools=[{"type": "web_search_20250305", "name": "web_search", "max_uses": 5}])
    assert reply.content[0].type == "text"
    response = _openai(server).responses.create(
        model=MODEL, input="Hi", max_output_tokens=2,
        tools=[{"type": "web_search", "external_web_access": False}])
    assert response.output[0].type == "message"


def test_a_prompt_past_the_context_is_worded_as_each_api_words_it(server):
    """Claude Code compacts on Anthropic's "prompt is too long"; Codex and the OpenAI SDKs
    read the code context_length_exceeded."""
    long = "Tell me about the sea. " * 200  # ~1,200 tokens: past the 512 of each slot
    with pytest.raises(anthropic.BadRequestError) as anthropic_said:
        _anthropic(server).messages.create(model=MODEL, max_tokens=2,
                                           messages=[{"role": "user", "content": long}])
    assert re.fullmatch(r"prompt is too long: \d+ tokens > 512 maximum",
                        anthropic_said.value.body["error"]["message"])
    client = _openai(server)
    with pytest.raises(openai.BadRequestError) as chat_said:
        client.chat.completions.create(model=MODEL, max_tokens=2,
                                       messages=[{"role": "user", "content": long}])
    assert chat_said.value.code == "context_length_exceeded"
    assert "maximum context length is 512 tokens" in chat_said.value.message
    with pytest.raises(openai.BadRequestError) as responses_said:
        client.responses.create(model=MODEL, input=long, max_output_tokens=2)
    assert responses_said.value.code == "context_length_exceeded"


def test_max_tokens_past_the_context_is_taken_and_ends_with_the_context(server):
    """Qwen Code retries a reply cut at 8,000 with 64,000; Claude Code asks for 32,000."""
    reply = _openai(server).chat.completions.create(
        model=MODEL, max_tokens=64000, temperature=0,
        messages=[{"role": "user", "content": "Say yes."}])
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage.prompt_tokens + reply.usage.completion_tokens <= 512
    with _anthropic(server).messages.stream(  # (as Claude Code, streamed)
            model=MODEL, max_tokens=32000, messages=[{"role": "user", "content": "Say yes."}],
            extra_body={"temperature": 0}) as stream:
        message = stream.get_final_message()
    assert message.stop_reason in ("end_turn", "max_tokens")


@pytest.mark.slow
def test_codexs_first_request_with_its_namespace_and_hosted_tools_is_answered(wide):
    headers, body = _recorded("codex")
    kinds = {tool["type"] for tool in body["tools"]}
    assert {"function", "namespace", "web_search"} <= kinds  # (each was a 400)
    body["max_output_tokens"] = 8
    body["temperature"] = 0
    client = _openai(wide)  # (Codex is not built on the SDK: what it does not type, as sent)
    typed = inspect.signature(client.responses.create).parameters
    events = list(client.responses.create(
        **{k: v for k, v in body.items() if k in typed}, extra_headers=headers,
        extra_body={k: v for k, v in body.items() if k not in typed}))
    assert events[0].type == "response.created"
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert events[-1].response.usage.input_tokens > 1000  # the developer messages are in


# a namespace and a free-form tool as Codex declares its MCP servers' tools and apply_patch
NAMESPACE = {"type": "namespace", "name": "mcp__notes__", "description": "A notes server.",
             "tools": [{"type": "function", "name": "find", "description": "Find a note.",
                        "strict": False, "parameters": {
                            "type": "object", "required": ["word"],
                            "additionalProperties": False,
                            "properties": {"word": {"type": "string", "maxLength": 12}}}}]}
CUSTOM = {"type": "custom", "name": "apply_patch", "description": "Apply a patch."}


@pytest.mark.parametrize("stream", [False, True])
def test_a_namespaced_call_comes_back_with_its_namespace_and_goes_back_in(server, stream):
    client = _openai(server)
    asked = dict(model=MODEL, input="Find the note about cats.", max_output_tokens=60,
                 temperature=0, tools=[NAMESPACE], tool_choice="required")
    if stream:
        events = list(client.responses.create(**asked, stream=True))
        response = events[-1].response
        added = [e.item for e in events if e.type == "response.output_item.added"]
        assert added[0].type == "function_call" and added[0].namespace == "mcp__notes__"
    else:
        response = client.responses.create(**asked)
    call = next(item for item in response.output if item.type == "function_call")
    assert (call.namespace, call.name) == ("mcp__notes__", "find")
    assert set(json.loads(call.arguments)) == {"word"}
    after = client.responses.create(
        model=MODEL, max_output_tokens=4, tools=[NAMESPACE],
        input=[{"role": "user", "content": "Find the note about cats."},
               {"type": "function_call", "call_id": call.call_id, "namespace": call.namespace,
                "name": call.name, "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id,
                "output": "Cats sleep a lot."}])
    assert after.status in ("completed", "incomplete")


def test_a_custom_tools_call_is_a_custom_tool_call_with_its_input(server):
    client = _openai(server)
    response = client.responses.create(model=MODEL, input="Patch the file.", temperature=0,
                                       max_output_tokens=40, tools=[CUSTOM],
                                       tool_choice="required")
    call = next(item for item in response.output if item.type == "custom_tool_call")
    assert call.name == "apply_patch" and isinstance(call.input, str)
    after = client.responses.create(
        model=MODEL, max_output_tokens=4, tools=[CUSTOM],
        input=[{"role": "user", "content": "Patch the file."},
               {"type": "custom_tool_call", "call_id": call.call_id, "name": call.name,
                "input": call.input},
               {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Done."}])
    assert after.status in ("completed", "incomplete")


def test_a_streamed_item_is_added_empty_and_a_cut_reply_ends_incomplete(server):
    """A client that starts from the added item and appends the deltas shows the text
    once; a reply cut at its limit ends with response.incomplete, as OpenAI's does."""
    from .conftest import NO_END

    events = list(_openai(server).responses.create(
        model=MODEL, input="Tell me a story.", max_output_tokens=6, stream=True,
        extra_body={"logit_bias": NO_END}))
    added = next(e.item for e in events if e.type == "response.output_item.added")
    assert added.type == "message" and added.content == []
    shown = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = next(e.item for e in events if e.type == "response.output_item.done")
    assert shown and shown == done.content[0].text
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"


@pytest.mark.slow
def test_one_clients_num_ctx_does_not_hold_for_the_next(tmp_path):
    """aider sends num_ctx with each request; Claude Code sends none and gets at least the
    server's context, not aider's smaller one; aider's next request is served in that
    context as it is, not loaded again to shrink it."""
    server = start_server(tmp_path / "home", "--ctx", "1024", "--parallel", "1")
    try:
        aider = ollama.Client(host=server.url)

        def ask_as_aider() -> bool:
            reply = aider.chat(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                               options={"num_ctx": 256, "num_predict": 1})
            return reply.load_duration > 0

        assert ask_as_aider()  # (nothing was loaded: loaded for it, with its 256)
        assert [m.context_length for m in aider.ps().models] == [256]
        prompt = "Tell me about the sea. " * 60  # ~360 tokens: past aider's 256
        reply = _anthropic(server).messages.create(
            model=MODEL, max_tokens=1, messages=[{"role": "user", "content": prompt}])
        assert reply.usage.input_tokens > 256
        assert [m.context_length for m in aider.ps().models] == [1024]
        assert not ask_as_aider()
        assert [m.context_length for m in aider.ps().models] == [1024]
    finally:
        stop_server(server)


def test_counted_tokens_are_what_the_request_then_takes(server):
    """Anthropic's count_tokens and OpenAI's input_tokens render the prompt as the request
    does: its system prompt, tools and template."""
    tools = [{"name": "find", "description": "Find a note.", "input_schema": {
        "type": "object", "properties": {"word": {"type": "string"}}}}]
    asked = dict(model=MODEL, system="Be brief.", tools=tools,
                 messages=[{"role": "user", "content": "Find the note about cats."}])
    client = _anthropic(server)
    counted = client.messages.count_tokens(**asked)
    reply = client.messages.create(**asked, max_tokens=1)
    assert counted.input_tokens == reply.usage.input_tokens > 20
    bare = client.messages.count_tokens(model=MODEL, messages=asked["messages"])
    assert bare.input_tokens < counted.input_tokens  # (the tools and the system prompt)
    oai = _openai(server)
    question = dict(model=MODEL, input="Find the note about cats.", instructions="Be brief.",
                    tools=[NAMESPACE])
    n = oai.responses.input_tokens.count(**question)
    response = oai.responses.create(**question, max_output_tokens=1)
    assert n.input_tokens == response.usage.input_tokens > 20
