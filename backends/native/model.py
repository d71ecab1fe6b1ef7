"""The thin layer over llama-cpp-python's low-level API: load, tokenize, sample.

Only the engine thread decodes and samples; tokenizing is read-only on the vocabulary
and safe from any thread.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import Any

import llama_cpp
import numpy

from localinfer.backends.base import Logprob, SamplingParams
from localinfer.backends.native.ggml import cpu_buffer_type, ensure_loaded, route_llama_log
from localinfer.chat_formats.fim import FimTokens
from localinfer.chat_formats.grammar import check_gbnf
from localinfer.errors import EngineError, InvalidRequest, ModelLoadFailed
from localinfer.settings import KvType

__all__ = ["NativeModel", "SamplerChain", "grammar_sampler"]

_KV_TYPES = {KvType.F16: llama_cpp.GGML_TYPE_F16, KvType.Q8_0: llama_cpp.GGML_TYPE_Q8_0,
             KvType.Q4_0: llama_cpp.GGML_TYPE_Q4_0}


_SPLIT_MODES = {"none": llama_cpp.LLAMA_SPLIT_MODE_NONE, "layer": llama_cpp.LLAMA_SPLIT_MODE_LAYER,
                "row": llama_cpp.LLAMA_SPLIT_MODE_ROW}


class _BuftOverride(ctypes.Structure):  # llama_model_tensor_buft_override
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


# the output layer's tensors (a model with tied embeddings uses token_embd for it)
_OUTPUT = rb"^(output|output_norm|token_embd)\.weight$"


def experts_pattern(layers: Sequence[int]) -> bytes:
    """The expert tensors of these layers, as llama.cpp's --fit names them (common/fit.cpp):
    a regular expression over tensor names."""
    numbers = "|".join(str(int(i)) for i in sorted(set(layers)))
    return rf"^blk\.({numbers})\.ffn_(up|down|gate_up|gate)_(ch|)exps".encode()


def model_params(n_gpu_layers: int, split_mode: str = "none", main_gpu: int = 0,
                 tensor_split: Sequence[float] = (), output_on_cpu: bool = False,
                 cpu_experts: Sequence[int] = ()
                 ) -> tuple[llama_cpp.llama_model_params, object]:
    """llama_model_params for a placement, and what its pointers point to (keep it alive
    until the model is loaded). Device numbers are llama.cpp's GPU order, which ggml_backends
    makes the PCI bus order that `hw` and the planner use. output_on_cpu: the output layer
    stays in this machine's RAM, where llama.cpp would put it on the last device (a worker:
    its logits would cross the network every token, instead of one hidden state).
    cpu_experts: layers whose expert tensors stay in RAM (a mixture of experts short of GPU
    memory) while the rest of each goes where n_gpu_layers puts it."""
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = n_gpu_layers
    mparams.split_mode = _SPLIT_MODES[split_mode]
    mparams.main_gpu = main_gpu
    kept: list[object] = []
    if tensor_split:
        n = llama_cpp.llama_max_devices()
        if len(tensor_split) > n:
            raise ModelLoadFailed(f"this llama.cpp build takes at most {n} devices, not "
                                  f"{len(tensor_split)}")
        split = (ctypes.c_float * n)(*tensor_split)
        mparams.tensor_split = ctypes.cast(split, ctypes.POINTER(ctypes.c_float))
        kept.append(split)
    patterns = ([_OUTPUT] if output_on_cpu else []) + (
        [experts_pattern(cpu_experts)] if cpu_experts else [])
    if patterns:  # each to host memory; the list ends with an empty entry
        overrides = (_BuftOverride * (len(patterns) + 1))(
            *(_BuftOverride(p, cpu_buffer_type()) for p in patterns), _BuftOverride(None, None))
        mparams.tensor_buft_overrides = ctypes.cast(overrides, ctypes.c_void_p)
        kept.append(overrides)
    return mparams, kept


class NativeModel:
    """A llama.cpp model and one context, owned together."""

    def __init__(self, path: str, n_ctx_total: int, n_slots: int, n_batch: int,
                 n_threads: int, n_gpu_layers: int = 0, kv_type: KvType = KvType.F16,
                 flash_attn: bool | None = None, kv_unified: bool = False, n_outputs: int = 0,
                 split_mode: str = "none", main_gpu: int = 0,
                 tensor_split: Sequence[float] = (), output_on_cpu: bool = False,
                 rollback: int = 0, cpu_experts: Sequence[int] = (), swa_full: bool = False):
        """n_outputs: the most logits one decode may ask for (0: a whole batch); more would
        abort the process, so the engine checks before each decode. rollback: how many of
        a decode's last tokens must be droppable again (speculative decoding's guesses):
        on a hybrid model, llama.cpp keeps that many snapshots of the recurrent state
        (`n_rs_seq`); a transformer's KV needs none. swa_full: a sliding-window layer keeps
        a cell for every token, not only its window (see `windowed`)."""
        route_llama_log()
        ensure_loaded()
        llama_cpp.llama_backend_init()
        mparams, self._kept = model_params(n_gpu_layers, split_mode, main_gpu, tensor_split,
                                           output_on_cpu, cpu_experts)
        self.model = llama_cpp.llama_model_load_from_file(path.encode(), mparams)
        if not self.model:
            raise ModelLoadFailed(f"llama.cpp could not load '{path}' — run with --verbose to see why")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        # a recurrent state (Mamba, RWKV; a hybrid's Gated DeltaNet or convolution layers)
        # holds a whole sequence in one cell: it cannot be cut back to an earlier token
        self.recurrent = bool(llama_cpp.llama_model_is_recurrent(self.model))
        self.hybrid = bool(llama_cpp.llama_model_is_hybrid(self.model))
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = n_ctx_total
        cparams.n_batch = n_batch
        cparams.n_ubatch = n_batch
        if rollback and self.hybrid:  # (a pure recurrent model keeps no snapshots)
            cparams.n_rs_seq = rollback
            # llama.cpp aborts a decode whose ubatch is not longer than the snapshots + 1
            cparams.n_batch = cparams.n_ubatch = max(n_batch, rollback + 2)
        cparams.n_seq_max = n_slots
        # llama.cpp reserves one per sequence at least, and aborts when given fewer
        n_outputs = max(n_outputs, n_slots) if n_outputs else 0
        cparams.n_outputs_max = n_outputs
        cparams.n_threads = n_threads
        cparams.n_threads_batch = n_threads
        cparams.no_perf = True
        # a sliding-window layer (Gemma 3's five in six) attends to its last n_swa tokens:
        # off, llama.cpp keeps it a cache of its window and a micro-batch (per sequence),
        # not one of the whole context (see `windowed`)
        self.n_swa = llama_cpp.llama_model_n_swa(self.model)
        cparams.swa_full = self._swa_full = swa_full
        # unified: one pool of cells for every sequence (a prefix copied between sequences
        # shares its cells); split: a fixed stream of n_ctx / n_slots cells per sequence
        cparams.kv_unified = kv_unified
        cparams.type_k = cparams.type_v = _KV_TYPES[kv_type]
        # llama.cpp's auto turns it on wherever the devices have it, as every CPU does
        self.flash_attn = flash_attn is not False
        cparams.flash_attn_type = {None: llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
                                   True: llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                                   False: llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED}[flash_attn]
        self.ctx = llama_cpp.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            llama_cpp.llama_model_free(self.model)
            raise ModelLoadFailed(
                f"llama.cpp could not create a context of {n_ctx_total} tokens — lower --ctx"
            )
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        # how many of the last decode's tokens (all but its first) may be dropped again
        # with a correct state left: llama.cpp's snapshots of a hybrid's recurrent state
        self.rollback = llama_cpp.llama_n_rs_seq(self.ctx) if self.stateful else 0
        # read once: asked later of a freed context (a close racing a question), llama.cpp
        # reads through a null pointer
        self._n_cells = llama_cpp.llama_n_ctx(self.ctx)
        self._n_batch = llama_cpp.llama_n_batch(self.ctx)
        self._threads = llama_cpp.llama_n_threads(self.ctx)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self._heads: frozenset[str] | None = None
        self.n_outputs = min(n_outputs, self.n_batch()) if n_outputs else self.n_batch()
        self._piece_buf = ctypes.create_string_buffer(256)
        # What llama.cpp says of a token id never changes, and asking it is a ctypes call,
        # which lets go of the GIL: at 32 streams, two a token, the engine thread waited
        # ~20% of a fast (GPU-rate) step to get the GIL back from the event loop. So each
        # id is asked once. Written by the engine thread only.
        self._eog: dict[int, bool] = {}
        self._eog_tokens: tuple[int, ...] | None = None
        self._pieces: dict[int, bytes] = {}
        self._preserved: set[int] = set()  # control tokens rendered as their text
        self._longest: int | None = None
        self._vocabulary_lock = threading.Lock()  # (learn_vocabulary)

    # -- model facts
    @property
    def stateful(self) -> bool:
        """Whether the model keeps a recurrent state (recurrent or hybrid): its sequence
        cannot be cut at an earlier token (only dropped whole, or rolled back within
        `rollback` tokens of its last decode), nor a middle part removed, nor moved."""
        return self.recurrent or self.hybrid

    @property
    def windowed(self) -> bool:
        """Whether sliding-window layers keep only their window's cells: llama.cpp then
        reuses a cell once the window has moved past it, so a sequence can be cut back only
        as far as the window's cells before the cut are still held (`can_cut`), and cells
        cannot be moved (no context shift, no cache reuse: `can_shift`)."""
        return self.n_swa > 0 and not self._swa_full

    def n_cells(self) -> int:
        """The context's KV cells, all slots' together (LoadOptions.n_ctx is one slot's)."""
        return self._n_cells

    def n_batch(self) -> int:
        """The most tokens one llama_decode takes: llama.cpp lowers n_batch to a small context."""
        return self._n_batch

    def n_ctx_train(self) -> int:
        return llama_cpp.llama_model_n_ctx_train(self.model)

    def n_params(self) -> int:
        return llama_cpp.llama_model_n_params(self.model)

    def n_layer(self) -> int:
        return llama_cpp.llama_model_n_layer(self.model)

    def size_bytes(self) -> int:
        return llama_cpp.llama_model_size(self.model)

    def chat_template(self) -> str | None:
        """The GGUF's chat template; None when the file carries none."""
        source = llama_cpp.llama_model_chat_template(self.model, None)
        return source.decode("utf-8", errors="replace") if source else None

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace") if n >= 0 else None

    def token_text(self, token: int) -> str:
        if token < 0:
            return ""
        return llama_cpp.llama_vocab_get_text(self.vocab, token).decode("utf-8", errors="replace")

    def bos(self) -> int:
        return llama_cpp.llama_vocab_bos(self.vocab)

    def eos(self) -> int:
        return llama_cpp.llama_vocab_eos(self.vocab)

    def is_eog(self, token: int) -> bool:
        """Whether a token ends generation (end of turn, end of text). Engine thread only."""
        eog = self._eog.get(token)
        if eog is None:
            eog = self._eog[token] = bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))
        return eog

    def eog_tokens(self) -> tuple[int, ...]:
        """Every token that ends generation (read from the vocabulary once)."""
        if self._eog_tokens is None:
            self._eog_tokens = tuple(t for t in range(self.n_vocab)
                                     if llama_cpp.llama_vocab_is_eog(self.vocab, t))
        return self._eog_tokens

    def sampler(self, params: SamplingParams, prompt: Sequence[int] = ()) -> SamplerChain:
        """A request's sampler chain (its grammar parsed now: a bad one raises here)."""
        return SamplerChain(self, params, prompt)

    # -- the KV cache: one sequence per slot, positions [start, end), -1 for an open end
    def forget(self, seq: int, start: int = -1, end: int = -1) -> bool:
        """Drop a sequence's cells in [start, end); False where llama.cpp cannot cut the
        sequence there (a recurrent model's state; a cut of a `windowed` cache before the
        window's cells it still holds: `can_cut`), and nothing was dropped.

        A recurrent state answers True to what it cannot do, leaving the state wrong: a
        middle part removed (it stays in the state; a hybrid drops only its attention
        cells), and a cut within its snapshots past what the last decode allows. Callers
        cut a stateful model's sequence only at its end or whole (see `stateful`)."""
        if end < 0 and not self.can_cut(seq, start):
            return False
        return bool(llama_cpp.llama_memory_seq_rm(self.memory, seq, start, end))

    def next_position(self, seq: int) -> int:
        """The position a token added to the sequence must take: one past the highest its
        cells hold (0 when it holds none)."""
        return llama_cpp.llama_memory_seq_pos_max(self.memory, seq) + 1

    def can_cut(self, seq: int, pos: int) -> bool:
        """Whether the sequence cut back to its first `pos` positions holds what the next
        token (at `pos`) attends to. A `windowed` cache has dropped the cells the window
        left behind, and llama.cpp says yes to a cut past them all the same: the next
        tokens are then decoded without part of their window (logits as far off as another
        prompt's). Its sliding-window cells hold positions [pos_min, pos_max] (llama.cpp
        keeps them contiguous), and the token at `pos` attends to the n_swa - 1 before it
        (a chunked window's, fewer)."""
        if not self.windowed or pos <= 0:
            return True
        pos_min = llama_cpp.llama_memory_seq_pos_min(self.memory, seq)
        if pos >= self.next_position(seq):
            return True  # not a cut
        return 0 <= pos_min <= max(0, pos - self.n_swa + 1)

    def forget_all(self) -> None:
        llama_cpp.llama_memory_clear(self.memory, True)

    def warm_up(self) -> None:
        """Decode the start and end tokens once and empty the cache again, as llama-server
        does at load: a context's first decode costs more than the next ones (the weights
        of a mapped file read in on a CPU, the device's buffers and kernels made ready),
        and paid here it is part of the load, not of the first request's TTFT
        (bench/results/first_reply.md; from a cold page cache, the 1B shape's load took 0.8 s
        longer and its first request 1.1 s less: first_reply_1b_cold.md). A decode llama.cpp
        refuses, or a cache it does not empty, fails the load: the model would fail its first
        request the same way."""
        if llama_cpp.llama_model_has_encoder(self.model):
            return  # (an encoder-decoder model decodes only after an encode; none is served)
        tokens = [t for t in (self.bos(), self.eos()) if t >= 0][:self.n_batch()] or [0]
        array = (llama_cpp.llama_token * len(tokens))(*tokens)
        # (sequence 0 from position 0, the last token's logits: llama.cpp's defaults)
        rc = self.decode(llama_cpp.llama_batch_get_one(array, len(tokens)))
        self.forget_all()
        if rc != 0 or self.next_position(0) != 0:
            raise ModelLoadFailed(f"llama.cpp could not decode with this model (its first "
                                  f"decode returned {rc}) — run with --verbose to see why")

    def save_partial(self, seq: int, limit: int | None = None) -> ctypes.Array | None:
        """The part of a sequence's state that cannot be cut back (a recurrent state; a
        sliding window's cells: the last n_swa), as llama.cpp writes it (a context
        checkpoint): None where it wrote nothing, less than it said it would, or would write
        more than `limit` bytes (a large model's window: nothing copied). Engine thread
        only."""
        return self._save(seq, llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY, limit)

    def restore_partial(self, seq: int, data: ctypes.Array) -> bool:
        """Put back a sequence's partial state saved by `save_partial`. The rest of its
        memory (the attention layers' cells) is left as it was: the caller cuts what lies
        past the saved point. False where llama.cpp read none of it (the sequence's
        partial state is then gone: drop the sequence)."""
        return self._restore(seq, data, llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)

    def save_sequence(self, seq: int, limit: int | None = None) -> ctypes.Array | None:
        """A sequence's whole state (its KV cells, with their positions, and any recurrent
        state), as `save_partial` writes a part of it."""
        return self._save(seq, llama_cpp.LLAMA_STATE_SEQ_FLAGS_NONE, limit)

    def restore_sequence(self, seq: int, data: ctypes.Array) -> bool:
        """Replace a sequence's state with one `save_sequence` wrote. False where llama.cpp
        could not (no room for its cells): the sequence is then empty."""
        return self._restore(seq, data, llama_cpp.LLAMA_STATE_SEQ_FLAGS_NONE)

    def _save(self, seq: int, flags: int, limit: int | None) -> ctypes.Array | None:
        size = llama_cpp.llama_state_seq_get_size_ext(self.ctx, seq, flags)
        if not size or (limit is not None and size > limit):
            return None
        # in numpy's memory, which Linux backs with huge pages where it is large: llama.cpp
        # filling it faults 512x fewer pages than a ctypes array's (bench/state_copy.py: a
        # 64 MiB state saved in ~7 ms, not ~28, on the thread every stream waits on)
        data = (ctypes.c_uint8 * size).from_buffer(numpy.empty(size, numpy.uint8))
        written = llama_cpp.llama_state_seq_get_data_ext(self.ctx, data, size, seq, flags)
        return data if written == size else None

    def _restore(self, seq: int, data: ctypes.Array, flags: int) -> bool:
        return llama_cpp.llama_state_seq_set_data_ext(self.ctx, data, len(data), seq,
                                                      flags) == len(data)

    def copy_cells(self, src: int, dst: int) -> None:
        """Let sequence `dst` share every cell of `src` (no copy of the KV itself)."""
        llama_cpp.llama_memory_seq_cp(self.memory, src, dst, -1, -1)

    def can_shift(self) -> bool:
        """Whether cells may be moved to other positions (a context shift, cached runs put
        into place). Never for a recurrent state, whose llama.cpp says it can: moving
        follows a removal in the middle, which its state does not forget. Nor
        for a `windowed` cache (llama.cpp says so)."""
        return not self.stateful and bool(llama_cpp.llama_memory_can_shift(self.memory))

    def shift(self, seq: int, start: int, end: int, delta: int) -> None:
        """Move a sequence's cells in [start, end) by `delta` positions."""
        llama_cpp.llama_memory_seq_add(self.memory, seq, start, end, delta)

    # -- decoding
    @staticmethod
    def batch(capacity: int) -> llama_cpp.llama_batch:
        """llama.cpp's batch of up to `capacity` tokens with one sequence id each; its
        fields are written directly (token, pos, n_seq_id, seq_id, logits, n_tokens)."""
        return llama_cpp.llama_batch_init(capacity, 0, 1)

    @staticmethod
    def free_batch(batch: llama_cpp.llama_batch) -> None:
        llama_cpp.llama_batch_free(batch)

    def decode(self, batch: llama_cpp.llama_batch) -> int:
        """llama_decode's return code, once the device is done: a GPU backend returns before
        the work is, and the first logits read would wait for it."""
        rc = llama_cpp.llama_decode(self.ctx, batch)
        llama_cpp.llama_synchronize(self.ctx)
        return rc

    def decode_embeddings(self, embd, seq: int, start: int, causal: bool = True) -> int:
        """Decode rows of input embeddings (an image's, n_embd floats each, as one flat float32
        array) into sequence `seq` from position `start`, no logits; `causal` False lets them
        attend to each other both ways. llama_decode's return code."""
        width = self.n_embd_inp()
        n = len(embd) // width
        batch = llama_cpp.llama_batch_init(n, width, 1)
        try:
            ctypes.memmove(batch.embd, numpy.ascontiguousarray(embd, numpy.float32).ctypes.data,
                           n * width * 4)
            for i in range(n):
                batch.pos[i], batch.n_seq_id[i], batch.logits[i] = start + i, 1, False
                batch.seq_id[i][0] = seq
            batch.n_tokens = n
            if not causal:
                llama_cpp.llama_set_causal_attn(self.ctx, False)
            try:
                return self.decode(batch)
            finally:
                if not causal:
                    llama_cpp.llama_set_causal_attn(self.ctx, True)
        finally:
            llama_cpp.llama_batch_free(batch)

    def decode_embeddings_mrope(self, embd, seq: int, positions, n_batch: int) -> int:
        """Decode an M-RoPE model's image embeddings (rows of n_embd floats) into sequence
        `seq`, each row at its four positions (`positions`: int32, shape (4, rows): time, row,
        column, unused), `n_batch` rows a decode, no logits. Through llama.cpp's extended
        batch, which takes several positions a row (its plain batch mishandles them past 64
        rows here: the heap breaks)."""
        n_embd = self.n_embd_inp()
        rows = numpy.ascontiguousarray(embd, numpy.float32).reshape(-1, n_embd)
        at = numpy.ascontiguousarray(numpy.asarray(positions, numpy.int32).T)  # (rows, 4)
        float_p = ctypes.POINTER(ctypes.c_float)
        pos_p = ctypes.POINTER(llama_cpp.llama_pos)
        batch = llama_cpp.llama_batch_ext_init(self.ctx)
        try:
            for first in range(0, len(rows), n_batch):
                llama_cpp.llama_batch_ext_clear(batch)
                for i in range(first, min(first + n_batch, len(rows))):
                    idx = llama_cpp.llama_batch_ext_add_embd(batch, seq, llama_cpp.llama_embd(
                        rows[i].ctypes.data_as(float_p), 1, n_embd))
                    if idx < 0 or not llama_cpp.llama_batch_ext_set_pos(
                            batch, idx, at[i].ctypes.data_as(pos_p)):
                        return -1
                    llama_cpp.llama_batch_ext_set_output_logits(batch, idx, False)
                rc = llama_cpp.llama_process(self.ctx, llama_cpp.LLAMA_PROCESS_TYPE_DECODE,
                                             batch)
                if rc != 0:
                    return rc
            return 0
        finally:
            llama_cpp.llama_batch_ext_free(batch)

    def n_embd(self) -> int:
        return llama_cpp.llama_model_n_embd(self.model)

    def n_embd_inp(self) -> int:
        """The width of an input embedding row: n_embd, or more where a projector feeds
        layers besides the first (Qwen3-VL's deepstack)."""
        return llama_cpp.llama_model_n_embd_inp(self.model)

    def logits(self):  # a ctypes float pointer: the output rows of the last decode, in order
        return llama_cpp.llama_get_logits(self.ctx)

    def threads(self) -> int:
        """(As last set: asked of llama.cpp, it could be a freed context's.)"""
        return self._threads if self.ctx else 0

    def set_threads(self, count: int) -> None:
        llama_cpp.llama_set_n_threads(self.ctx, count, count)
        self._threads = count

    # -- text
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buf = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, capacity,
                                     add_special, parse_special)
        if n < 0:  # buffer too small: -n is the size needed
            capacity = -n
            buf = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, capacity,
                                         add_special, parse_special)
        return list(buf[:n])

    def fim(self) -> FimTokens:
        """The vocabulary's fill-in-the-middle tokens (llama.cpp finds them by their text
        where the file names none)."""
        def token(read: Any) -> int | None:
            value = read(self.vocab)
            return value if value >= 0 else None

        return FimTokens(token(llama_cpp.llama_vocab_fim_pre), token(llama_cpp.llama_vocab_fim_suf),
                         token(llama_cpp.llama_vocab_fim_mid), token(llama_cpp.llama_vocab_fim_rep),
                         token(llama_cpp.llama_vocab_fim_sep))

    def adds_bos(self) -> bool:
        return bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))

    def adds_eos(self) -> bool:
        return bool(llama_cpp.llama_vocab_get_add_eos(self.vocab))

    def control_heads(self) -> frozenset[str]:
        """The first characters of the texts that tokenizing with parse_special turns into
        control tokens (a text without any of them tokenizes the same either way). Asked of
        every token once (`learn_vocabulary`)."""
        if self._heads is None:
            self.learn_vocabulary()
        return self._heads

    def piece(self, token: int) -> bytes:
        """The bytes of one token (special tokens render as nothing). Engine thread only."""
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self._piece(token, self._piece_buf)
        return piece

    def logprob(self, row: int, token: int, top: int) -> Logprob:
        """A written token's log probability under the logits at `row` of the last decode
        (the model's own distribution: a log-softmax of its logits), and the `top` likeliest
        tokens with theirs. Engine thread only; ~0.3 ms on a 262k vocabulary."""
        logits = numpy.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.ctx, row),
                                          shape=(self.n_vocab,))
        best = float(logits.max())
        norm = best + float(numpy.log(numpy.exp(logits - best).sum()))
        likeliest: tuple[tuple[int, bytes, float], ...] = ()
        if top:
            likeliest = tuple((int(t), self._shown(int(t)), float(logits[t]) - norm)
                              for t in _likeliest(logits, best, top))
        return token, self._shown(token), float(logits[token]) - norm, likeliest

    def _shown(self, token: int) -> bytes:
        """A token's bytes as a log probability names it: a control token by its text."""
        return self.piece(token) or self.token_text(token).encode("utf-8")

    def longest_piece(self) -> int:
        """The most bytes one token stands for (smollm2: 81, gemma3: 48). A text of B bytes
        is at least B / this many tokens. Asked of every token once (`learn_vocabulary`)."""
        if self._longest is None:
            self.learn_vocabulary()
        return self._longest

    def learn_vocabulary(self) -> None:
        """Ask llama.cpp about every token once, for `control_heads` and `longest_piece`: a
        ctypes call or two a token, 0.1 s for smollm2's 49k, 0.36 s for Qwen's 152k. The
        first request needs both (a message's text checked for control tokens, a long
        prompt's least count of tokens): the backend asks as the model loads, so that
        several first requests at once do not each ask every token, beside their prompts'
        decodes. Any thread; a second caller waits for the first."""
        with self._vocabulary_lock:
            if self._longest is not None:
                return
            special = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN
            heads: set[str] = set()
            longest = 0
            buf = ctypes.create_string_buffer(256)
            for t in range(self.n_vocab):
                if llama_cpp.llama_vocab_get_attr(self.vocab, t) & special:
                    text = self.token_text(t)
                    if text:
                        heads.add(text[0])
                longest = max(longest, len(self._piece(t, buf)))
            self._heads = frozenset(heads)
            self._longest = longest or 1

    def detokenize(self, tokens: Sequence[int]) -> str:
        """Any thread: uses its own buffer, not the engine's."""
        bad = next((t for t in tokens if not 0 <= t < self.n_vocab), None)
        if bad is not None:  # llama.cpp would read out of bounds
            raise InvalidRequest(f"token id {bad} is outside the vocabulary (0..{self.n_vocab - 1})")
        buf = ctypes.create_string_buffer(256)
        return b"".join(self._piece(t, buf) for t in tokens).decode("utf-8", errors="replace")

    def preserve(self, text: str) -> None:
        """Render this control token as its text (a family's tool-call and reasoning
        markers: `[TOOL_CALLS]`, `<|channel|>`), where it is one token. Before any request."""
        ids = self.tokenize(text, add_special=False, parse_special=True)
        if len(ids) == 1:
            self._preserved.add(ids[0])
            self._pieces.pop(ids[0], None)

    def _piece(self, token: int, buf: ctypes.Array) -> bytes:
        special = token in self._preserved
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:  # longer than the buffer: -n is the size needed
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def close(self) -> None:
        if self.ctx:
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            llama_cpp.llama_model_free(self.model)
            self.model = None


