"""Structured output: JSON Schema → GBNF for the grammar sampler, with its cost bounded.

The converter is llama-cpp-python's port of llama.cpp's json-schema-to-grammar, the one
llama.cpp's own server uses; this module gives it our error type and bounds what a
schema may cost before anything is built. The port writes a repetition of up to n items
as n nested optional groups, and llama.cpp parses a grammar by recursion: a schema as
small as `{"type": "string", "maxLength": 20000}` nested 20,000 groups deep and overflowed
the stack of the thread that parsed it (a crash of the whole process, measured). Nested
bounded repetitions in a pattern (`((a{0,100}){0,100}){0,100}`) are ambiguous, and the
sampler then keeps millions of parse stacks: minutes per token. So, before conversion:
- every repetition bound (maxLength, minLength, maxItems, minItems, `{m,n}` in a pattern)
  is at most `MAX_REPEAT`, and nested bounded repetitions in a pattern multiply to at most
  `MAX_REPEAT` as well;
- the schema has at most `MAX_NODES` subschemas, nests at most `MAX_DEPTH` deep, lists at
  most `MAX_ENUM` enum/const values in all (the limits OpenAI's structured outputs set),
  and its repetition bounds add up to at most `MAX_EXPANSION`;
and after conversion the grammar is at most `MAX_GRAMMAR_BYTES` long and nests at most
`MAX_GRAMMAR_DEPTH` groups deep (`check_gbnf`, which the sampler's builder applies to any
grammar). Each refusal is an `InvalidRequest` that names the limit.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from llama_cpp.llama_grammar import JSON_GBNF, RESERVED_NAMES, SchemaConverter

from localinfer.errors import InvalidRequest

__all__ = ["ANY_JSON", "MAX_REPEAT", "check_gbnf", "framed_json_grammar", "json_schema_grammar",
           "literal"]

ANY_JSON = JSON_GBNF  # any JSON value whose top level is an object ("json_object" mode)

MAX_REPEAT = 1000  # llama.cpp's own parser refuses repetitions past ~1,100 nested groups
MAX_EXPANSION = 100_000  # all repetition bounds of one schema, added up (the GBNF's own
# size limit then decides: 80 fields of maxLength 255, a common model, is ~170 KB)
MAX_NODES = 5000
MAX_DEPTH = 32
MAX_ENUM = 1000
MAX_PATTERN = 1000  # characters of one regular expression
MAX_GRAMMAR_BYTES = 512 * 1024
MAX_GRAMMAR_DEPTH = 2000  # nested groups; the parser is built on a 64 MiB stack (~450 B each)

_COUNTS = (("minLength", "maxLength"), ("minItems", "maxItems"),
           ("minProperties", "maxProperties"))
# keywords whose value maps names to subschemas: the names are not keywords
_NAMED = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_QUANTIFIER = re.compile(r"\{(\d+)(,?)(\d*)\}")


def json_schema_grammar(schema: Mapping[str, Any]) -> str:
    """The GBNF for a JSON schema, or InvalidRequest when it is malformed or too costly."""
    _check_object(schema, "the schema")
    _Budget().visit(schema, 0)
    try:
        converter = _Converter(prop_order={}, allow_fetch=False, dotall=False,
                               raw_pattern=False)
        # (through JSON: the schema as a client could have sent it, nothing of Python's)
        converter.visit(converter.resolve_refs(json.loads(json.dumps(_inline_root_ref(schema))),
                                               "stdin"), "")
        grammar = converter.format_grammar()
    except InvalidRequest:
        raise
    except (KeyError, RecursionError) as exc:  # a $ref to itself, directly or in a loop
        raise InvalidRequest(f"the JSON schema's $ref {str(exc)[:80]} cannot be resolved: it "
                             "refers to itself before any value is written") from None
    except Exception as exc:  # the converter raises bare exceptions of several kinds
        raise InvalidRequest(f"the JSON schema cannot be turned into a grammar: {exc}") from None
    check_gbnf(grammar)
    return grammar


def literal(text: str) -> str:
    """A GBNF string literal."""
    return json.dumps(text, ensure_ascii=False)


def framed_json_grammar(frames: list[tuple[str, Mapping[str, Any], str]]) -> str:
    """One of several JSON values, each between literal text (a family's tool-call syntax
    around a call's JSON): `root ::= before value after | …`, each schema bounded as above."""
    converter = _Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    alternatives = []
    try:
        for i, (before, schema, after) in enumerate(frames):
            _check_object(schema, "a tool's parameters")
            _Budget().visit(schema, 0)
            resolved = converter.resolve_refs(_inline_root_ref(schema), "stdin")
            rule = converter.visit(resolved, f"value{i}")
            alternatives.append(" ".join(p for p in (literal(before) if before else "", rule,
                                                     literal(after) if after else "") if p))
    except (KeyError, RecursionError) as exc:
        raise InvalidRequest(f"a tool's JSON schema $ref {str(exc)[:80]} cannot be resolved: "
                             "it refers to itself before any value is written") from None
    except InvalidRequest:
        raise
    except Exception as exc:
        raise InvalidRequest(f"a tool's JSON schema cannot be turned into a grammar: "
                             f"{exc}") from None
    grammar = f"root ::= {' | '.join(alternatives)}\n{converter.format_grammar()}"
    check_gbnf(grammar)
    return grammar


_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_INTEGER_DIGITS = 16  # the most digits the converter's own integers have (its integral-part)


class _Converter(SchemaConverter):
    """The port's converter, with an integer's bounds (minimum, maximum and the exclusive
    ones) kept by the grammar, as llama.cpp's own converter keeps them: the port ignores
    them, and a model asked for an integer of 10 to 20 wrote 27. A number's (not an
    integer's) bounds are not kept, by either converter."""

    def visit(self, schema: Any, name: str) -> str:
        if (isinstance(schema, Mapping) and schema.get("type") == "integer"
                and any(k in schema for k in _BOUNDS)
                and not any(k in schema for k in ("$ref", "oneOf", "anyOf", "const", "enum"))):
            low, high = _integer_bounds(schema)
            rule = name + "-" if name in RESERVED_NAMES else name or "root"
            return self._add_rule(rule, f"({integer_range(low, high)}) space")
        return super().visit(schema, name)


def _integer_bounds(schema: Mapping[str, Any]) -> tuple[int, int]:
    """The least and greatest integer a schema's bounds allow (within the digits the grammar
    writes), or InvalidRequest when none does."""
    top = 10 ** _INTEGER_DIGITS - 1
    low, high = -top, top
    for key in _BOUNDS:
        value = schema.get(key)
        if value is None or (isinstance(value, bool) and key.startswith("exclusive")):
            continue  # (draft 4 wrote the exclusive ones as flags: below)
        _number(key, value)
        exclusive = key.startswith("exclusive") or schema.get(f"exclusive{key.title()}") is True
        if key.endswith("inimum"):
            low = max(low, math.floor(value) + 1 if exclusive else math.ceil(value))
        else:
            high = min(high, math.ceil(value) - 1 if exclusive else math.floor(value))
    if low > high:
        raise InvalidRequest("the JSON schema's minimum and maximum leave no integer between "
                             "them (within 16 digits) — check its bounds")
    return low, high


def integer_range(low: int, high: int) -> str:
    """GBNF alternatives for the decimal integers from `low` to `high` (as JSON writes them:
    no leading zeros, no "-0")."""
    parts = []
    if low < 0 and high < 0 or low < 0 <= high:
        parts.append(f'"-" ({_naturals(max(1, -high), -low)})')
    if high >= 0:
        parts.append(_naturals(max(0, low), high))
    return " | ".join(parts)


def _naturals(a: int, b: int) -> str:
    """0 <= a <= b, by their counts of digits: each a run of numbers as long as each other."""
    runs = []
    for length in range(len(str(a)), len(str(b)) + 1):
        first = max(a, 10 ** (length - 1) if length > 1 else 0)
        last = min(b, 10 ** length - 1)
        if first <= last:
            runs += _same_length(str(first), str(last))
    return " | ".join(runs)


def _same_length(x: str, y: str) -> list[str]:
    """Alternatives for the digit strings from x to y, both of one length (inner digits may
    be zeros)."""
    rest = len(x) - 1
    if not rest:
        return [_digit(x, y)]
    if x[0] == y[0]:
        return [f'"{x[0]}" ({" | ".join(_same_length(x[1:], y[1:]))})']
    out = []
    start, end = x[0], y[0]
    if x[1:] != "0" * rest:  # the first digit's part of a block
        out.append(f'"{x[0]}" ({" | ".join(_same_length(x[1:], "9" * rest))})')
        start = str(int(x[0]) + 1)
    tail = None
    if y[1:] != "9" * rest:  # the last digit's
        tail = f'"{y[0]}" ({" | ".join(_same_length("0" * rest, y[1:]))})'
        end = str(int(y[0]) - 1)
    if start <= end:  # whole blocks between
        out.append(f"{_digit(start, end)} " + ("[0-9]" if rest == 1 else f"[0-9]{{{rest}}}"))
    return out + ([tail] if tail else [])


def _digit(a: str, b: str) -> str:
    return f"[{a}]" if a == b else f"[{a}-{b}]"


_ONE_SCHEMA = ("items", "additionalProperties", "not", "if", "then", "else", "contains",
               "propertyNames", "unevaluatedItems", "unevaluatedProperties")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


def _check_subschemas(key: str, value: Any) -> None:
    """A keyword whose value is a schema (or a list or map of them) holds objects or
    booleans: a string there broke the converter with a message of its own internals."""
    if key in _NAMED and isinstance(value, Mapping):
        values, where = list(value.items()), f"{key} "
    elif key in _SCHEMA_LISTS or key == "items" and isinstance(value, list):
        if not isinstance(value, list):
            raise InvalidRequest(f"{key} in the JSON schema must be a list of schemas, not "
                                 f"{value!r:.40}")
        values, where = list(enumerate(value)), f"{key} "
    elif key in _ONE_SCHEMA:
        values, where = [("", value)], ""
    else:
        return
    for name, subschema in values:
        if not isinstance(subschema, (Mapping, bool)):
            place = f"{where}{name!r}" if where else key
            raise InvalidRequest(f"{place.strip()} in the JSON schema must be a schema (an "
                                 f"object), not {subschema!r:.40}")


def _number(key: str, value: Any) -> None:
    """A keyword that takes a number has a finite one (not a bool, a string, NaN)."""
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or isinstance(value, float) and not math.isfinite(value)):
        raise InvalidRequest(f"{key} in the JSON schema must be a number, not {value!r:.40}")


