"""A stand-in for llama_native.NativeModel that the scheduler cannot tell apart, in
milliseconds: its next token is a fixed function of the last token fed and its position,
and it keeps a KV cache of its own that it checks — a decode whose positions do not follow
the cells its sequence holds fails, as a real model's output would silently go wrong.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable, Sequence

from localinfer.backends.base import SamplingParams
from localinfer.backends.engine.padding import micro_batches

N_VOCAB = 97


def rule(token: int, pos: int) -> int:
    return (token * 31 + pos * 7 + 3) % N_VOCAB


def reference(prompt: Sequence[int], n: int) -> list[int]:
    """The n tokens any correct scheduler gets from this model after `prompt`."""
    out, token, pos = [], prompt[-1], len(prompt) - 1
    for _ in range(n):
        token = rule(token, pos)
        out.append(token)
        pos += 1
    return out


def text(tokens: Sequence[int]) -> str:
    return "".join(f"<{t}>" for t in tokens)


class FakeBatch:
    def __init__(self, capacity: int):
        self.token = [0] * capacity
        self.pos = [0] * capacity
        self.n_seq_id = [0] * capacity
        self.seq_id = [[0] for _ in range(capacity)]
        self.logits = [False] * capacity
        self.n_tokens = 0


class FakeSampler:
    def __init__(self, params: SamplingParams):
        self.argmax = params.temperature == 0
        self.constrained = False

    def sample(self, native: FakeNative, batch_index: int) -> int:
        return native.rows[batch_index]

    def close(self) -> None:
        pass


class FakeNative:
    stateful = False  # a transformer's KV: cells cut anywhere (llama_native.NativeModel)
    windowed = False
    n_swa = 0
    rollback = 0
    flash_attn = True  # llama.cpp's default on a CPU (NativeModel.flash_attn)

    def __init__(self, n_ctx: int = 256, n_ctx_train: int = 4096, n_outputs: int = 64):
        self._n_ctx, self._n_ctx_train = n_ctx, n_ctx_train
        self.n_vocab, self.n_outputs = N_VOCAB, n_outputs
        self.cells: dict[int, dict[int, int]] = {}  # sequence → position → token
        self.rows: dict[int, int] = {}  # batch index → next token, for the last decode
        self.decodes = 0
        self.copies = 0
        self.gate = threading.Event()  # cleared: decodes wait (a test holds the engine)
        self.gate.set()
        self.held = threading.Event()  # a decode is waiting at the gate
        self._logits = None
        # the micro-batches of each decode of one token a sequence, as llama.cpp splits one
        # with a KV cache a sequence: runs of consecutive sequence ids (engine/padding.py)
        self.shapes: list[tuple[int, ...]] = []
        # seconds a decode of this shape takes (a CPU's costs, scaled down); None: no wait
        self.cost: Callable[[tuple[int, ...]], float] | None = None

    def n_cells(self) -> int:
        return self._n_ctx

    def n_ctx_train(self) -> int:
        return self._n_ctx_train

    def sampler(self, params: SamplingParams, prompt: Sequence[int] = ()) -> FakeSampler:
        return FakeSampler(params)

    @staticmethod
    def batch(capacity: int) -> FakeBatch:
        return FakeBatch(capacity)

    @staticmethod
    def free_batch(batch: FakeBatch) -> None:
        pass

    def decode(self, batch: FakeBatch) -> int:
        if not self.gate.is_set():
            self.held.set()
            self.gate.wait()
        rows, order = {}, []
        for i in range(batch.n_tokens):
            seq, pos, token = batch.seq_id[i][0], batch.pos[i], batch.token[i]
            cells = self.cells.setdefault(seq, {})
            if sorted(cells) != list(range(pos)):  # not right after what the sequence holds
                return -1
            cells[pos] = token
            if batch.logits[i]:
                rows[i] = rule(token, pos)
                order.append(i)
        if sum(len(c) for c in self.cells.values()) > self._n_ctx:
            return -2  # more cells than the context has (counting shared ones twice)
        self.rows = rows
        seqs = [batch.seq_id[i][0] for i in range(batch.n_tokens)]
        if len(set(seqs)) == len(seqs):  # (a step of one token a sequence)
            self.shapes.append(micro_batches(seqs))
            if self.cost is not None:
                time.sleep(self.cost(self.shapes[-1]))
        values = (ctypes.c_float * (len(order) * N_VOCAB))()
        for row, i in enumerate(order):
            values[row * N_VOCAB + rows[i]] = 1.0
        self._logits = values
        self.decodes += 1
        return 0

    def logits(self):
        return ctypes.cast(self._logits, ctypes.POINTER(ctypes.c_float))

    def forget(self, seq: int, start: int = -1, end: int = -1) -> bool:
        cells = self.cells.setdefault(seq, {})
        for pos in [p for p in cells if (start < 0 or p >= start) and (end < 0 or p < end)]:
            del cells[pos]
        return True

    def next_position(self, seq: int) -> int:
        cells = self.cells.get(seq)
        return max(cells) + 1 if cells else 0

    def forget_all(self) -> None:
        self.cells.clear()

    def copy_cells(self, src: int, dst: int) -> None:
        self.cells[dst] = dict(self.cells.get(src, {}))
        self.copies += 1

    def can_shift(self) -> bool:
        return True

    def shift(self, seq: int, start: int, end: int, delta: int) -> None:
        cells = self.cells.setdefault(seq, {})
        moved = {p: cells.pop(p) for p in sorted(cells) if start <= p < end}
        cells.update({p + delta: t for p, t in moved.items()})

    def threads(self) -> int:
        return 1

    def set_threads(self, count: int) -> None:
        pass

    def is_eog(self, token: int) -> bool:
        return False

    def piece(self, token: int) -> bytes:
        return f"<{token}>".encode()

    def bos(self) -> int:
        return -1

    def close(self) -> None:
        pass