class SamplerChain:
    """One llama.cpp sampler chain per request, in llama.cpp's own default order.

    Logit bias and grammar come first, so a banned or ungrammatical token can never be
    picked; penalties follow, then the truncations and the draw.

    Three shortcuts pick the same tokens for less work, which counts on a large vocabulary
    (gemma3's 262k: llama.cpp's greedy chain takes 0.46 ms a token, its chain with penalties
    1.2 ms, against a 16 ms decode step):
    - plain greedy (no bias, grammar or penalties) is an argmax over the logits in place;
    - penalties that can only lower logits (repeat ≥ 1, frequency and presence ≥ 0) run
      after a cut to the best top_k + 64 candidates: a token outside those has at least
      top_k tokens above it that no penalty touches (at most 64 tokens are penalised), so it
      could not have reached the top_k anyway.
    - where the chain's first sampler is such a cut to the best `cut` (top_k, or the cut
      before the penalties), the chain is given only the tokens within a gap of the best
      logit, the gap wide enough that at least `cut` are in it (`_within`): the best `cut`
      are all there, and every later sampler sees only what the cut keeps (after a logit
      bias on a few tokens, `cut` counts as many more as tokens are biased, and the biased
      are given too: `_cut`; `ignore_eos` bans the end tokens so, and greedy cuts to 1
      then). llama.cpp copies the whole vocabulary into a candidate array for each draw, a
      chain of its own each, which the streams of a step push out of the CPU's cache: drawn
      in turn for 32 streams, 53 µs a token over 49,152 tokens, 157 over Qwen's 151,936, 241
      over Gemma's 262,144; with the gap, 31, 79 and 108 (2-core EPYC, the default chain;
      the same tokens, bench/results/sampling_cost.md).
    """

    _PENALTY_LAST_N = 64
    _BIASED_CUT = 32  # tokens biased at most, for the cut to the tokens near the best
    shortcuts = True  # off: llama.cpp's plain chain (what the shortcuts are tested against)

    def __init__(self, native: NativeModel, params: SamplingParams, prompt: Sequence[int] = ()):
        chain_params = llama_cpp.llama_sampler_chain_default_params()
        chain_params.no_perf = True
        self.chain = llama_cpp.llama_sampler_chain_init(chain_params)
        penalised = (params.repeat_penalty, params.frequency_penalty,
                     params.presence_penalty) != (1, 0, 0)
        bias = params.logit_bias
        if params.ignore_eos:
            bias += tuple((token, -100.0) for token in native.eog_tokens())
        self.argmax = (self.shortcuts and params.greedy and not penalised
                        and not bias and not params.grammar)
        self.constrained = bool(params.grammar)  # its cost per token is bounded by the engine
        add = lambda s: llama_cpp.llama_sampler_chain_add(self.chain, s)  # noqa: E731
        if bias:
            add(_logit_bias_sampler(native.n_vocab, bias))
        self.grammar = None
        if params.grammar:
            try:
                self.grammar = grammar_sampler(native, params.grammar, params.grammar_triggers)
            except BaseException:  # refused by its size: the samplers added so far go
                self.close()
                raise
            if self.grammar is None:
                self.close()
                raise InvalidRequest("the grammar does not parse — check its GBNF syntax")
            if not self.shortcuts:
                add(self.grammar)  # llama.cpp's plain chain: the grammar sees every token
                self.grammar = None
            else:
                self._candidates = _Candidates(native.n_vocab)
        # the chain's first sampler after the bias keeps the best `cut` tokens (0: it reads
        # them all); the bias sees the tokens near the best and every token it moves
        self.cut = 0
        self._gap = _FIRST_GAP  # how far below the best logit the last draw had to look
        self.cut_draws = 0  # draws that read only the tokens within the gap (tests)
        self._biased = numpy.array(sorted({t for t, _ in bias if 0 <= t < native.n_vocab}),
                                   dtype=numpy.int64)
        # (llama.cpp's bias searches the candidates for each biased token: a few only)
        first_is_cut = (self.shortcuts and not params.grammar
                        and len(self._biased) <= self._BIASED_CUT)
        if penalised:
            keep = 1 if params.greedy else min(params.top_k, native.n_vocab)
            only_lower = (params.repeat_penalty >= 1 and params.frequency_penalty >= 0
                          and params.presence_penalty >= 0)
            if self.shortcuts and keep and only_lower:
                add(llama_cpp.llama_sampler_init_top_k(keep + self._PENALTY_LAST_N))
                if first_is_cut:
                    self.cut = self._cut(keep + self._PENALTY_LAST_N, native.n_vocab)
            penalties = llama_cpp.llama_sampler_init_penalties(
                native.n_vocab, self._PENALTY_LAST_N, params.repeat_penalty,
                params.frequency_penalty, params.presence_penalty)
            # the prompt counts as history — for this sampler only: fed to the whole chain,
            # a grammar would take the prompt for its output and abort the process
            for token in prompt[-self._PENALTY_LAST_N:]:
                llama_cpp.llama_sampler_accept(penalties, token)
            add(penalties)
        if params.greedy:
            if first_is_cut and not penalised and len(self._biased):  # (else an argmax)
                self.cut = self._cut(1, native.n_vocab)
            add(llama_cpp.llama_sampler_init_greedy())
            return
        if params.top_k > 0:  # (within llama.cpp's int32: a cut past the vocabulary is none)
            add(llama_cpp.llama_sampler_init_top_k(min(params.top_k, native.n_vocab)))
            if first_is_cut and not penalised:
                self.cut = self._cut(params.top_k, native.n_vocab)
        add(llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
        add(llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
        add(llama_cpp.llama_sampler_init_temp(params.temperature))
        seed = llama_cpp.LLAMA_DEFAULT_SEED if params.seed is None else params.seed
        add(llama_cpp.llama_sampler_init_dist(seed))

    def _cut(self, keep: int, n_vocab: int) -> int:
        """How many of the best logits the chain's draw must see to keep the best `keep`
        after the bias: a token below the best `keep` + (tokens biased) has at least `keep`
        tokens the bias leaves alone above it (the biased themselves are drawn from, where
        a raise lifts them)."""
        return min(keep + len(self._biased), n_vocab)

    def sample(self, native: NativeModel, batch_index: int) -> int:
        """Sample from the logits at `batch_index` of the last decode (and accept the token)."""
        if self.argmax:  # the first of the highest, as llama.cpp's greedy sampler picks
            logits = llama_cpp.llama_get_logits_ith(native.ctx, batch_index)
            return int(numpy.ctypeslib.as_array(logits, shape=(native.n_vocab,)).argmax())
        if self.grammar is not None:
            return self._sample_then_check(native, batch_index)
        if self.cut:
            token = self._sample_within(native, batch_index)
            if token is not None:
                return token
        return llama_cpp.llama_sampler_sample(self.chain, native.ctx, batch_index)

    def _sample_within(self, native: NativeModel, batch_index: int) -> int | None:
        """The chain's draw over the tokens within a gap of the best logit that at least
        `cut` clear (see the class); None where that is no saving (the logits are not
        finite, or too many tokens are near the best): then llama.cpp draws over them all."""
        logits = numpy.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(native.ctx, batch_index),
                                          shape=(native.n_vocab,))
        best = logits.max()
        if not numpy.isfinite(best):
            return None
        ids, gap = _within(logits, best, self.cut, self._gap)
        # next time: a narrower gap where this one held many more than the cut needs; the
        # first again where it had to take every token (fewer than the cut were finite)
        self._gap = (_FIRST_GAP if gap > _WIDEST_GAP
                     else max(gap / 2, _NARROWEST_GAP) if len(ids) > 8 * self.cut else gap)
        if len(ids) < self.cut or len(ids) > len(logits) // 4:
            return None
        if len(self._biased):  # (those not near the best, in order of id as in the vocabulary)
            missing = self._biased[~(logits[self._biased] >= best - gap)]
            if len(missing):
                ids = numpy.sort(numpy.concatenate((ids, missing)))
        few = numpy.empty(len(ids), dtype=_Candidates.DTYPE)
        few["id"], few["logit"], few["p"] = ids, logits[ids], 0.0
        array = _token_data(few)
        llama_cpp.llama_sampler_apply(self.chain, ctypes.byref(array))
        if not 0 <= array.selected < array.size:  # (llama.cpp's own draw asserts the same)
            raise EngineError(f"llama.cpp's sampler chose candidate {array.selected} of "
                              f"{array.size}")
        token = int(few["id"][array.selected])
        llama_cpp.llama_sampler_accept(self.chain, token)
        self.cut_draws += 1
        return token

    def accept(self, token: int) -> bool:
        """Take a token written without sampling (a reasoning budget's closing mark) as if
        drawn, so penalties and grammar follow the text. False, taking nothing, where the
        request's grammar does not allow it (llama.cpp would abort the process)."""
        if self.grammar is not None:
            if not self._candidates.allows(self.grammar, token):
                return False
            llama_cpp.llama_sampler_accept(self.grammar, token)
        elif self.constrained:  # (the plain chain's grammar cannot be asked first)
            return False
        llama_cpp.llama_sampler_accept(self.chain, token)
        return True

    def _sample_then_check(self, native: NativeModel, batch_index: int) -> int:
        """A grammar's reply, as llama.cpp's server samples it: the token is drawn without the
        grammar, and only when the grammar rejects it is the draw made again with the grammar
        over the whole vocabulary. Most tokens of a JSON reply are what the grammar allows
        anyway, and asking the grammar of one token is far cheaper than of every token
        (smollm2, JSON: 0.5x of unconstrained tok/s with the grammar first)."""
        logits = numpy.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(native.ctx, batch_index),
                                          shape=(native.n_vocab,))
        candidates = self._candidates
        llama_cpp.llama_sampler_apply(self.chain, candidates.fill(logits))
        token = candidates.selected()
        if not candidates.allows(self.grammar, token):
            array = candidates.fill(logits)
            llama_cpp.llama_sampler_apply(self.grammar, array)
            llama_cpp.llama_sampler_apply(self.chain, array)
            token = candidates.selected()
        llama_cpp.llama_sampler_accept(self.grammar, token)
        llama_cpp.llama_sampler_accept(self.chain, token)
        return token

    def close(self) -> None:
        if self.chain:
            llama_cpp.llama_sampler_free(self.chain)
            self.chain = None
        if getattr(self, "grammar", None) is not None:
            llama_cpp.llama_sampler_free(self.grammar)
            self.grammar = None