def _check_object(schema: Any, what: str) -> None:
    if not isinstance(schema, Mapping):
        raise InvalidRequest(f"{what} must be a JSON schema object, not {schema!r:.40}")


def _inline_root_ref(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    """Pydantic writes a recursive model as a root `$ref` into `$defs`; the converter cannot
    start from a reference, so the definition it names takes its place (refs within stay)."""
    ref = schema.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return schema
    section, _, name = ref[2:].partition("/")
    target = schema.get(section, {}).get(name) if section in ("$defs", "definitions") else None
    if not isinstance(target, Mapping) or target.get("$ref") == ref:
        return schema  # a reference to itself stays, and is refused below
    return {**{k: v for k, v in schema.items() if k != "$ref"}, **target}


def check_gbnf(grammar: str) -> None:
    """Refuse a grammar too long or too deeply nested for llama.cpp's recursive parser."""
    if len(grammar) > MAX_GRAMMAR_BYTES:
        raise InvalidRequest(f"the grammar is {len(grammar):,} bytes, more than the "
                             f"{MAX_GRAMMAR_BYTES:,} allowed — simplify the schema")
    depth = _nesting(grammar)
    if depth > MAX_GRAMMAR_DEPTH:
        raise InvalidRequest(f"the grammar nests {depth:,} groups deep, more than the "
                             f"{MAX_GRAMMAR_DEPTH:,} allowed — simplify the schema")


def _nesting(grammar: str) -> int:
    """The deepest nesting of ( ) groups, outside string literals, character classes and
    comments."""
    depth = deepest = 0
    i, n = 0, len(grammar)
    while i < n:
        c = grammar[i]
        if c == '"' or c == "[":
            close = '"' if c == '"' else "]"
            i += 1
            while i < n and grammar[i] != close:
                i += 2 if grammar[i] == "\\" else 1
        elif c == "#":
            while i < n and grammar[i] != "\n":
                i += 1
        elif c == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif c == ")":
            depth -= 1
        i += 1
    return deepest


class _Budget:
    """Walks a schema once, counting what its grammar would cost; refuses past the limits."""

    def __init__(self) -> None:
        self.nodes = self.enums = self.expansion = 0

    def visit(self, node: Any, depth: int) -> None:
        if isinstance(node, list):
            for item in node:
                self.visit(item, depth)
            return
        if not isinstance(node, Mapping):
            return
        if depth > MAX_DEPTH:
            raise InvalidRequest(f"the JSON schema nests more than {MAX_DEPTH} levels deep")
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise InvalidRequest(f"the JSON schema has more than {MAX_NODES:,} subschemas")
        for low, high in _COUNTS:  # the larger of a pair is what the grammar spells out
            self._spend(max(self._count(node, low), self._count(node, high)))
        enum = node.get("enum")
        for key in ("enum", "anyOf", "oneOf"):  # (an empty one: no value could be written)
            if key in node and node[key] == []:
                raise InvalidRequest(f"{key} in the JSON schema is empty: no value matches it "
                                     "— list at least one")
        self.enums += (len(enum) if isinstance(enum, list) else 0) + ("const" in node)
        if self.enums > MAX_ENUM:
            raise InvalidRequest(f"the JSON schema lists more than {MAX_ENUM:,} enum or const "
                                 "values in all")
        if isinstance(node.get("pattern"), str):
            self._pattern(node["pattern"])
        for key, value in node.items():
            _check_subschemas(key, value)
            if key in _NAMED and isinstance(value, Mapping):
                for subschema in value.values():  # (a property may be named "maxLength")
                    self.visit(subschema, depth + 1)
            elif key not in ("enum", "const", "default", "examples", "pattern"):
                self.visit(value, depth + 1)

    @staticmethod
    def _count(node: Mapping[str, Any], key: str) -> int:
        value = node.get(key)
        if value is None:
            return 0
        _number(key, value)
        if value > MAX_REPEAT:
            raise InvalidRequest(f"{key} {str(value)[:20]} in the JSON schema is more than the "
                                 f"{MAX_REPEAT:,} that structured output allows")
        return max(int(value), 0)

    def _spend(self, value: int) -> None:
        self.expansion += value
        if self.expansion > MAX_EXPANSION:
            raise InvalidRequest(f"the JSON schema's lengths and counts add up to more than "
                                 f"{MAX_EXPANSION:,} — lower maxLength / maxItems")

    def _pattern(self, pattern: str) -> None:
        if len(pattern) > MAX_PATTERN:
            raise InvalidRequest(f"a pattern in the JSON schema is {len(pattern):,} characters, "
                                 f"more than the {MAX_PATTERN:,} allowed")
        product = _nested_repeats(pattern)
        if product > MAX_REPEAT:
            raise InvalidRequest(f"the pattern {pattern[:60]!r} nests bounded repetitions that "
                                 f"multiply to {product:,}, more than the {MAX_REPEAT:,} "
                                 "allowed — use * or + for open-ended parts")
        self._spend(product)


def _nested_repeats(pattern: str) -> int:
    """The largest product of `{m,n}` bounds along any nesting of groups in a regular
    expression (`((a{0,10}){0,10}){3}` → 300). Open-ended quantifiers (* + ?) add no
    factor: the grammar keeps them as loops, not copies."""
    inner = [1]  # per open group: the largest product found inside it so far
    last = 1  # the product of the atom (or group) just read, which a quantifier multiplies
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        match = _QUANTIFIER.match(pattern, i) if c == "{" else None
        if match:
            low, _, high = match.groups()
            last *= max(int(high) if high else int(low), 1)
            inner[-1] = max(inner[-1], last)
            if last > MAX_REPEAT * MAX_REPEAT:
                return last
            i = match.end()
            continue
        if c == "(":
            inner.append(1)
        elif c == ")" and len(inner) > 1:
            last = inner.pop()
            inner[-1] = max(inner[-1], last)
            i += 1
            continue
        elif c == "[":  # a character class is one atom
            i += 1
            while i < n and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
        elif c == "\\":
            i += 1
        if c not in "*+?":
            last = 1
        i += 1
    return max(inner)
