"""A slot (one sequence of the shared context) and the task it serves: the engine's state,
shared by its parts (the KV policy in cells.py, the speculator)."""

from __future__ import annotations

import codecs
import enum
from dataclasses import dataclass, field
from collections.abc import Sequence

from localinfer.backends.base import Generation, SamplingParams
from localinfer.backends.draft import common_prefix
from localinfer.backends.llama_native import SamplerChain
from localinfer.backends.metrics import RequestStats
from localinfer.backends.stop import StopMatcher

__all__ = ["Resume", "Slot", "SlotState", "Task"]


class SlotState(enum.Enum):
    IDLE = "idle"
    PROCESSING_PROMPT = "processing_prompt"
    GENERATING = "generating"


@dataclass
class Resume:
    """What a preempted request needs to go on where it stopped, once its KV is rebuilt."""

    tokens: list[int]  # whose KV it held: the prompt and what it had generated (shifts applied)
    next_token: int  # sampled, not yet fed to the model
    sampler: SamplerChain
    decoder: codecs.IncrementalDecoder
    stop: StopMatcher


@dataclass
class Task:
    id: int
    prompt: list[int]
    params: SamplingParams
    generation: Generation
    stats: RequestStats
    sampler: SamplerChain | None = None  # built when submitted; the slot takes it
    resume: Resume | None = None

    def close(self) -> None:
        if self.sampler:
            self.sampler.close()
            self.sampler = None
        if self.resume:
            self.resume.sampler.close()
            self.resume = None


@dataclass
class Slot:
    id: int
    state: SlotState = SlotState.IDLE
    cache: list[int] = field(default_factory=list)  # tokens whose KV this sequence holds
    last_used: float = 0.0
    task: Task | None = None
    to_read: list[int] = field(default_factory=list)  # the prompt, or a preempted one's tokens
    n_prompt_done: int = 0
    next_token: int = -1  # sampled last step, fed to the model this step
    batch_index: int = -1  # where this slot's logits sit in the current batch, -1 if none
    output_row: int = -1  # the row of those logits among the step's outputs
    sampler: SamplerChain | None = None
    decoder: codecs.IncrementalDecoder | None = None
    stop: StopMatcher | None = None
    draft: list[int] = field(default_factory=list)  # guesses in this step's batch
    draft_quality: float = 1.0  # moving share of guesses accepted for the current request

    @property
    def rebuilding(self) -> bool:
        """Reading a preempted request's tokens back: its next token is already known."""
        return self.task is not None and self.to_read is not self.task.prompt

    def common_prefix(self, tokens: Sequence[int]) -> int:
        return common_prefix(self.cache, tokens)