# how far below the best logit the tokens are first looked for: a real model has a few
# dozen within 4, a thousand within 8
_FIRST_GAP = 4.0
_WIDEST_GAP = 1e6  # past this, the bound is -inf: the logits that are not NaN
# a gap is never narrowed below this (rows of many equal logits halve it at each draw; at
# 0 it could not widen again)
_NARROWEST_GAP = 1e-3


def _within(logits: numpy.ndarray, best: float, k: int, gap: float
            ) -> tuple[numpy.ndarray, float]:
    """The ids of every token whose logit is within `gap` of the best, the gap doubled until
    at least k are (or every token that is not NaN), and that gap. The k highest are among
    them: at least k tokens clear the bound, so the k-th highest does, and all above it."""
    while True:
        bound = best - gap
        ids = numpy.flatnonzero(logits >= bound)
        if len(ids) >= k or len(ids) == len(logits) or not numpy.isfinite(bound):
            return ids, gap  # (a NaN best: none)
        gap = (max(gap * 2, _NARROWEST_GAP) if gap < _WIDEST_GAP
               else numpy.inf)  # (then every token not NaN)


def _likeliest(logits: numpy.ndarray, best: float, k: int) -> numpy.ndarray:
    """The ids of the k highest logits, highest first. Only the tokens within a few logits
    of the best are sorted (`_within`): a partition of a 262k vocabulary took 1.8 ms."""
    ids, _ = _within(logits, best, k, _FIRST_GAP)
    if len(ids) > k:
        ids = ids[numpy.argpartition(logits[ids], -k)[-k:]]
    return ids[numpy.argsort(-logits[ids], kind="stable")]


