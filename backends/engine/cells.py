"""How the slots share the context's KV cells: the engine's KV policy.

- `SplitCells` (the default): each slot's sequence owns n_cells / n_slots cells. A request
  fits its share or is refused when submitted; nothing is admitted or preempted by cells.
- `SharedCells` (--kv-unified): one pool. Any request may grow to the pool (up to the
  trained context); requests are admitted by free cells, idle prefixes give theirs back
  first (least recently used; saved to RAM first where the prompt cache is on), and when
  generating streams need more, the newest request is preempted: its KV dropped, the
  request queued again first (the engine's `preempt`).

Both also say which KV a starting request keeps (its cached prefix, or one borrowed from
another slot; on a recurrent or hybrid model, and on a sliding-window cache cut where its
window's cells are gone, as far back as a context checkpoint allows: checkpoints.py) and how
a full slot goes on (the context shift).

Cells are counted as the tokens each slot holds. A prefix one slot borrowed from another
shares its cells in llama.cpp but is counted twice here: the count errs on the safe side,
so a decode never finds the cache full.
"""

from __future__ import annotations

import array
import logging
import sys
from collections.abc import Callable, Sequence

from localinfer.backends.engine.checkpoints import Checkpoints
from localinfer.backends.engine.draft import common_prefix
from localinfer.backends.engine.prompt_cache import PromptCache
from localinfer.backends.native.model import NativeModel
from localinfer.backends.engine.slots import Slot, SlotState

__all__ = ["SharedCells", "SplitCells"]

log = logging.getLogger("localinfer.engine")


