"""Which call syntax and reasoning markers a chat template teaches its model, read from the
template's own text (as llama.cpp and Ollama do), as a `ChatFormat`.

A template that renders `tools` itself teaches its family's call syntax (Hermes'
`<tool_call>` JSON, Llama 3's bare JSON, Mistral's `[TOOL_CALLS]`, DeepSeek's and Kimi's
section tokens, Qwen3-Coder's and GLM's XML, Granite's `<|tool_call|>`, Command R7B's
actions, Gemma 4's, gpt-oss's channels); each syntax's parser and grammar are in
`families/`. A template that knows no tools gets them through a generic instruction and
writes the generic JSON shape (`api/tools.py`). Reasoning is the text between a family's
thinking markers (`<think>` … `</think>`, Command R7B's `<|START_THINKING|>`); a template
whose generation prompt opens the block itself (DeepSeek-R1, QwQ) starts the reply inside it
(prompt.py's `opens_reasoning`).
"""

from __future__ import annotations

import re
import secrets
import string
from dataclasses import dataclass, field

from localinfer.chat_formats.families import (delimited, gemma4, generic, harmony, hermes,
                                               listed, llama3, mistral, xml)
from localinfer.chat_formats.scan import CallGrammar, Section

__all__ = ["GENERIC", "HARMONY", "ChatFormat", "detect"]


@dataclass(frozen=True)
class ChatFormat:
    name: str
    openers: tuple[str, ...] = ()  # where a calls' section begins, anywhere in a reply
    first_openers: tuple[str, ...] = ()  # … or only as a reply's first text
    section: Section | None = None  # the calls read out of a section (families/)
    think: tuple[str, str] | None = None  # reasoning's markers
    dropped: tuple[str, ...] = ()  # markers around the answer, not part of it
    template_tools: bool = True  # the template writes the tools itself
    short_ids: bool = False  # Mistral's templates insist on 9-character call ids
    preserved: tuple[str, ...] = field(default=())  # control tokens to keep as text
    calls_end_thinking: bool = False  # a call opens without closing the reasoning first
    variant: str = ""  # DeepSeek: "r1" writes `function<sep>NAME` and fences the JSON
    grammar: CallGrammar = generic.grammar  # a forced call's, in this syntax (families/)

    def call_id(self) -> str:
        if self.short_ids:
            return "".join(secrets.choice(string.ascii_letters + string.digits)
                           for _ in range(9))
        return f"call_{secrets.token_hex(12)}"

    @property
    def markers(self) -> tuple[str, ...]:
        return (*self.openers, *self.first_openers, *(self.think or ()), *self.dropped)


_THINK = ("<think>", "</think>")

GENERIC = ChatFormat("generic", first_openers=generic.FIRST_OPENERS, section=generic.section,
                     template_tools=False)
HARMONY = ChatFormat("harmony", think=("<|channel|>analysis", "<|end|>"),
                     preserved=("<|start|>", "<|end|>", "<|channel|>", "<|message|>",
                                "<|constrain|>"), grammar=harmony.grammar)


def detect(source: str | None) -> ChatFormat:
    """The call syntax and reasoning markers of a chat template, from its text."""
    if not source:
        return GENERIC
    think = _THINK if "<think>" in source or "</think>" in source else None
    for family in _FAMILIES:
        fmt = family(source, think)
        if fmt is not None:
            return fmt
    return ChatFormat("generic", first_openers=GENERIC.first_openers, section=generic.section,
                      think=think, template_tools=False)


# each: the family's format where the template is one of its own, else None; in the order
# they are tried (a template may name another family's marks too)
def _deepseek(source: str, think: tuple[str, str] | None) -> ChatFormat | None:
    if "<｜tool▁calls▁begin｜>" not in source:
        return None
    r1 = "```json" in source
    return ChatFormat("deepseek", openers=(delimited.DEEPSEEK["tool▁calls▁begin"],),
                      section=delimited.deepseek_section, think=think or _THINK,
                      preserved=tuple(delimited.DEEPSEEK.values()), variant="r1" if r1 else "",
                      grammar=delimited.deepseek_grammar(r1))


def _harmony(source: str, think: tuple[str, str] | None) -> ChatFormat | None:
    return HARMONY if "<|channel|>" in source and "<|message|>" in source else None


