"""Chat templates from GGUF metadata, rendered in a sandboxed Jinja environment.

A GGUF usually carries its template in `tokenizer.chat_template`. Some (Gemma 3 270M among
them) carry none; for those we fall back to the turn format of the architecture's family.

A template comes with the model file, so it may be hostile. Jinja's sandbox keeps it from
Python's internals, not from the machine: `{{ 'x' * 10**10 }}` took 10 GB and nested
`range(100000)` loops ran for ever. Here a render has a budget: `*` and `**` may not
build a value longer than `MAX_OUTPUT`, nor may a template read one (attributes and items are checked as
they are read); `range`, and the messages and their lists, check the clock as they are
iterated, as does every call, attribute and item, and every `for` loop's every turn
(whatever it iterates: four nested loops over one string ran for minutes); the output is
counted as it is written. Past `MAX_SECONDS` or `MAX_OUTPUT`, and for a template that
recurses without end or breaks in any other way, the answer is one InvalidRequest. (A chain
of `~` in straight-line code escapes these checks, bounded by the template's own length:
the hard limit is a process of its own.)
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range

from localinfer.errors import InvalidRequest

__all__ = ["ChatTemplate", "fallback_template"]

Message = Mapping[str, str]

# Gemma has no system role: the system text opens the first user turn.
_GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set ns = namespace(system='') -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}{%- set ns.system = m['content'] + '\n\n' -%}"
    "{%- else -%}"
    "{%- set role = 'model' if m['role'] == 'assistant' else m['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (ns.system if role == 'user' else '') + m['content'] "
    "+ '<end_of_turn>\n' }}"
    "{%- if role == 'user' -%}{%- set ns.system = '' -%}{%- endif -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)

_CHATML_TEMPLATE = (
    "{%- for m in messages -%}"
    "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)


def fallback_template(architecture: str) -> str:
    """The turn format to use when a GGUF carries no chat template."""
    if architecture.startswith("gemma"):
        return _GEMMA_TEMPLATE
    return _CHATML_TEMPLATE


def _raise_exception(message: str) -> None:
    raise InvalidRequest(f"the model's chat template rejected the conversation: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False, ensure_ascii: bool = False) -> str:
    """JSON as the templates' authors rendered it (Hugging Face's filter): no HTML escapes,
    which Jinja's own `tojson` writes (`<` as \\u003c) and no model was trained on."""
    if isinstance(indent, int) and indent > 16:
        indent = 16
    if not isinstance(value, (dict, list, tuple, str, int, float, bool, type(None))):
        value = list(value)  # a generator a template built with map() or select()
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=tuple(separators) if separators else None, sort_keys=sort_keys)


MAX_SECONDS = 2.0  # a real template renders a long chat in milliseconds
MAX_OUTPUT = 16 * 1024 * 1024  # characters, and the length of any value it builds
MAX_APPENDED = 100_000  # items a template's list may grow to


class _OverBudget(jinja2.exceptions.SecurityError):
    pass


_deadline = threading.local()  # this thread's render's deadline


def _check() -> None:
    if time.monotonic() > getattr(_deadline, "at", float("inf")):
        raise _OverBudget(f"it ran for more than {MAX_SECONDS:g} s")


def _sized(value: Any) -> Any:
    if type(value) in _SEQUENCES and len(value) > MAX_OUTPUT:
        raise _OverBudget(f"it built a value of {len(value):,} items, more than {MAX_OUTPUT:,}")
    return value


_SEQUENCES = {str, bytes, list, tuple}


class _Checked(list):
    """A list a template reads (the messages): iterating it checks the clock."""

    def __iter__(self) -> Iterator[Any]:
        for item in super().__iter__():
            _check()
            yield item


class _Range:
    """Jinja's safe range (at most 100,000 items), checking the clock as it is iterated."""

    def __init__(self, *args: int):
        self._range = safe_range(*args)

    def __iter__(self) -> Iterator[int]:
        for i in self._range:
            _check()
            yield i

    def __len__(self) -> int:
        return len(self._range)

    def __getitem__(self, index: Any) -> Any:
        return self._range[index]

    def __contains__(self, item: Any) -> bool:
        return item in self._range