class _Candidates:
    """A llama_token_data_array over the whole vocabulary, refilled from the logits."""

    DTYPE = numpy.dtype([("id", numpy.int32), ("logit", numpy.float32), ("p", numpy.float32)])

    def __init__(self, n_vocab: int):
        self.ids = numpy.arange(n_vocab, dtype=numpy.int32)
        self.data = numpy.zeros(n_vocab, dtype=self.DTYPE)
        self.array = _token_data(self.data)
        self.one = numpy.zeros(1, dtype=self.DTYPE)
        self.one_array = _token_data(self.one)

    def fill(self, logits: numpy.ndarray) -> Any:
        self.data["id"] = self.ids  # (samplers sort the entries in place)
        self.data["logit"] = logits
        self.data["p"] = 0.0
        self.array.size, self.array.selected, self.array.sorted = len(self.ids), -1, False
        return ctypes.byref(self.array)

    def selected(self) -> int:
        return int(self.data["id"][self.array.selected])

    def allows(self, grammar: Any, token: int) -> bool:
        self.one["id"], self.one["logit"], self.one["p"] = token, 1.0, 0.0
        self.one_array.size, self.one_array.selected, self.one_array.sorted = 1, -1, False
        llama_cpp.llama_sampler_apply(grammar, ctypes.byref(self.one_array))
        return bool(numpy.isfinite(self.one["logit"][0]))


