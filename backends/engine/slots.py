"""A slot (one sequence of the shared context) and the task it serves: the engine's state,
shared by its parts (the KV policy in cells.py, the speculator)."""

from __future__ import annotations

import codecs
import ctypes
import enum
from dataclasses import dataclass, field
from collections.abc import Sequence

from localinfer.backends.base import Generation, Logprob, SamplingParams
from localinfer.backends.engine.draft import common_prefix
from localinfer.backends.native.model import SamplerChain
from localinfer.backends.metrics import RequestStats
from localinfer.backends.engine.stop import StopMatcher
from localinfer.backends.engine.think_budget import ThinkBudget
from localinfer.backends.native.vision import Pictures

__all__ = ["Resume", "Slot", "SlotState", "Task"]


class SlotState(enum.Enum):
    IDLE = "idle"
    PROCESSING_PROMPT = "processing_prompt"
    GENERATING = "generating"


@dataclass
class Checkpoint:
    """A slot's recurrent state at one point of its sequence (engine/checkpoints.py)."""

    n_tokens: int  # the slot's sequence held its first n_tokens when it was saved
    data: ctypes.Array  # its partial state, as llama.cpp wrote it


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
    pictures: Pictures | None = None  # its images' encoded chunks, by placeholder id
    # log probabilities of written tokens whose text has not gone out yet (a stop string's
    # first characters held back): they go with the text (SamplingParams.logprobs)
    logprobs: list[Logprob] = field(default_factory=list)
    think: ThinkBudget | None = None  # its reasoning budget as the reply comes (if any)

    def close(self) -> None:
        """What it holds goes (it has ended, or never started)."""
        if self.pictures:
            self.pictures.close()
            self.pictures = None
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
    # Images whose tokens share positions (M-RoPE: Qwen-VL's take max(rows, columns) for
    # rows x columns tokens): each one read, by placeholder, as (tokens, positions); and how
    # many positions fewer than tokens the cache holds. Elsewhere a token's position is its
    # index in the cache.
    spans: dict[int, tuple[int, int]] = field(default_factory=dict)
    deficit: int = 0
    # a recurrent state saved at points of its sequence, oldest first (checkpoints.py)
    checkpoints: list[Checkpoint] = field(default_factory=list)

    def position(self, index: int) -> int:
        """Where the cache's `index`-th token sits (its index, less what images before it
        save)."""
        return index - _deficit(self.cache[:index], self.spans) if self.deficit else index

    def recount(self) -> None:
        """After the cache was cut or replaced: what its images save again (and the spans of
        images it no longer holds forgotten)."""
        if self.spans:
            held = set(self.cache)
            self.spans = {p: span for p, span in self.spans.items() if p in held}
        self.deficit = _deficit(self.cache, self.spans) if self.spans else 0

    @property
    def rebuilding(self) -> bool:
        """Reading a preempted request's tokens back: its next token is already known."""
        return self.task is not None and self.to_read is not self.task.prompt

    def common_prefix(self, tokens: Sequence[int]) -> int:
        return common_prefix(self.cache, tokens)

    def hand_back(self) -> None:
        """Preempted: the task takes what it needs to go on later. One still reading its
        prompt starts over; one generating, or still reading back its tokens after an earlier
        preemption, keeps its sampler, text decoder and stop matcher, so it goes on exactly
        where it was."""
        task = self.task
        if self.state is SlotState.GENERATING:
            task.resume = Resume(list(self.cache), self.next_token, self.sampler,
                                 self.decoder, self.stop)
        elif self.rebuilding:  # preempted again before its tokens were read back
            task.resume = Resume(self.to_read, self.next_token, self.sampler,
                                 self.decoder, self.stop)
        else:  # it has sampled nothing yet: its sampler is as good as new
            task.sampler = self.sampler
        self.sampler = None  # now the task's

    def release(self, now: float) -> None:
        """The task has ended or gone back to the queue: the slot is idle, its KV kept."""
        if self.sampler:
            self.sampler.close()
        self.sampler = self.decoder = self.stop = self.task = None
        self.to_read = []
        self.state = SlotState.IDLE
        self.batch_index = -1
        self.last_used = now


def _deficit(tokens: Sequence[int], spans: dict[int, tuple[int, int]]) -> int:
    """Positions saved by the whole images in `tokens` (runs of one placeholder; the same
    picture twice in a row is one run of twice its tokens)."""
    saved, i, n = 0, 0, len(tokens)
    while i < n:
        token = tokens[i]
        if token >= 0 or token not in spans:
            i += 1
            continue
        j = i
        while j < n and tokens[j] == token:
            j += 1
        size, positions = spans[token]
        saved += (j - i) // size * (size - positions)
        i = j
    return saved