class SplitCells:
    def __init__(self, native: NativeModel, n_slots: int, reuse_min: int = 0,
                 checkpoints: Checkpoints | None = None, prompts: PromptCache | None = None):
        self.native = native
        # where an idle slot's prefix gives its cells back, a copy in RAM (prompt_cache.py)
        self.prompts = prompts
        # where a stateful sequence cannot be cut, the points it may go back to (0: none)
        self.checkpoints = checkpoints or Checkpoints(native, 0, 1)
        self.n_cells = native.n_cells()
        self.per_slot = self.n_cells // n_slots  # the longest request: prompt and reply
        # past the cached prefix, runs of at least this many cached tokens that the prompt
        # repeats further on are moved into place rather than read again (reuse_chunks);
        # 0: off
        self.reuse_min = reuse_min

    def free(self, slots: Sequence[Slot]) -> int:
        """Cells a step may still fill (beyond a slot's own share, which bounds it)."""
        return sys.maxsize

    def admit(self, slot: Slot, tokens: Sequence[int], slots: Sequence[Slot]) -> bool:
        """Whether the head of the queue may start in `slot`."""
        return True

    def before_step(self, slots: Sequence[Slot], preempt: Callable[[Slot], None]) -> None:
        """Make room for this step's decode tokens (preempting requests if need be)."""

    def forget(self, slot: Slot) -> None:
        """Drop a slot's KV, whatever it held."""
        self.native.forget(slot.id)
        slot.cache.clear()
        slot.checkpoints.clear()
        slot.deficit = 0

    MIN_SHARED = 32  # copying another slot's KV pays only for a prefix at least this long

    def borrow_prefix(self, slot: Slot, prompt: list[int], slots: Sequence[Slot]) -> None:
        """Take another slot's KV when it shares a longer prefix (the same system prompt).

        A split cache keeps one stream per sequence, and llama.cpp copies between streams
        only whole: the donor's stream is copied (at the next decode, before compute) and
        what lies past the shared prefix is dropped again. In one pool the copy shares the
        donor's cells instead.
        """
        own = self.reusable(slot, prompt, len(prompt) - 1, slots)
        donor, shared = self._donor(slot, prompt, own, slots)
        if donor is None:
            return
        self.native.forget(slot.id)
        slot.checkpoints.clear()  # (of what it held: the copy is another sequence)
        self.native.copy_cells(donor.id, slot.id)
        if not self.native.forget(slot.id, donor.position(shared)):
            self.forget(slot)  # (the copy holds more than the prompt shares: none of it)
            return
        slot.cache = list(prompt[:shared])
        slot.spans.update(donor.spans)
        slot.recount()

    @staticmethod
    def prefixes(prompt: Sequence[int], slots: Sequence[Slot]) -> dict[int, int]:
        """How many leading tokens of `prompt` each slot holds, by slot id: asked once for a
        request, then of each idle slot it could take (with 32 slots, asked per slot it was
        ~1,000 comparisons a request, 8% of the engine's thread at a GPU's step rate)."""
        return {s.id: s.common_prefix(prompt) for s in slots}

    def _donor(self, slot: Slot, prompt: Sequence[int], own: int, slots: Sequence[Slot],
               prefixes: dict[int, int] | None = None) -> tuple[Slot | None, int]:
        """The slot whose prefix `borrow_prefix` would take, and how much of it (`prefixes`:
        the slots' `prefixes` of the prompt, where the caller has them)."""
        if prefixes is None:
            prefixes = self.prefixes(prompt, slots)
        donor = max((s for s in slots if s is not slot), key=lambda s: prefixes[s.id],
                    default=None)
        if donor is None:
            return None, 0
        shared = min(prefixes[donor.id], len(prompt) - 1)
        if shared < own + self.MIN_SHARED:
            return None, 0
        if shared < len(donor.cache) and (self.native.stateful or (
                self.native.windowed and not self.native.can_cut(donor.id,
                                                                 donor.position(shared)))):
            return None, 0  # a recurrent state is copied whole, and cannot be cut back to
            # `shared`; nor a window whose cells before it are gone
        return donor, shared

    def kept(self, slot: Slot, tokens: Sequence[int], limit: int, slots: Sequence[Slot],
             own: int | None = None, prefixes: dict[int, int] | None = None) -> int:
        """How many of `tokens` a request starting in `slot` would find cached: the slot's
        own (`reusable`, or `own` where the caller has it), or a longer prefix
        `borrow_prefix` would take from another slot (`prefixes`: as `_donor`)."""
        if own is None:
            own = self.reusable(slot, tokens, limit, slots)
        return max(own, min(self._donor(slot, tokens, own, slots, prefixes)[1], limit))

    def keep_prefix(self, slot: Slot, tokens: Sequence[int], n_keep: int) -> int:
        """Drop what the slot holds past its first `n_keep` tokens; the count kept (0 where
        llama.cpp cannot cut the sequence there). A recurrent state is never cut short of
        its end (llama.cpp says yes to cuts within its snapshots that leave it wrong): it
        goes back to its newest checkpoint at or before `n_keep`, or is dropped whole; so
        does a sliding-window cache cut where its window's cells are gone (`can_cut`)."""
        cut = n_keep < len(slot.cache)
        if cut and self.native.stateful:
            n_keep = self.checkpoints.restore(slot, n_keep)
            if not n_keep:
                self.native.forget(slot.id)
        elif not self.native.forget(slot.id, slot.position(n_keep)):
            # (a sliding window's cells before n_keep are gone: one of its checkpoints)
            n_keep = self.checkpoints.restore(slot, n_keep)
            if not n_keep:
                self.native.forget(slot.id)
        del slot.cache[n_keep:]
        self.checkpoints.drop_past(slot, n_keep)
        slot.recount()
        return n_keep

    def reusable(self, slot: Slot, tokens: Sequence[int], limit: int,
                 slots: Sequence[Slot]) -> int:
        """How many of `tokens` the slot would start with cached (its prefix, and the runs
        reuse_chunks would move), changing nothing: which idle slot a request takes."""
        n_past = min(slot.common_prefix(tokens), limit)
        if n_past < len(slot.cache) and (self.native.stateful or (
                self.native.windowed and not self.native.can_cut(slot.id,
                                                                 slot.position(n_past)))):
            return self.checkpoints.best(slot, n_past)  # (cut at a checkpoint)
        runs = self._runs(slot, tokens, n_past, limit, slots)
        return n_past + sum(n for _, n in runs)

    def reuse_chunks(self, slot: Slot, tokens: Sequence[int], n_past: int, limit: int,
                     slots: Sequence[Slot]) -> int:
        """Past the `n_past` tokens of the cached prefix, keep runs of cached tokens that
        `tokens` goes on with, after cached text it no longer has (a file's first lines gone
        as an editor's window moves down, a chunk of context dropped): each run of at least
        `reuse_min` tokens is moved back to its new position (its KV re-positioned, as
        llama-server's --cache-reuse does), and what lay between is dropped. The cached
        length, at most `limit`; the slot holds exactly that much after.

        The moved runs' KV was computed after the text that is gone: close, not equal, to
        reading them again, which is why a run must be long to be worth it."""
        head = n_past
        cache = slot.cache
        for found, n in self._runs(slot, tokens, n_past, limit, slots):
            if found > head:
                self.native.forget(slot.id, head, found)
                self.native.shift(slot.id, found, found + n, head - found)
            cache[head:head + n] = cache[found:found + n]
            head += n
        if head > n_past:
            self.native.forget(slot.id, head, -1)
            self.checkpoints.drop_past(slot, n_past)  # (what follows them has moved)
            del cache[head:]
            log.debug("slot %d: %d cached tokens moved into place after a prefix of %d",
                      slot.id, head - n_past, n_past)
        return head

    def _runs(self, slot: Slot, tokens: Sequence[int], n_past: int, limit: int,
              slots: Sequence[Slot]) -> list[tuple[int, int]]:
        """The cached runs `tokens` goes on with after its first `n_past`, as (where the run
        is in the cache, its length): runs of at least `reuse_min` tokens, taken in order
        while they follow each other in `tokens` (the first token no run holds ends them),
        none within cells another sequence shares."""
        cache = slot.cache
        if (self.reuse_min <= 0 or n_past >= limit or len(cache) - n_past < self.reuse_min
                or not self.native.can_shift() or slot.deficit):
            return []  # (past an M-RoPE image an index is not a position)
        held = array.array("i", cache).tobytes()
        head_p = n_past  # where the prompt goes on, and where in the cache to look
        head_c = max(n_past, self._shared(slot, slots))
        runs = []
        while head_p + self.reuse_min <= limit:
            found = _find(held, tokens[head_p:head_p + self.reuse_min], head_c)
            if found < 0:
                break
            n = self.reuse_min
            while (found + n < len(cache) and head_p + n < limit
                   and cache[found + n] == tokens[head_p + n]):
                n += 1
            runs.append((found, n))
            head_c, head_p = found + n, head_p + n
        return runs

    def _shared(self, slot: Slot, slots: Sequence[Slot]) -> int:
        """How far the slot's cells may be shared with another sequence's: none here (a
        borrowed prefix is a copy of the donor's stream)."""
        return 0

    def shift(self, slot: Slot, n_keep: int) -> bool:
        """A full slot goes on: drop the older half of what follows its first `n_keep`
        tokens (and the BOS token), and slide the rest back, their KV re-positioned, as
        llama.cpp's server does. False where the model's cache cannot shift."""
        if not self.native.can_shift():
            return False
        n_past = len(slot.cache)
        bos = 1 if slot.cache and slot.cache[0] == self.native.bos() else 0
        n_keep = min(n_keep + bos, n_past - 2)
        n_discard = (n_past - n_keep) // 2
        if n_discard <= 0:
            return False
        self.native.forget(slot.id, n_keep, n_keep + n_discard)
        self.native.shift(slot.id, n_keep + n_discard, n_past, -n_discard)
        del slot.cache[n_keep:n_keep + n_discard]
        self.checkpoints.drop_past(slot, n_keep)
        log.debug("slot %d: context shifted, kept %d, dropped %d", slot.id, n_keep, n_discard)
        return True


