"""Prompts kept in RAM: a slot's sequence saved before another request overwrites it, and
put back when a later prompt shares more with it than with any slot (llama-server's
--cache-ram).

A slot holds one sequence. With more conversations than slots (an agent's subagents beside
its main chat, a user switching between chats, eight clients of an eight-slot server asking
their next questions), a request given a slot that held another conversation drops that
conversation's KV, and its next turn reads it all again. Here the slot's whole state
(`NativeModel.save_sequence`: its cells with their positions, any recurrent state) is copied
out first, with its tokens and context checkpoints, where the new request keeps less than
half of it. A new request whose prompt shares more with a saved sequence than with what its
slot would keep gets it (of those sharing as much, the least to copy) copied into its slot
and reads only the rest, where that is worth it: the prompt keeps at least a quarter of the
saved sequence (llama-server's rule), or copying the whole state back takes less than half
the time reading the tokens it spares would (its bytes at the speed the last copies back
went, `RESTORE_BYTES_S` until one has been timed, against what a prompt token has cost this
engine's steps: the step budget's measure). The quarter alone turned away a prompt sent
again after a reply three times its length: on SmolLM2's shape, 8 clients asking their
41-token questions again each read 13 tokens rather than copy 4 MB back, and waited 163-167
ms for their first token, llama-server's 121-127 ms (it has the same rule); copied back,
56-59 ms (bench/results/serve_speed.md: TTFT at 8 clients 0.60x llama-server's). The saved
copy goes where the prompt goes on from all of it (the slot holds it then, and saves it
again, longer); one that lends only its start stays saved for its own conversation, which a
copy handed over lost: the slot cuts it back to what the prompt shares.

Saved sequences are kept in order of their tokens too: those sharing the most with a prompt
lie next to where it would go, so a request compares its prompt with a few of them however
many are kept (`_best`; bench/results/prompt_cache_lookup.md).

Bounded: `max_bytes` in all (the least recently saved go first), and nothing is saved that
would leave the machine less than `RAM_FLOOR` of memory available, not counting the model
weights localinfer's processes have mapped as available (the OS does: saved prompts would
push them out of RAM, and every step would read them from the disk again). Where memory has
run short since (another program grew), the oldest copies are given back: at the next save,
and every CHECK_S seconds while any is kept, the server busy or idle. Saves within FRESH_S of
a look take its figure, less what they saved: a burst of new requests saves a slot each, and
each look asks every process of the machine.
Every native answer is checked: a state llama.cpp would not take back leaves the slot empty
(its prompt is read whole) and the copy kept.
"""

from __future__ import annotations

import ctypes
import logging
import math
import operator
import time
from bisect import bisect_left, insort
from collections.abc import Sequence
from dataclasses import dataclass

from localinfer.backends.engine.draft import common_prefix
from localinfer.backends.engine.slots import Checkpoint, Slot
from localinfer.backends.native.model import NativeModel
from localinfer.model_store.hardware import ram_available

__all__ = ["PromptCache"]

log = logging.getLogger("localinfer.engine")


@dataclass(eq=False)
class _Saved:
    tokens: list[int]  # whose state it is
    data: ctypes.Array  # as llama.cpp wrote it
    checkpoints: list[Checkpoint]
    spans: dict[int, tuple[int, int]]  # its images' (Slot.spans)
    # what putting it back costs, the lesser first: its state's bytes, then when it was kept
    # (PromptCache._kept)
    cost: tuple[int, int] = (0, 0)

    @property
    def size(self) -> int:
        """Its bytes in RAM: the state and the checkpoints it carries."""
        return len(self.data) + sum(len(c.data) for c in self.checkpoints)


def _tokens(saved: _Saved) -> list[int]:
    return saved.tokens


_cost = operator.attrgetter("cost")


