"""Structured output: JSON Schema → GBNF for the grammar sampler.

The converter is llama-cpp-python's port of llama.cpp's json-schema-to-grammar, the one
llama.cpp's own server uses; this module only gives it our error type.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

from localinfer.errors import InvalidRequest

__all__ = ["ANY_JSON", "json_schema_grammar"]

ANY_JSON = JSON_GBNF  # any JSON value whose top level is an object ("json_object" mode)


def json_schema_grammar(schema: Mapping[str, Any]) -> str:
    try:
        return json_schema_to_gbnf(json.dumps(schema))
    except Exception as exc:  # the converter raises bare exceptions of several kinds
        raise InvalidRequest(f"the JSON schema cannot be turned into a grammar: {exc}") from None
