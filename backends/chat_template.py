"""Chat templates from GGUF metadata, rendered in a sandboxed Jinja environment.

A GGUF usually carries its template in `tokenizer.chat_template`. Some (Gemma 3 270M among
them) carry none; for those we fall back to the turn format of the architecture's family.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from datetime import datetime

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

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


@functools.lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


class ChatTemplate:
    def __init__(self, source: str, bos_token: str = "", eos_token: str = ""):
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _compile(source)
        except jinja2.TemplateError as exc:
            raise InvalidRequest(f"the model's chat template does not parse: {exc}") from exc

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        for m in messages:
            if m.get("role") not in ("system", "user", "assistant", "tool"):
                raise InvalidRequest(f"unknown message role {m.get('role')!r}")
        try:
            return self._template.render(
                messages=[dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except jinja2.exceptions.SecurityError as exc:
            raise InvalidRequest(f"the chat template tried an unsafe operation: {exc}") from exc
        except jinja2.TemplateError as exc:
            raise InvalidRequest(f"the chat template failed to render: {exc}") from exc
