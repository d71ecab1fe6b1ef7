"""Structured output's cost is bounded: before a grammar is built, and per token after."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from localinfer.backends.base import SamplingParams
from localinfer.chat_formats.grammar import MAX_REPEAT, _nested_repeats, _nesting, json_schema_grammar
from localinfer.errors import InvalidRequest

QUESTION = [{"role": "user", "content": "Say something."}]


@pytest.mark.parametrize("schema,names", [
    ({"type": "string", "maxLength": 20000}, "maxLength 20000"),
    ({"type": "array", "items": {"type": "integer"}, "maxItems": 20000}, "maxItems 20000"),
    ({"type": "string", "minLength": 1e9}, "minLength 1000000000"),
    ({"type": "string", "pattern": "^((a{0,100}){0,100}){0,100}$"}, "multiply to 1,000,000"),
    ({"type": "string", "pattern": "a{0,99999999999999999999}"}, "multiply to"),
    ({"enum": list(range(100_000))}, "1,000 enum"),
    ({"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 900}
                                       for i in range(120)}}, "add up to more than 100,000"),
    ({"type": "string", "maxLength": "many"}, "must be a number"),
    ({"type": "string", "maxLength": float("nan")}, "must be a number"),  # was a 500
    ({"type": "string", "maxLength": 10**400}, "more than the 1,000"),  # was an OverflowError
    ({"$defs": {"n": {"$ref": "#/$defs/n"}}, "$ref": "#/$defs/n"}, "refers to itself"),
    ({"properties": {"x": {"$ref": "#/$defs/missing"}}}, "Error resolving ref"),
])
def test_costly_or_broken_schemas_are_refused_with_the_limit_named(schema, names):
    with pytest.raises(InvalidRequest, match=names.replace("+", r"\+")):
        json_schema_grammar(schema)


def test_a_deeply_nested_schema_is_refused_before_the_converter_recurses():
    schema: dict = {"type": "string"}
    for _ in range(5000):
        schema = {"type": "array", "items": schema}
    with pytest.raises(InvalidRequest, match="levels deep"):
        json_schema_grammar(schema)


def test_schemas_within_the_limits_convert():
    assert json_schema_grammar({"type": "string", "maxLength": MAX_REPEAT})
    assert json_schema_grammar({"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"})
    assert json_schema_grammar({"enum": [f"v{i}" for i in range(500)]})
    # properties named like keywords are names, not keywords (a password tool's maxLength)
    assert json_schema_grammar({"type": "object", "properties": {
        "maxLength": {"type": "integer"}, "pattern": {"type": "string"},
        "enum": {"type": "boolean"}}})
    # a model of 80 text fields of up to 255 characters, as pydantic writes constr(max_length)
    assert json_schema_grammar({"type": "object", "properties": {
        f"field{i}": {"type": "string", "maxLength": 255} for i in range(80)}})


def test_a_recursive_pydantic_model_converts():
    """Pydantic writes a recursive model as a root $ref into $defs (a tree of nodes)."""
    tree = {"$defs": {"Node": {"type": "object", "required": ["name", "children"], "properties": {
        "name": {"type": "string"},
        "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}},
        "$ref": "#/$defs/Node"}
    assert "children" in json_schema_grammar(tree)


def test_repetition_products_and_group_depth_are_read_right():
    assert _nested_repeats("^((a{0,10}){0,10}){3}$") == 300
    assert _nested_repeats(r"\{\d{3}\}[{}]{0,5}") == 5  # escaped and classed braces
    assert _nested_repeats("(?:x{2}|y{10}){4}(z*)+") == 40
    assert _nesting('root ::= ("(" [()] (a (b)?)?) # ((((\n') == 3


def test_a_grammar_too_deep_for_the_parser_is_refused_before_llama_cpp_sees_it(smollm2):
    """Any GBNF, not only a converted schema: 3,000 nested groups would overflow the
    parser's stack on a small thread."""
    deep = "root ::= " + "(" * 3000 + '"a"' + ")" * 3000
    with pytest.raises(InvalidRequest, match="nests 3,000 groups deep"):
        smollm2.chat(QUESTION, SamplingParams(max_tokens=2, grammar=deep))
    assert smollm2.chat(QUESTION, SamplingParams(temperature=0, max_tokens=2)).text()


def test_the_largest_allowed_grammar_builds_on_a_small_thread_stack(smollm2_path):
    """llama.cpp parses a grammar by recursion; a secondary thread on macOS has 512 KiB of
    stack. Built there directly, the largest allowed grammar (1,000 nested groups) took the
    process down; the builder's own thread has room. In a child process: a crash here would
    take the test run with it."""
    code = textwrap.dedent(f"""
        import json, threading
        from localinfer.backends.base import LoadOptions, SamplingParams
        from localinfer.chat_formats.grammar import json_schema_grammar
        from localinfer.backends.llamacpp import LlamaCppBackend
        backend = LlamaCppBackend({str(smollm2_path)!r}, LoadOptions(n_ctx=256), name="m")
        grammar = json_schema_grammar({{"type": "string", "maxLength": 1000}})
        out = []
        def ask():
            g = backend.generate(backend.tokenize("Say hi"), SamplingParams(
                temperature=0, max_tokens=4, grammar=grammar))
            out.append(g.text())
        threading.stack_size(256 * 1024)
        t = threading.Thread(target=ask)
        t.start(); t.join()
        backend.close()
        print("reply", json.dumps(out))
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith('reply ["\\"')


def test_a_grammar_too_slow_per_token_ends_its_request_and_no_other(smollm2, monkeypatch):
    """A grammar that costs more than the engine allows for one token ends with a clear
    error; a stream beside it goes on. (The allowance is lowered so any grammar exceeds it.)"""
    monkeypatch.setattr(smollm2.engine, "grammar_limit_s", 0.0)
    plain = smollm2.chat(QUESTION, SamplingParams(temperature=0, max_tokens=24))
    constrained = smollm2.chat(QUESTION, SamplingParams(
        temperature=0, max_tokens=24, grammar=json_schema_grammar({"type": "string"})))
    with pytest.raises(InvalidRequest, match=r"took \d+\.\d+ s for one token, more than the 0 s"):
        constrained.text()
    assert plain.text() and plain.stats.finish_reason in ("stop", "length")
    assert smollm2.stats().active == 0
    monkeypatch.undo()
    again = smollm2.chat(QUESTION, SamplingParams(  # the slot it held serves again
        temperature=0, max_tokens=8, grammar=json_schema_grammar({"type": "string"})))
    assert again.text().startswith('"')