def _gemma4(source: str, think: tuple[str, str] | None) -> ChatFormat | None:
    if gemma4.OPEN not in source:
        return None
    return ChatFormat("gemma4", openers=(gemma4.OPEN,), section=gemma4.section,
                      think=("<|channel>thought", "<channel|>"), dropped=("<channel|>",),
                      preserved=(gemma4.OPEN, gemma4.CLOSE, '<|"|>', "<|channel>",
                                 "<channel|>"), grammar=gemma4.grammar)


def _kimi(source: str, think: tuple[str, str] | None) -> ChatFormat | None:
    if delimited.KIMI[0] not in source:
        return None
    return ChatFormat("kimi-k2", openers=(delimited.KIMI[0],), section=delimited.kimi_section,
                      think=think, preserved=delimited.KIMI, grammar=delimited.kimi_grammar)


def _command_r7b(source: str, think: tuple[str, str] | None) -> ChatFormat | None:
    if "<|START_ACTION|>" not in source:
        return None
    return ChatFormat("command-r7b", openers=("<|START_ACTION|>",),
                      section=listed.section("<|START_ACTION|>", "<|END_ACTION|>"),
                      think=("<|START_THINKING|>", "<|END_THINKING|>"),
                      dropped=("<|START_RESPONSE|>", "<|END_RESPONSE|>"),
                      preserved=("<|START_ACTION|>", "<|END_ACTION|>", "<|START_THINKING|>",
                                 "<|END_THINKING|>", "<|START_RESPONSE|>", "<|END_RESPONSE|>"),
                      grammar=listed.command_r7b_grammar)


def _qwen3_coder(source: str, think: tuple[str, str] | None) -> ChatFormat | None:
    if "<function=" not in source or "<parameter=" not in source:
        return None
    return ChatFormat("qwen3-coder", openers=("<tool_call>", "<function="),
                      section=xml.qwen3_coder_section, think=think, calls_end_thinking=True,
                      grammar=xml.qwen3_coder_grammar)


def _glm(source: str, think: tuple[str, str] | None) -> ChatFormat | None:
    if "<arg_key>" not in source:
        return None
    return ChatFormat("glm", openers=("<tool_call>",), section=xml.glm_section, think=think,
                      grammar=xml.glm_grammar)


def _hermes(source: str, think: tuple[str, str] | None) -> ChatFormat | None:
    if hermes.OPEN not in source:
        return None
    return ChatFormat("hermes", openers=(hermes.OPEN,), section=hermes.section, think=think,
                      grammar=hermes.grammar)


def _mistral(source: str, think: tuple[str, str] | None) -> ChatFormat | None:
    if mistral.OPEN not in source:
        return None
    if "[ARGS]" in source:
        return ChatFormat("mistral", openers=(mistral.OPEN,), section=mistral.section,
                          short_ids=True,
                          think=("[THINK]", "[/THINK]") if "[THINK]" in source else None,
                          preserved=(mistral.OPEN, mistral.ARGS, "[THINK]", "[/THINK]"),
                          grammar=mistral.grammar)
    return ChatFormat("mistral-nemo", openers=(mistral.OPEN,),
                      section=listed.section(mistral.OPEN), short_ids=True,
                      preserved=(mistral.OPEN,), grammar=listed.mistral_nemo_grammar)


def _granite(source: str, think: tuple[str, str] | None) -> ChatFormat | None:
    if "<|tool_call|>" not in source:
        return None
    return ChatFormat("granite", openers=("<|tool_call|>",),
                      section=listed.section("<|tool_call|>"), think=think,
                      dropped=("<response>", "</response>"), preserved=("<|tool_call|>",),
                      grammar=listed.granite_grammar)


def _llama3(source: str, think: tuple[str, str] | None) -> ChatFormat | None:
    if "ipython" not in source or "tools" not in source:
        return None
    return ChatFormat("llama3", openers=(llama3.PYTHON_TAG,), first_openers=("{",),
                      section=llama3.section, preserved=(llama3.PYTHON_TAG,),
                      grammar=llama3.grammar)


def _generic_template(source: str, think: tuple[str, str] | None) -> ChatFormat | None:
    """A template that renders tools but teaches no syntax of its own."""
    if not re.search(r"\btools\b", source):
        return None
    return ChatFormat("generic-template", first_openers=GENERIC.first_openers,
                      section=generic.section, think=think)


_FAMILIES = (_deepseek, _harmony, _gemma4, _kimi, _command_r7b, _qwen3_coder, _glm, _hermes,
             _mistral, _granite, _llama3, _generic_template)
