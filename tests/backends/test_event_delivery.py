"""Events from the engine thread reach asyncio consumers in order, with few loop wake-ups."""

from __future__ import annotations

import asyncio
import threading

from localinfer.backends.base import DoneEvent, Generation, TokenEvent
from localinfer.backends.metrics import RequestStats


async def test_many_streams_get_every_event_in_order_with_one_wake_up_per_step():
    loop = asyncio.get_running_loop()
    wake_ups = 0
    plain = loop.call_soon_threadsafe

    def counted(*args, **kw):
        nonlocal wake_ups
        wake_ups += 1
        return plain(*args, **kw)

    loop.call_soon_threadsafe = counted
    gens = [Generation(i) for i in range(16)]
    received: dict[int, list[str]] = {g.id: [] for g in gens}

    async def consume(g: Generation) -> None:
        async for event in g.events():
            if isinstance(event, TokenEvent):
                received[g.id].append(event.text)

    consumers = [asyncio.create_task(consume(g)) for g in gens]
    await asyncio.sleep(0.01)  # every consumer has attached its sink
    step_done = threading.Event()

    def engine() -> None:  # 20 steps, a token for every stream in each, like the engine
        for step in range(20):
            for g in gens:
                g.put(TokenEvent(f"{g.id}:{step} ", step))
            step_done.wait(1)  # the loop's turn, as during llama_decode
            step_done.clear()
        for g in gens:
            g.put(DoneEvent(RequestStats(submitted_at=0.0)))

    async def release_steps() -> None:
        while not all(c.done() for c in consumers):
            step_done.set()
            await asyncio.sleep(0.001)

    thread = threading.Thread(target=engine)
    thread.start()
    await asyncio.gather(release_steps(), *consumers)
    thread.join()
    loop.call_soon_threadsafe = plain
    for g in gens:
        assert received[g.id] == [f"{g.id}:{step} " for step in range(20)]
    assert wake_ups <= 21 * 2  # about one a step, not one an event (16 × 21 = 336)


async def test_events_after_the_loop_is_gone_are_dropped_quietly():
    gen = Generation(1)
    done = asyncio.Event()

    async def consume() -> None:
        async for _ in gen.events():
            done.set()
            return

    task = asyncio.create_task(consume())
    await asyncio.sleep(0)
    gen.put(TokenEvent("a", 1))
    await asyncio.wait_for(done.wait(), 5)
    await task
    other = asyncio.new_event_loop()
    other.close()
    from localinfer.backends.base import _LoopPost
    post = _LoopPost.of(other)
    post(asyncio.Queue(), TokenEvent("late", 2))  # no error: nobody listens any more
