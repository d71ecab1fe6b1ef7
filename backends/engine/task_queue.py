"""Requests on their way to a slot: the engine's wait queue.

Callers put requests from any thread; one is admitted only while fewer than `max_waiting`
wait (a full queue is `EngineBusy`: a 503, retry). The engine thread moves arrivals, and
its own signals, from the inbox into the wait list it serves in order. A request the
shared KV pool preempted (cells.py) goes back first, and does not count against the limit.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Container, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field

from localinfer.backends.base import SamplingParams
from localinfer.backends.engine.slots import Task
from localinfer.errors import InvalidRequest, PromptTooLong

__all__ = ["CANCEL_ALL", "CLOSE", "WAKE", "Job", "TaskQueue", "check_request"]

# the engine's own signals, through the same inbox as requests
WAKE = object()  # look again (a request was cancelled)
CLOSE = object()  # stop
CANCEL_ALL = object()  # every request so far ends now, with what it has


@dataclass
class Job:
    """Work that must run on the engine thread, between two steps (Engine.call): one
    decode of a pooled context. Its caller waits on `done`."""

    work: Callable[[], object]
    done: Future = field(default_factory=Future)


def check_request(prompt: list[int], params: SamplingParams, n_vocab: int,
                  n_ctx_slot: int, images: Container[int] = ()) -> None:
    """A request the engine can serve, or InvalidRequest / PromptTooLong before it queues.
    `images`: the placeholder ids of its images (vision.py), the only ids outside the
    vocabulary it may hold — never last (its logits give the first token)."""
    if not prompt:
        raise InvalidRequest("the prompt is empty")
    if len(prompt) >= n_ctx_slot:
        raise PromptTooLong(len(prompt), n_ctx_slot)
    if prompt[-1] in images:
        raise InvalidRequest("a prompt cannot end with an image: add text after it")
    bad = next((t for t in prompt if not 0 <= t < n_vocab and t not in images), None)
    if bad is not None:
        raise InvalidRequest(f"token id {bad} is outside the vocabulary (0..{n_vocab - 1})")
    bad = next((t for t, _ in params.logit_bias if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise InvalidRequest(f"logit_bias names token {bad}, outside the vocabulary "
                             f"(0..{n_vocab - 1})")


class TaskQueue:
    def __init__(self, max_waiting: int):
        self.max_waiting = max_waiting
        self.inbox: queue.SimpleQueue[object] = queue.SimpleQueue()  # any thread puts
        self.waiting: deque[Task] = deque()  # the engine thread's, in the order served
        self._lock = threading.Lock()
        self._queued = 0  # waiting for a slot, preempted requests included
        self._requeued = 0  # of those, preempted ones

    @property
    def queued(self) -> int:
        """Requests waiting for a slot, inbox and wait list (any thread)."""
        return self._queued

    def admit(self) -> bool:
        """(Any thread.) Count one more request, unless the queue is full."""
        with self._lock:
            if self._queued - self._requeued >= self.max_waiting:
                return False
            self._queued += 1
            return True

    def put(self, item: object) -> None:
        self.inbox.put(item)

    def taken(self, task: Task) -> None:
        """A request left the wait list: a slot took it, or it was cancelled."""
        with self._lock:
            self._queued -= 1
            if task.stats.preemptions:  # it was queued again by requeue_first, not admitted
                self._requeued -= 1

    def arrivals(self, block: bool, timeout: float | None = None) -> Iterator[object]:
        """(Engine thread.) Move arrived requests into the wait list and yield the signals
        and jobs that came with them (CLOSE, CANCEL_ALL, a Job); wait for the first arrival
        only if `block`, at most `timeout` seconds (None: for as long as it takes)."""
        while True:
            try:
                item = self.inbox.get(block=block, timeout=timeout if block else None)
            except queue.Empty:
                return
            block = False
            if isinstance(item, Task):
                self.waiting.append(item)
            elif item is not WAKE:
                yield item

    def drop_cancelled(self) -> list[Task]:
        """(Engine thread.) Take the cancelled requests out of the wait list."""
        gone = [t for t in self.waiting if t.generation.cancelled]
        for task in gone:
            self.waiting.remove(task)
            self.taken(task)
        return gone

    def drain(self) -> list[Task | Job]:
        """(Engine thread, stopping.) Every request waiting or still in the inbox, and every
        job not yet run."""
        tasks: list[Task | Job] = list(self.waiting)
        self.waiting.clear()
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return tasks
            if isinstance(item, (Task, Job)):
                tasks.append(item)

    def requeue_first(self, task: Task) -> None:
        """A preempted request goes back to the head of the wait list."""
        self.waiting.appendleft(task)
        with self._lock:
            self._queued += 1
            self._requeued += 1