class SharedCells(SplitCells):
    ROOM_PER_STREAM = 16  # cells kept free per running stream when admitting a new prompt

    def __init__(self, native: NativeModel, n_slots: int, reuse_min: int = 0,
                 checkpoints: Checkpoints | None = None, prompts: PromptCache | None = None):
        super().__init__(native, n_slots, reuse_min, checkpoints, prompts)
        self.per_slot = max(self.per_slot, min(self.n_cells, native.n_ctx_train()))

    def free(self, slots: Sequence[Slot]) -> int:
        return self.n_cells - sum(len(s.cache) for s in slots)

    def _shared(self, slot: Slot, slots: Sequence[Slot]) -> int:
        """In one pool a borrowed prefix shares the donor's cells, and a cell has one
        position for every sequence in it: moving it would move it for both. Cells shared
        with another slot lie within the prefix they hold in common."""
        return max((common_prefix(slot.cache, s.cache) for s in slots if s is not slot),
                   default=0)

    def admit(self, slot: Slot, tokens: Sequence[int], slots: Sequence[Slot]) -> bool:
        """Its tokens fit, with room to grow (the slot keeps the shared prefix and drops the
        rest of what it holds)."""
        need = len(tokens) + 1 - len(slot.cache)
        active = sum(1 for s in slots if s.task)
        if active:  # running streams keep some cells to grow into before anyone is preempted
            need += self.ROOM_PER_STREAM * active
        return self._make_room(need, slots, keep=slot)

    def before_step(self, slots: Sequence[Slot], preempt: Callable[[Slot], None]) -> None:
        """Every generating stream needs a cell this step: the newest requests yield theirs."""
        need = sum(1 for s in slots if s.state is SlotState.GENERATING)
        while not self._make_room(need, slots):
            active = [s for s in slots if s.task]
            if len(active) < 2:
                return  # a lone request never outgrows the pool (per_slot <= n_cells)
            newest = max(active, key=lambda s: s.task.stats.submitted_at)
            if newest.state is SlotState.GENERATING:
                need -= 1
            preempt(newest)

    def _make_room(self, need: int, slots: Sequence[Slot], keep: Slot | None = None) -> bool:
        """Free cells held by finished requests' prefixes, least recently used first."""
        idle = sorted((s for s in slots if s.task is None and s.cache and s is not keep),
                      key=lambda s: s.last_used)
        while self.free(slots) < need and idle:
            gone = idle.pop(0)
            if self.prompts is not None:
                self.prompts.save(gone)
            self.forget(gone)
        return self.free(slots) >= need


def _find(held: bytes, run: Sequence[int], start: int) -> int:
    """Where `run` first occurs in the tokens `held` (int32 bytes) at or after token
    `start`; -1 where it does not."""
    needle = array.array("i", run).tobytes()
    at = held.find(needle, start * 4)
    while at >= 0 and at % 4:  # a match across tokens' bytes: look on
        at = held.find(needle, at + 1)
    return at // 4 if at >= 0 else -1
