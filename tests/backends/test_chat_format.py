"""Each family's tool calls and reasoning, taken apart as they stream (app/chat_formats/), and
its own template rendering the tools. The expected parses are llama.cpp's, ported as data
from its tests/test-chat.cpp (chat_format_cases.json); the templates are llama.cpp's copies
of the families' own (tests/families.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localinfer.api.tools import ToolSpec
from localinfer.backends.base import SamplingParams
from localinfer.chat_formats.calls import call_grammar, lazy_call_grammar
from localinfer.chat_formats.detect import detect
from localinfer.chat_formats.parser import parser
from localinfer.chat_formats.reply import Reply
from localinfer.chat_formats.template import ChatTemplate
from localinfer.backends.native.model import grammar_sampler

from ..families import llama_cpp_file

CASES = json.loads((Path(__file__).parent / "chat_format_cases.json").read_text())
# llama.cpp's "none" keeps reasoning in the content; we always take it apart (as its default)
KEPT_MARKERS = ("<think>", "[THINK]", "<|START_THINKING|>", "<|channel|>analysis", "<|channel>")


def _template(name: str) -> str:
    return llama_cpp_file(f"models/templates/{name.removesuffix('.jinja')}.jinja").read_text()


def _cases():
    for case in CASES["cases"]:
        expected = (case["expect"].get("content") or "").strip()
        if case["reasoning_format"] in (None, "none") and any(m in expected
                                                               for m in KEPT_MARKERS):
            continue
        yield pytest.param(case, id=f"{case['template'].removesuffix('.jinja')}:{case['line']}")


def _parse(fmt, tools, reasoning: bool, text: str, step: int) -> Reply:
    reader = parser(fmt, tools, reasoning)
    pieces = []
    for at in range(0, len(text), step):
        pieces += reader.feed(text[at:at + step])
    return Reply.of([*pieces, *reader.close()])


@pytest.mark.parametrize("case", _cases())
def test_a_reply_comes_apart_as_llama_cpp_parses_it(case):
    fmt = detect(_template(case["template"]))
    tools = ({n: CASES["tools"][n]["function"] for n in case["tools"]} if case["tools"]
             else None)
    expected = case["expect"]
    want_calls = [(c["name"], c["arguments"]) for c in expected.get("tool_calls", [])]
    for step in (1, 3, 1 << 20):  # streamed a character at a time, in small pieces, whole
        reply = _parse(fmt, tools, case["starts_in_reasoning"], case["output"], step)
        assert reply.content.strip() == (expected.get("content") or "").strip(), step
        assert reply.reasoning.strip() == (expected.get("reasoning_content") or "").strip()
        assert [(c["name"], json.loads(c["arguments"])) for c in reply.calls] == want_calls
        assert all(c["id"] for c in reply.calls)


def test_arguments_stream_in_fragments_before_the_call_ends():
    fmt = detect(_template("Qwen-Qwen3-0.6B"))
    reader = parser(fmt, {"f": {"name": "f"}})
    text = '<tool_call>\n{"name": "f", "arguments": {"path": "a/very/long/path.txt"}'
    pieces = [p for at in range(len(text)) for p in reader.feed(text[at])]
    kinds = [p.kind for p in pieces]
    assert kinds[0] == "call" and kinds.count("arguments") > 5 and "done" not in kinds
    assert "".join(p.text for p in pieces) == '{"path": "a/very/long/path.txt"}'
    assert [p.kind for p in reader.feed("}")] == ["done"]  # the call's JSON is whole
    assert reader.feed("\n</tool_call>") == [] and reader.close() == []


GENERIC_CALL = '{"name": "f", "arguments": {"path": "a/very/long/path.txt"}}'


@pytest.mark.parametrize("text", [
    GENERIC_CALL, f"```json\n{GENERIC_CALL}\n```", f"<tool_call>{GENERIC_CALL}</tool_call>",
    f"[{GENERIC_CALL}]", f"  {GENERIC_CALL}\n"])
def test_a_generic_call_streams_as_the_families_calls_do(text):
    """A template without tools is taught `{"name": …, "arguments": {…}}`: read only once the
    reply had ended, a long call came in one piece at the end. Now its name goes out as soon
    as it is known, its arguments in fragments after, fenced, tagged or listed alike."""
    reader = parser(detect(None), {"f": {"name": "f"}})
    pieces, named_at = [], None
    for at, char in enumerate(text):
        got = reader.feed(char)
        if named_at is None and any(p.kind == "call" for p in got):
            named_at = at
        pieces += got
    pieces += reader.close()
    assert named_at is not None and named_at < text.index("/long")  # long before the end
    assert [p.name for p in pieces if p.kind == "call"] == ["f"]
    assert sum(p.kind == "arguments" for p in pieces) > 5
    reply = Reply.of(pieces)
    assert reply.content == "" and json.loads(reply.calls[0]["arguments"]) == {
        "path": "a/very/long/path.txt"}


@pytest.mark.parametrize("text", [
    '{"tool_calls": [{"name": "f", "arguments": {"a": 1}}]}',
    '{"arguments": {"a": 1}, "name": "f"}', '{"name": "f", "arguments": "{\\"a\\": 1}"}',
    '{"function": {"name": "f", "arguments": {"a": 1}}}'])
def test_a_generic_call_in_another_shape_is_still_read_whole(text):
    for step in (1, 1 << 20):
        reply = _parse(detect(None), {"f": {"name": "f"}}, False, text, step)
        assert reply.content == "" and [(c["name"], json.loads(c["arguments"]))
                                        for c in reply.calls] == [("f", {"a": 1})]


def test_a_generic_call_cut_short_is_a_call_and_one_of_no_tool_is_text_at_once():
    cut = _parse(detect(None), {"f": {"name": "f"}}, False, GENERIC_CALL[:30], 1)
    assert cut.content == "" and cut.calls[0]["name"] == "f"
    assert cut.calls[0]["arguments"] == GENERIC_CALL[27:30] == '{"p'  # as far as it got
    reader = parser(detect(None), {"f": {"name": "f"}})
    text = '{"name": "g", "arguments": {"a": 1}}'
    shown = "".join(p.text for at in range(len(text)) for p in reader.feed(text[at]))
    assert shown.startswith('{"name": "g", "arguments": {') and text.startswith(shown)


def test_text_that_only_starts_like_a_marker_is_let_go():
    fmt = detect(_template("Qwen-Qwen3-0.6B"))
    reader = parser(fmt, {"f": {"name": "f"}})
    assert [(p.kind, p.text) for p in reader.feed("a <tool")] == [("content", "a ")]
    assert [(p.kind, p.text) for p in reader.feed("box> b")] == [("content", "<toolbox> b")]


FAMILIES = {  # template → the call syntax read from it
    "Qwen-Qwen2.5-7B-Instruct": "hermes", "Qwen-Qwen3-0.6B": "hermes",
    "Qwen-QwQ-32B": "hermes", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": "hermes",
    "ibm-granite-granite-4.0": "hermes", "Qwen3-Coder": "qwen3-coder",
    "Qwen3.5-4B": "qwen3-coder", "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": "qwen3-coder",
    "StepFun3.5-Flash": "qwen3-coder", "GLM-4.7-Flash": "glm",
    "meta-llama-Llama-3.1-8B-Instruct": "llama3", "meta-llama-Llama-3.2-3B-Instruct": "llama3",
    "meta-llama-Llama-3.3-70B-Instruct": "llama3",
    "mistralai-Mistral-Nemo-Instruct-2407": "mistral-nemo",
    "Mistral-Small-3.2-24B-Instruct-2506": "mistral",
    "unsloth-mistral-Devstral-Small-2507": "mistral",
    "mistralai-Ministral-3-14B-Reasoning-2512": "mistral",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": "deepseek", "deepseek-ai-DeepSeek-V3.1": "deepseek",
    "openai-gpt-oss-120b": "harmony", "google-gemma-4-31B-it": "gemma4",
    "ibm-granite-granite-3.3-2B-Instruct": "granite",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use": "command-r7b", "GLM-4.6": "glm",
    "moonshotai-Kimi-K2": "kimi-k2", "Kimi-K2-Thinking": "kimi-k2",
}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string",
                                                              "maxLength": 20}},
                   "required": ["city"]}}}
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [{  # as OpenAI sends it back
        "id": "abcdefghi", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "abcdefghi", "name": "get_weather", "content": "sunny, 21 C"},
    {"role": "assistant", "content": "Sunny."},
    {"role": "user", "content": "And Rome?"},
]


@pytest.mark.parametrize("template", sorted(FAMILIES))
def test_each_familys_template_writes_the_tools_and_the_calls_so_far(template):
    source = _template(template)
    fmt = detect(source)
    assert fmt.name == FAMILIES[template] and fmt.template_tools
    spec = ToolSpec.from_request([WEATHER], "auto")
    messages, _, extra = spec.prepare(CONVERSATION, SamplingParams(), fmt)
    prompt = ChatTemplate(source, "<s>", "</s>").render(messages, True,
                                                        {**extra, "enable_thinking": True})
    assert "get_weather" in prompt
    if not template.startswith("deepseek-ai-DeepSeek"):  # (their templates list no schemas)
        assert "Current weather in a city" in prompt
    # the earlier call, its arguments an object to the template, and its result
    assert "Paris" in prompt and '\\"city' not in prompt and "sunny, 21 C" in prompt


@pytest.mark.parametrize("template", sorted(FAMILIES))
def test_a_forced_call_is_a_grammar_llama_cpp_takes_and_its_text_parses_back(template,
                                                                           smollm2):
    fmt = detect(_template(template))
    tools = {"get_weather": WEATHER["function"]}
    grammar = call_grammar(fmt, tools, ["get_weather"])
    assert grammar_sampler(smollm2.native, grammar) is not None  # llama.cpp parses it
    written = _write_call(fmt, grammar)
    reply = _parse(fmt, tools, False, written, 1)
    assert [(c["name"], json.loads(c["arguments"])) for c in reply.calls] == [
        ("get_weather", {"city": "Paris"})], written


@pytest.mark.parametrize("template", sorted(FAMILIES))
def test_an_auto_calls_lazy_grammar_is_one_llama_cpp_takes(template, smollm2):
    fmt = detect(_template(template))
    lazy = lazy_call_grammar(fmt, {"get_weather": WEATHER["function"]}, thinking=True)
    if fmt.name in ("llama3", "harmony"):  # no opening mark to wake it: the reply is free
        assert lazy is None
        return
    grammar, triggers = lazy
    assert grammar_sampler(smollm2.native, grammar, triggers) is not None


def _write_call(fmt, grammar: str) -> str:
    """The text the grammar's first alternative writes, with {"city": "Paris"} as the JSON
    (or the parameter) it leaves open."""
    root = grammar.splitlines()[0].removeprefix("root ::= ").split(" | ")[0]
    out = []
    for part in _tokens(root):
        if part.startswith('"'):
            out.append(json.loads(part))
        elif part.startswith("value"):  # the call's JSON
            args = '{"city": "Paris"}'
            if f"{part}-tool-name-kv" in grammar:
                out.append('{"tool_call_id": "0", "tool_name": "get_weather", '
                           f'"parameters": {args}}}')
            elif f"{part}-parameters-kv" in grammar:
                out.append(f'{{"name": "get_weather", "parameters": {args}}}')
            elif f"{part}-name-kv" in grammar:
                out.append(f'{{"name": "get_weather", "arguments": {args}}}')
            else:
                out.append(args)
        elif part.startswith("("):  # XML parameters: one, the city
            out.append(_xml_parameter(part))
    return "".join(out)


def _tokens(rule: str) -> list[str]:
    parts, at = [], 0
    while at < len(rule):
        c = rule[at]
        if c == '"':
            end = at + 1
            while rule[end] != '"':
                end += 2 if rule[end] == "\\" else 1
            parts.append(rule[at:end + 1])
            at = end + 1
        elif c == "(":
            depth, end = 0, at
            while True:
                depth += {"(": 1, ")": -1}.get(rule[end], 0)
                end += 1
                if depth == 0:
                    break
            parts.append(rule[at:end + (1 if end < len(rule) and rule[end] == "*" else 0)])
            at = end + 1
        elif c == " ":
            at += 1
        else:
            end = rule.find(" ", at)
            end = len(rule) if end < 0 else end
            parts.append(rule[at:end])
            at = end
    return parts


def _xml_parameter(group: str) -> str:
    literals = [json.loads(p) for p in _tokens(group.strip("()*")) if p.startswith('"')]
    # ("<parameter=" (key) ">\n" text "\n</parameter>\n"): the key is the second literal
    key_group = group[group.index("(", 1):group.index(")") + 1]
    key = json.loads(key_group.strip("()").split(" | ")[0])
    head, *tail = [lit for lit in literals if lit != key]
    return head + key + tail[0] + "Paris" + "".join(tail[1:])


_PIECES = ["<tool_call>", "</tool_call>", "<think>", "</think>", "{", "}", "[", "]", '"', "\\",
           '{"name": "f", "arguments": ', '"x"', ": ", ", ", "\n", "[TOOL_CALLS]", "[ARGS]",
           "<function=f>", "<parameter=a>", "</parameter>", "</function>", "<|channel|>",
           "<|message|>", "<|end|>", "<|start|>", "to=functions.f", "<｜tool▁calls▁begin｜>",
           "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<|tool_call>", "call:f", "<tool_call|>",
           "<|python_tag|>", "```json", "hello"]


@settings(max_examples=60, deadline=None)
@given(parts=st.lists(st.sampled_from(_PIECES), max_size=30),
       cuts=st.lists(st.integers(1, 7), min_size=1, max_size=8),
       template=st.sampled_from(sorted(FAMILIES)), thinking=st.booleans())
def test_no_text_makes_the_parser_fail(parts, cuts, template, thinking):
    """Whatever a model writes, the reply is taken apart without an error: a stream never
    breaks on what it says."""
    fmt = detect(_template(template))
    reader = parser(fmt, {"f": {"name": "f"}}, thinking)
    text, at, i = "".join(parts), 0, 0
    pieces = []
    while at < len(text):
        step = cuts[i % len(cuts)]
        pieces += reader.feed(text[at:at + step])
        at, i = at + step, i + 1
    reply = Reply.of([*pieces, *reader.close()])
    assert all(c["name"] for c in reply.calls)