class _Generation(jinja2.ext.Extension):
    """`{% generation %}…{% endgeneration %}`: Hugging Face marks the assistant's text with
    it (for training masks); rendering writes what it holds."""

    tags = {"generation"}

    def parse(self, parser: Any) -> list[Any]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class _Sandbox(ImmutableSandboxedEnvironment):
    # `+` is left alone (each use at most doubles what it reads, and reads are checked):
    # templates join strings with it everywhere, and intercepting it cost ~0.2 ms a render
    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _check()
        if operator == "**" and isinstance(left, int) and isinstance(right, int) \
                and abs(left) > 1 and right > 4096:
            raise _OverBudget(f"it raised a number to the power {right:,}")
        if operator == "*" and isinstance(right, int) and type(left) in _SEQUENCES:
            left, right = right, left
        if (operator == "*" and isinstance(left, int) and type(right) in _SEQUENCES
                and len(right) * left > MAX_OUTPUT):
            raise _OverBudget(f"it repeated a value {left:,} times")
        return super().call_binop(context, operator, left, right)

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        # a list may grow by `append` and shrink by `pop` (Kimi K2's templates build lists
        # so), up to a bound
        if attr in ("append", "pop") and isinstance(obj, list) and len(obj) < MAX_APPENDED:
            return True
        return super().is_safe_attribute(obj, attr, value)

    def getattr(self, obj: Any, attribute: str) -> Any:
        _check()
        return _sized(super().getattr(obj, attribute))

    def getitem(self, obj: Any, argument: Any) -> Any:
        _check()
        return _sized(super().getitem(obj, argument))

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        _check()
        return _sized(super().call(__context, __obj, *args, **kwargs))


def _turns(iterable: Any) -> Iterator[Any]:
    """What a template's `for` iterates, checking the clock at every turn."""
    for item in iterable:
        _check()
        yield item


@functools.lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    # loop controls ({% break %}, {% continue %}), as Hugging Face renders templates: several
    # families use them (Command R7B, Kimi, Reka)
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", _Generation])
    env.globals["range"] = _Range
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.filters["tojson"] = _tojson
    env.globals["__turns"] = _turns  # (a name no template can write: Jinja's names are words)
    tree = env.parse(source)
    for loop in tree.find_all(jinja2.nodes.For):  # every loop's iterable goes through _turns
        loop.iter = jinja2.nodes.Call(jinja2.nodes.Name("__turns", "load"), [loop.iter], [],
                                      None, None, lineno=loop.lineno)
    return env.template_class.from_code(env, env.compile(tree), env.make_globals(None), None)


class ChatTemplate:
    def __init__(self, source: str, bos_token: str = "", eos_token: str = ""):
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _compile(source)
        except jinja2.TemplateError as exc:
            raise InvalidRequest(f"the model's chat template does not parse: {exc}") from exc

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True,
               template_args: Mapping[str, Any] | None = None) -> str:
        """template_args: the other values a template reads — `tools` (OpenAI's shape),
        `enable_thinking`, `reasoning_effort` — as Hugging Face passes them."""
        extra = {k: v for k, v in (template_args or {}).items() if k not in _OWN}
        for m in messages:
            if m.get("role") not in ("system", "user", "assistant", "tool"):
                raise InvalidRequest(f"unknown message role {m.get('role')!r}")
        _deadline.at = time.monotonic() + MAX_SECONDS
        pieces, written = [], 0
        try:
            for piece in self._template.generate(
                messages=_Checked(_checked_lists(m) for m in messages),
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **extra,
            ):
                written += len(piece)
                if written > MAX_OUTPUT:
                    raise _OverBudget(f"it wrote more than {MAX_OUTPUT:,} characters")
                pieces.append(piece)
        except _OverBudget as exc:
            raise InvalidRequest(f"the model's chat template costs too much: {exc} — this "
                                 "model file's template cannot be used") from None
        except jinja2.exceptions.SecurityError as exc:
            raise InvalidRequest(f"the chat template tried an unsafe operation: {exc}") from exc
        except InvalidRequest:
            raise
        except RecursionError:
            raise InvalidRequest("the model's chat template recurses without end") from None
        except OverflowError as exc:  # Jinja's range past 100,000 items, among others
            raise InvalidRequest(f"the model's chat template asked too much: {exc}") from None
        except Exception as exc:  # any error of the template's own making
            raise InvalidRequest(f"the chat template failed to render: "
                                 f"{type(exc).__name__}: {exc}"[:300]) from exc
        finally:
            _deadline.at = float("inf")
        return "".join(pieces)


_OWN = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token"})


def _checked_lists(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message with its lists (tool calls, content parts) checked as they are iterated."""
    return {k: _Checked(v) if isinstance(v, list) else v for k, v in message.items()}