def _token_data(records: numpy.ndarray) -> Any:
    """A llama_token_data_array over `records` (of _Candidates.DTYPE, which llama.cpp's
    samplers read and sort in place), none selected, unsorted."""
    return llama_cpp.llama_token_data_array(
        data=records.ctypes.data_as(llama_cpp.llama_token_data_p), size=len(records),
        selected=-1, sorted=False)


def _logit_bias_sampler(n_vocab: int, bias: Sequence[tuple[int, float]]) -> llama_cpp.llama_sampler_p:
    """One entry a token, its biases summed (`ignore_eos` bans an end token a request may
    raise): llama.cpp adds each entry where it finds the token at its own index (the whole
    vocabulary), and only a token's first entry where it searches (the tokens near the best
    logit: `SamplerChain._sample_within`)."""
    total: dict[int, float] = {}
    for token, value in bias:
        # OpenAI's ±100 means "never" / "always"; llama.cpp needs -inf to ban outright
        total[token] = total.get(token, 0.0) + (float("-inf") if value <= -100 else value)
    entries = (llama_cpp.llama_logit_bias * len(total))()
    for entry, (token, value) in zip(entries, total.items()):
        entry.token, entry.bias = token, value
    return llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(total), entries)


_GRAMMAR_STACK = 64 * 1024 * 1024
_stack_size_lock = threading.Lock()


