"""Context checkpoints: how a slot of a recurrent or hybrid model keeps a prefix it cannot cut.

A recurrent state (Mamba2's; a hybrid's Gated DeltaNet or convolution layers) holds the
whole sequence in one cell: llama.cpp cannot cut it back to an earlier token. So a next
chat turn whose prompt leaves the cached sequence before its end (a client that sends back
another reply text, a template that strips old reasoning) would read its whole prompt
again. As llama-server does (`--ctx-checkpoints`), the slot saves that part of its state
(`NativeModel.save_partial`) at chosen points while it reads a prompt, and a new prompt that
shares a prefix restores the newest checkpoint at or before it, cuts the attention layers'
cells past it, and reads only the rest.

A sliding-window cache kept at its window (`NativeModel.windowed`, Gemma 3's) is the same
past a point: llama.cpp reuses the cells the window has left behind, so a cut further back
than the window and a micro-batch from the sequence's end would leave the next tokens
without part of their window (`NativeModel.can_cut` refuses it). Its checkpoint is the
window's last n_swa cells; restored, the cut at it is whole again.

The points, as llama-server chooses them: a few tokens before the prompt's end (the next turn
shares all but its tail: the generation prompt, which a template may rewrite), one chunk
before that, and every `every` tokens of a long prompt. A slot keeps at most `n_max`
checkpoints and `max_bytes` of them (None: 256 MiB, or room for two where one is larger —
`checkpoint_cap`), the oldest dropped first (what the memory plan counts:
`ModelShape.checkpoints_bytes`); those past a cut are dropped with it. Every native answer
is checked: a restore or a cut refused reads the prompt again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from localinfer.backends.engine.slots import Checkpoint, Slot
from localinfer.backends.native.model import NativeModel
from localinfer.model_store.shape import checkpoint_cap

__all__ = ["Checkpoints"]

log = logging.getLogger("localinfer.engine")


class Checkpoints:
    """The engine's checkpoint policy; each slot keeps its own (`Slot.checkpoints`)."""

    TAIL = 4  # the last checkpoint of a prompt: this many tokens before its end (llama-server's)

    def __init__(self, native: NativeModel, n_max: int, chunk: int,
                 max_bytes: int | None = None, every: int = 8192):
        self.native = native
        # only where the memory cannot be cut back anywhere (the others keep any prefix)
        self.n_max = n_max if native.stateful or native.windowed else 0
        self.chunk = chunk  # the prompt tokens one step reads: one more stop a chunk earlier
        self.max_bytes = max_bytes
        self._largest = 0  # the largest checkpoint written: what an automatic cap is made for
        self.every = every
        self.restored = 0  # checkpoints restored, and the prompt tokens they saved reading
        self.restored_tokens = 0

    @property
    def on(self) -> bool:
        return self.n_max > 0

    def before_chunk(self, slot: Slot, tokens: Sequence[int], end: int) -> int:
        """A slot is about to read `tokens` from where its sequence ends to `end`: save a
        checkpoint there if one is due, and where the chunk must end instead so that the
        next one can be saved."""
        if not self.on:
            return end
        start = len(slot.cache)
        stops = [s for s in (len(tokens) - self.TAIL - self.chunk, len(tokens) - self.TAIL)
                 if s > 0]
        last = slot.checkpoints[-1].n_tokens if slot.checkpoints else 0
        if start > last and (start in stops or start >= last + self.every):
            self._save(slot, start)
        return min([end] + [s for s in stops if start < s < end])

    def _save(self, slot: Slot, n_tokens: int) -> None:
        data = self.native.save_partial(slot.id, self.max_bytes)
        if data is None:
            log.debug("slot %d: no checkpoint at %d tokens (none written, or more than "
                      "%s bytes)", slot.id, n_tokens, self.max_bytes)
            return
        self._largest = max(self._largest, len(data))
        cap = checkpoint_cap(self._largest, self.max_bytes)
        kept = slot.checkpoints
        while kept and (len(kept) >= self.n_max or
                        sum(len(c.data) for c in kept) + len(data) > cap):
            del kept[0]
        kept.append(Checkpoint(n_tokens, data))
        log.debug("slot %d: checkpoint at %d tokens (%d bytes), %d kept", slot.id, n_tokens,
                  len(data), len(kept))

    def best(self, slot: Slot, n_keep: int) -> int:
        """How many of its tokens the slot would keep of a cut to `n_keep`: the newest
        checkpoint's at or before it (0: none)."""
        return next((c.n_tokens for c in reversed(slot.checkpoints) if c.n_tokens <= n_keep),
                    0)

    def restore(self, slot: Slot, n_keep: int) -> int:
        """Cut the slot's sequence back as near to its first `n_keep` tokens as a checkpoint
        allows: the newest at or before them restored, the attention cells past it dropped.
        The count kept; 0 where there is none, or llama.cpp refused the restore or the cut
        (the sequence must then be dropped whole). The slot's cache is left to the caller."""
        found = next((c for c in reversed(slot.checkpoints) if c.n_tokens <= n_keep), None)
        if found is None:
            return 0
        if not self.native.restore_partial(slot.id, found.data):
            log.warning("slot %d: llama.cpp refused the checkpoint at %d tokens; reading "
                        "the prompt again", slot.id, found.n_tokens)
            return 0
        if not self.native.forget(slot.id, slot.position(found.n_tokens)):
            log.warning("slot %d: llama.cpp refused to cut its cells at %d tokens after "
                        "a checkpoint; reading the prompt again", slot.id, found.n_tokens)
            return 0
        self.restored += 1
        self.restored_tokens += found.n_tokens
        log.debug("slot %d: checkpoint at %d tokens restored (of %d shared)", slot.id,
                  found.n_tokens, n_keep)
        return found.n_tokens

    @staticmethod
    def drop_past(slot: Slot, n_tokens: int) -> None:
        """The slot's sequence now holds only its first `n_tokens`: the checkpoints saved
        later go."""
        slot.checkpoints[:] = [c for c in slot.checkpoints if c.n_tokens <= n_tokens]