class PromptCache:
    RAM_FLOOR = 1 << 30  # bytes of memory a save leaves available to everything else
    MIN_TOKENS = 16  # a sequence is worth saving, or putting back, for at least this many
    CHECK_S = 5.0  # how often the memory is looked at while copies are kept
    # a save this soon after the memory was looked at takes that figure, less what was saved
    # since: reading it asks every process of the machine (`mapped_file_bytes`), 1-2.5 ms
    # with a few dozen, and a burst of new requests saves a slot each before its first step
    FRESH_S = 0.5
    # how fast a saved state is taken to go back until one has been timed: below what a
    # copy into RAM does (bench/results/state_copy.md: 15 GB/s) and what PCIe carries
    RESTORE_BYTES_S = 2e9

    def __init__(self, native: NativeModel, max_bytes: int):
        self.native = native
        self.max_bytes = max_bytes
        self._saved: list[_Saved] = []  # oldest first
        # the same by their tokens, in order (none is the start of another, `_keep`): the
        # saved sequences sharing at least k tokens with a prompt lie together, next to
        # where the prompt would go, those sharing the most nearest it
        self._order: list[_Saved] = []
        self._kept = 0  # sequences kept so far
        self._checked = time.monotonic()  # when the memory was last looked at
        self._seen: tuple[int, int] | None = None  # then: (bytes available, bytes saved here)
        self.bytes = 0
        self.saves = 0  # sequences saved, and put back (with the prompt tokens they held)
        self.restored = 0
        self.restored_tokens = 0
        self._restore_s_per_byte = 1 / self.RESTORE_BYTES_S  # as the recent copies back went

    @property
    def on(self) -> bool:
        return self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._saved)

    def swap(self, slot: Slot, tokens: Sequence[int], limit: int, have: int, own: int,
             room: int, token_s: float | None = None) -> None:
        """A request for `tokens` starts in `slot`, which would start with `have` of them
        cached (its own prefix, or another slot's) and keep `own` of what it holds (a
        recurrent state: as far back as a checkpoint allows): save what the slot holds
        where it would lose most of it, and put back the saved sequence that shares the most
        with `tokens`, where that beats `have`, is worth copying (`token_s`: the seconds a
        prompt token costs, where measured) and holds no more than `room` tokens (the cells
        the slot may fill)."""
        if not self.on:
            return
        best, shared = self._best(tokens, limit, have, room, token_s)
        if best is not None and shared == len(best.tokens):
            # the request goes on from all of it: the slot holds it now, and will save it
            # again, longer. One that lends only its start stays, for its own conversation
            # (the slot cuts it back: a copy handed over would lose what follows)
            self._drop([best])
        if best is not None or 2 * own < len(slot.cache):
            self.save(slot)  # (its cap may let `best` go: the copy back reads it all the same)
        if best is not None:
            self._restore(slot, best, shared)

    def _best(self, tokens: Sequence[int], limit: int, have: int, room: int,
              token_s: float | None) -> tuple[_Saved | None, int]:
        """The saved sequence a slot would keep the most of for `tokens` (up to `limit`),
        more than `have` (and than MIN_TOKENS), that fits in `room` tokens and is worth
        copying back; among those keeping as many, the least to copy, then the oldest. With
        how many it keeps (`have`'s floor where none is). Looked for outwards from where
        `tokens` would go in order, a level at a time: each level's sequences share as many
        with the prompt (the most of those not looked at yet: the two just outside the
        range looked at say how many), and lie together (found by bisection, not compared),
        until no level left can beat the best one found. With a thousand conversations saved
        behind one system prompt, a prompt is compared with a few of them, not each."""
        tokens = tokens if isinstance(tokens, list) else list(tokens)
        order, least = self._order, max(have, self.MIN_TOKENS - 1)
        cut = self._cut_back  # (a slot may keep fewer: _keeps)
        best, shared = None, least
        lo = hi = bisect_left(order, tokens, key=_tokens)

        def fits(saved: _Saved, n: int) -> bool:
            return len(saved.tokens) <= room and self._worth_copying(saved, n, n - have,
                                                                     token_s)

        while True:
            k = min(limit, max(common_prefix(order[lo - 1].tokens, tokens) if lo else 0,
                               common_prefix(order[hi].tokens, tokens) if hi < len(order) else 0))
            if k <= least or k < shared:
                return best, shared  # (none left keeps more, or as many)
            start = tokens[:k]
            below = bisect_left(order, start, 0, lo, key=_tokens)
            above = bisect_left(order, start + [math.inf], hi, key=_tokens)
            level = order[below:lo] + order[hi:above]  # (each shares k with the prompt)
            if not cut and fits(cheapest := min(level, key=_cost), k):
                return cheapest, k  # (each keeps k: most often the least to copy is the one)
            for saved in sorted(level, key=_cost):  # (the least to copy first)
                n = self._keeps(saved, k) if cut else k
                if ((n > shared or n == shared and best is not None
                     and saved.cost < best.cost) and fits(saved, n)):
                    best, shared = saved, n
                    if not cut:
                        break  # (the rest keep as many, and copy more)
            lo, hi = below, above

    def _holds(self, tokens: Sequence[int]) -> bool:
        """Whether `tokens` are saved: in full, or as the start of a longer sequence."""
        at = bisect_left(self._order, tokens, key=_tokens)
        return (at < len(self._order)
                and common_prefix(self._order[at].tokens, tokens) == len(tokens))

    def _worth_copying(self, saved: _Saved, kept: int, spared: int,
                       token_s: float | None) -> bool:
        """Whether `saved` is worth copying back to keep `kept` of its tokens, `spared` of
        them prompt tokens the request would read otherwise."""
        if 4 * kept >= len(saved.tokens):
            return True
        return (token_s is not None
                and 2 * len(saved.data) * self._restore_s_per_byte < spared * token_s)

    @property
    def _cut_back(self) -> bool:
        """Whether a saved state may not be cut anywhere, only at its checkpoints."""
        return self.native.stateful or self.native.windowed

    def _keeps(self, saved: _Saved, n: int) -> int:
        """How many tokens a slot would keep of a saved sequence cut back to `n`: all `n`,
        or, where its state cannot be cut there (a recurrent one; a sliding window's cells
        may be gone), its newest checkpoint at or before them."""
        if n < len(saved.tokens) and self._cut_back:
            return max((c.n_tokens for c in saved.checkpoints if c.n_tokens <= n), default=0)
        return n

    def save(self, slot: Slot) -> None:
        """Keep a copy of what the slot holds (about to be dropped)."""
        if not self.on:
            return
        cache = slot.cache
        if len(cache) < self.MIN_TOKENS or self._holds(cache):
            return  # (short, or saved already: in full, or as the start of a longer one)
        checkpoints = sum(len(c.data) for c in slot.checkpoints)
        room = min(self.max_bytes - checkpoints, self.give_back(self.FRESH_S))
        data = self.native.save_sequence(slot.id, max(0, room))
        if data is None:
            log.debug("slot %d: its %d tokens not saved (none written, or more than %d "
                      "bytes)", slot.id, len(cache), room)
            return
        self._keep(_Saved(list(cache), data, list(slot.checkpoints), dict(slot.spans)))
        self.saves += 1
        log.debug("slot %d: %d tokens saved (%d bytes; %d sequences, %d bytes kept)",
                  slot.id, len(cache), len(data), len(self._saved), self.bytes)

    def give_back(self, fresh_s: float = 0.0) -> int:
        """Let the oldest copies go while the machine has less than RAM_FLOOR to spare
        (another program grew since they were kept): the bytes it has to spare then. The
        memory available is looked at again unless it was less than `fresh_s` ago; then it
        is that figure, less the bytes saved since (more, where copies went)."""
        now = time.monotonic()
        if self._seen is not None and now - self._checked < fresh_s:
            available = self._seen[0] - (self.bytes - self._seen[1])
        else:
            available = ram_available()
            self._seen, self._checked = (available, self.bytes), now
        spare = available - self.RAM_FLOOR
        while spare < 0 and self._saved:
            spare += self._saved[0].size
            self._drop([self._saved[0]])
        return spare

    def due(self) -> float | None:
        """Seconds until the memory is to be looked at again (`give_back`, every CHECK_S
        while copies are kept, busy or idle); None while none is."""
        if not self._saved:
            return None
        return max(0.0, self._checked + self.CHECK_S - time.monotonic())

    def _restore(self, slot: Slot, saved: _Saved, shared: int) -> None:
        began = time.perf_counter()
        restored = self.native.restore_sequence(slot.id, saved.data)
        # (checkpoints go back with it as Python objects: the state is what is copied)
        per_byte = (time.perf_counter() - began) / max(len(saved.data), 1)
        self._restore_s_per_byte = (self._restore_s_per_byte + per_byte) / 2
        if not restored:
            log.warning("slot %d: llama.cpp would not take back a saved prompt of %d tokens; "
                        "reading the prompt again", slot.id, len(saved.tokens))
            slot.cache.clear()  # (llama.cpp emptied the sequence)
            slot.checkpoints.clear()
            slot.recount()
            self._keep(saved)  # (still good: llama.cpp only read it; kept once)
            return
        # (copies: the slot cuts and grows its own, and the saved one may stay saved)
        slot.cache = list(saved.tokens)
        slot.checkpoints = list(saved.checkpoints)
        slot.spans = dict(saved.spans)
        slot.recount()
        self.restored += 1
        self.restored_tokens += shared
        log.debug("slot %d: a saved prompt of %d tokens put back (%d shared)", slot.id,
                  len(saved.tokens), shared)

    def _keep(self, saved: _Saved) -> None:
        """Keep `saved`, newest, unless it is held already (`_holds`); a saved sequence it
        goes on from is dropped (it holds that), and the oldest while they would pass the
        cap. So no sequence kept is the start of another, and one that is the start of
        `saved` comes just before it in order (one between would go on from it too, or
        come after `saved`)."""
        if self._holds(saved.tokens):
            return
        at = bisect_left(self._order, saved.tokens, key=_tokens)
        if at and common_prefix(self._order[at - 1].tokens, saved.tokens) == len(
                self._order[at - 1].tokens):
            self._drop([self._order[at - 1]])
        while self._saved and self.bytes + saved.size > self.max_bytes:
            self._drop([self._saved[0]])
        self._kept += 1
        saved.cost = len(saved.data), self._kept
        self._saved.append(saved)
        insort(self._order, saved, key=_tokens)
        self.bytes += saved.size

    def _drop(self, gone: list[_Saved]) -> None:
        for saved in gone:
            self._saved.remove(saved)
            del self._order[bisect_left(self._order, saved.tokens, key=_tokens)]
            self.bytes -= saved.size

    def clear(self) -> None:
        self._drop(list(self._saved))
