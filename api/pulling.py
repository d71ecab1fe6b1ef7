"""A pull run in a worker thread, its byte counts brought to the event loop as it goes.

The route waits for the first sign of life (bytes flowing, or the pull over) before it
answers, so a model that does not exist or a hub that cannot be reached is still a 404 or
a 502; once bytes flow, the answer is a 200 stream and a later failure is its last line.
A client that goes away cancels the pull at its next chunk (1 MiB), as Ollama's does;
what came so far stays in the staging folder, and a later pull goes on from there.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from localinfer.errors import Cancelled

__all__ = ["PullJob"]

REPORT_EVERY = 0.25  # seconds between progress lines; the last byte is always reported


class PullJob:
    def __init__(self, pull: Callable[[Callable[[int, "int | None"], None]], Any]):
        self._loop = asyncio.get_running_loop()
        self._reports: asyncio.Queue[tuple[int, int | None]] = asyncio.Queue()
        self._reported_at = 0.0
        self._flowing = asyncio.Event()
        self._cancelled = threading.Event()
        self.task = asyncio.ensure_future(asyncio.to_thread(pull, self._report))

    def cancel(self) -> None:
        """Stop the download at its next chunk (nobody waits for it any more)."""
        if self._cancelled.is_set():
            return
        self._cancelled.set()
        # nobody will read how it ended, either: take the outcome, so no warning is logged
        self.task.add_done_callback(lambda task: task.cancelled() or task.exception())

    def _report(self, done: int, total: int | None) -> None:  # the download thread
        if self._cancelled.is_set():
            raise Cancelled("the client went away: pull cancelled")
        now = time.monotonic()
        if now - self._reported_at < REPORT_EVERY and done != total:
            return
        self._reported_at = now
        self._loop.call_soon_threadsafe(self._put, (done, total))

    def _put(self, report: tuple[int, int | None]) -> None:
        self._reports.put_nowait(report)
        self._flowing.set()

    async def started(self) -> None:
        """Return once bytes flow or the pull is over; a pull that failed before any byte
        raises its error here."""
        flowing = asyncio.ensure_future(self._flowing.wait())
        await asyncio.wait({flowing, self.task}, return_when=asyncio.FIRST_COMPLETED)
        flowing.cancel()
        if self.task.done() and not self._flowing.is_set():
            self.task.result()

    async def progress(self) -> AsyncIterator[tuple[int, int | None]]:
        """(bytes so far, total bytes) until the pull is over."""
        while True:
            while not self._reports.empty():
                yield self._reports.get_nowait()
            if self.task.done():
                return
            report = asyncio.ensure_future(self._reports.get())
            await asyncio.wait({report, self.task}, return_when=asyncio.FIRST_COMPLETED)
            if report.done():
                yield report.result()
            else:
                report.cancel()
