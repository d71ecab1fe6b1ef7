"""Structured output's cost is bounded: before a grammar is built, and per token after."""

from __future__ import annotations

import re
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


def _as_regex(gbnf: str):
    """integer_range's alternatives (quoted digits, classes, {n}, groups) as a Python regex."""
    import re

    return re.compile(gbnf.replace(" ", "").replace('"', ""))


def test_an_integers_bounds_are_written_as_json_writes_its_numbers():
    import random

    from localinfer.chat_formats.grammar import integer_range

    rnd = random.Random(7)
    bounds = [(0, 0), (-5, 5), (10, 20), (99, 101), (105, 1999), (-1000, -1), (7, 7)]
    bounds += [tuple(sorted((rnd.randint(-2500, 2500), rnd.randint(-2500, 2500))))
               for _ in range(60)]
    for low, high in bounds:
        allowed = _as_regex(integer_range(low, high))
        for n in range(low - 300, high + 300):
            assert bool(allowed.fullmatch(str(n))) == (low <= n <= high), (low, high, n)
        assert not any(allowed.fullmatch(s) for s in ("-0", "00", "01", "-01", "+1", ""))


def test_a_schemas_integer_bounds_reach_the_grammar_or_are_refused():
    def allowed(schema):
        rule = json_schema_grammar(schema).split("\n")[0]  # root ::= (…) space
        return _as_regex(rule.removeprefix("root ::= ").removesuffix(" space"))

    assert allowed({"type": "integer", "minimum": 10, "maximum": 20}).fullmatch("20")
    assert not allowed({"type": "integer", "minimum": 10, "maximum": 20}).fullmatch("27")
    exclusive = allowed({"type": "integer", "exclusiveMinimum": 5, "exclusiveMaximum": 8.5})
    assert [n for n in range(0, 12) if exclusive.fullmatch(str(n))] == [6, 7, 8]
    draft4 = allowed({"type": "integer", "minimum": 5, "exclusiveMinimum": True, "maximum": 7})
    assert [n for n in range(0, 12) if draft4.fullmatch(str(n))] == [6, 7]
    named = json_schema_grammar({"type": "object", "properties": {  # (a property's name)
        "minimum": {"type": "integer", "minimum": 1}}})
    rule = next(line for line in named.split("\n") if line.startswith("minimum ::= "))
    positive = _as_regex(rule.removeprefix("minimum ::= ").removesuffix(" space"))
    assert positive.fullmatch("1") and not positive.fullmatch("0")
    with pytest.raises(InvalidRequest, match="no integer"):
        json_schema_grammar({"type": "integer", "minimum": 10, "maximum": 1})
    with pytest.raises(InvalidRequest, match="minimum in the JSON schema must be a number"):
        json_schema_grammar({"type": "integer", "minimum": "ten"})


def test_a_model_sampling_freely_writes_integers_within_the_schemas_bounds(smollm2):
    """The grammar, built by llama.cpp: whatever the sampler draws, the integer is in range
    (the port's own converter left the bounds out: a model asked for 10-20 wrote 27)."""
    import json

    schema = {"type": "object", "required": ["n"],
              "properties": {"n": {"type": "integer", "minimum": 500, "maximum": 510}}}
    grammar = json_schema_grammar(schema)
    for seed in range(6):
        text = smollm2.chat(QUESTION, SamplingParams(temperature=1.5, seed=seed, max_tokens=24,
                                                     grammar=grammar)).text()
        assert 500 <= json.loads(text)["n"] <= 510, text


@pytest.mark.parametrize("schema,says", [
    ("x", "the schema must be a JSON schema object"),
    ({"type": "object", "properties": {"arguments": "x"}}, "properties 'arguments'"),
    ({"anyOf": "x"}, "anyOf in the JSON schema must be a list"),
    ({"type": "array", "items": [{"type": "string"}, 5]}, "items 1 in the JSON schema"),
    ({"not": []}, "not in the JSON schema must be a schema"),
    ({"enum": []}, "enum in the JSON schema is empty"),
    ({"type": "object", "properties": {"a": {"oneOf": []}}}, "oneOf in the JSON schema is empty"),
])
def test_a_schema_of_the_wrong_shape_is_refused_in_its_own_terms(schema, says):
    """Not the converter's internals ("'str' object has no attribute 'get'") nor a GBNF
    syntax error for a client that sent no GBNF."""
    with pytest.raises(InvalidRequest, match=re.escape(says)):
        json_schema_grammar(schema)


def test_a_tools_parameters_of_the_wrong_shape_are_refused_in_their_own_terms():
    from localinfer.chat_formats.grammar import framed_json_grammar

    with pytest.raises(InvalidRequest, match="a tool's parameters must be a JSON schema object"):
        framed_json_grammar([("<tool_call>", "x", "</tool_call>")])
