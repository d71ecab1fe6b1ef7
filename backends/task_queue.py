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

from localinfer.backends.slots import Task

__all__ = ["TaskQueue"]


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

    def requeue_first(self, task: Task) -> None:
        """A preempted request goes back to the head of the wait list."""
        self.waiting.appendleft(task)
        with self._lock:
            self._queued += 1
            self._requeued += 1