def grammar_sampler(native: NativeModel, grammar: str, triggers: Sequence[str] = ()
                    ) -> llama_cpp.llama_sampler_p | None:
    """A grammar sampler, or None when the GBNF does not parse. Reads only the vocabulary.
    With `triggers` it is lazy: free until the reply's text matches one of them.

    llama.cpp parses the grammar by recursion, so it runs on a thread of its own with a
    64 MiB stack (reserved, not committed): what `check_gbnf` lets through then parses in
    any calling thread — a server's event loop, or a secondary thread with macOS's 512 KiB.
    """
    check_gbnf(grammar)
    built: list[llama_cpp.llama_sampler_p] = []

    def build() -> None:
        if not triggers:
            built.append(llama_cpp.llama_sampler_init_grammar(native.vocab, grammar.encode(),
                                                              b"root"))
            return
        patterns = (ctypes.c_char_p * len(triggers))(*(t.encode() for t in triggers))
        built.append(llama_cpp.llama_sampler_init_grammar_lazy_patterns(
            native.vocab, grammar.encode(), b"root", patterns, len(triggers),
            (llama_cpp.llama_token * 1)(), 0))

    with _stack_size_lock:  # the size applies to threads started while it is set
        previous = threading.stack_size(_GRAMMAR_STACK)
        try:
            thread = threading.Thread(target=build, name="localinfer-grammar", daemon=True)
            thread.start()
        finally:
            threading.stack_size(previous)
    thread.join()
    return built[0] if built and built[0] else None
