"""A model's shape as its memory plan needs it, the one place that knows what each layer keeps.

Read from the GGUF header (gguf_info), used by the planner, the RAM check and `show`. Per
layer: attention over every cell (KV per token), over a sliding window (KV per token of
its window, unless llama.cpp is told to keep full-size SWA caches), a recurrent state (per
sequence, whatever the context: Mamba, Gated DeltaNet, short convolutions, RWKV), or
neither; and the bytes of its expert tensors, which a GPU short of memory leaves in RAM
first. A dense transformer's shape lists no layers: each is full attention with n_head_kv.
"""

from __future__ import annotations

from dataclasses import dataclass

from localinfer.settings import KvType

__all__ = ["CHECKPOINT_CAP", "KV_BYTES", "POOLED_EMBED_CTX", "POOLED_SEQUENCES",
           "POOLED_UBATCH", "Layer",
           "ModelShape", "checkpoint_cap", "swa_cells"]

KV_BYTES = {KvType.F16: 2.0, KvType.Q8_0: 34 / 32, KvType.Q4_0: 18 / 32}  # per element, with
# block scales (a StrEnum: the plain names index it as well)
# an embedding or rerank model's pooled context (backends/native/embeddings.py), made on its
# first request beside the model's own: an embedding context's cells at most, the micro-batch
# of one whose input may span several (a causal model's), and the inputs a decode reads at most
POOLED_EMBED_CTX = 2048
POOLED_UBATCH = 512
POOLED_SEQUENCES = 16
_SWA_PAD = 256  # llama.cpp pads a sliding-window cache to this many cells
CHECKPOINT_CAP = 256 << 20  # a slot's context checkpoints at most, where one is small
CHECKPOINT_KEEP = 2  # where one is larger than CHECKPOINT_CAP / 2: room for this many
# what llama.cpp writes around a sequence's partial state (llama_state_seq_get_data_ext):
# its magic and the sequence id, the cell's count, position and sequence count, the state's
# layout and layer count; and per recurrent layer, the types and row sizes of its r and s
_CHECKPOINT_HEADER, _CHECKPOINT_LAYER_HEADER = 28, 24
_CHECKPOINT_CELL_HEADER = 8  # a windowed cell's position and sequence
_CHECKPOINT_WINDOW_LAYER_HEADER = 80  # a windowed layer's K and V headers



def checkpoint_cap(one: int, cap: int | None = None) -> int:
    """A slot's bytes of context checkpoints, where one takes `one`: `cap` where the user set
    one (--ctx-checkpoint-mib); else CHECKPOINT_CAP, or room for CHECKPOINT_KEEP of them
    where one is larger (a Gemma-3-27B window's is ~416 MiB: under a fixed 256 MiB it would
    get none, and a turn that leaves the cache further back than its window would read the
    whole prompt again)."""
    return cap if cap is not None else max(CHECKPOINT_CAP, CHECKPOINT_KEEP * one)

@dataclass(frozen=True)
class Layer:
    """What one layer keeps besides its weights."""

    n_head_kv: int = 0  # attention's KV heads; 0: the layer attends to nothing
    window: int = 0  # a sliding-window layer's window, in tokens; 0: full attention
    recurrent: bool = False  # a recurrent state per sequence (Falcon-H1's layers have both)
    expert_share: float = 0.0  # of the file's bytes, this layer's expert tensors (ffn_*_exps)


def swa_cells(window: int, n_ctx: int, n_slots: int = 1, n_ubatch: int = 512,
              unified: bool = False) -> int:
    """The cells a sliding-window layer's cache holds when it is not kept full size, as
    llama.cpp sizes it (llama-kv-cache-iswa.cpp): per stream (one per slot; one in all when
    unified) its window, the window of each slot when unified, and a micro-batch, within
    the stream's context, padded to 256."""
    streams, per_stream = (1, n_ctx * n_slots) if unified else (n_slots, n_ctx)
    cells = min(per_stream, window * (n_slots if unified else 1) + n_ubatch)
    return -(-cells // _SWA_PAD) * _SWA_PAD * streams


@dataclass(frozen=True)
class ModelShape:
    n_layer: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    input_embd_share: float = 0.0  # of the weights, what stays in RAM (GGUFInfo says)
    # per layer, where the header says more than "full attention, n_head_kv heads"
    layers: tuple[Layer, ...] = ()
    state_bytes_per_layer: int = 0  # a recurrent layer's state of one sequence (F32 r + s)
    n_expert: int = 0
    n_expert_used: int = 0
    recurrent_kind: str = "recurrent"  # what the recurrent layers are: "Gated DeltaNet", …
    # the context llama.cpp pools for an embedding ("embed") or rerank ("rerank") model, its
    # micro-batch (0: a whole input at once), and the output rows a decode keeps (0: every
    # token's; pooled at the last token, one an input: POOLED_SEQUENCES)
    pooled: str = ""
    pooled_ubatch: int = 0
    pooled_outputs: int = 0
    encoder: bool = False  # attends both ways (BERT's kin): llama.cpp keeps no KV cache
    n_head: int = 0  # attention's query heads (the most of any layer); 0: as n_head_kv

    def pooled_cells(self, n_ctx: int) -> int:
        """The cells of the pooled context where the model has one (a slot's context for a
        reranker, at most POOLED_EMBED_CTX for an embedder), else 0."""
        if not self.pooled:
            return 0
        return min(n_ctx, POOLED_EMBED_CTX) if self.pooled == "embed" else n_ctx

    def per_layer(self) -> tuple[Layer, ...]:
        return self.layers or (Layer(self.n_head_kv),) * self.n_layer

    def gpu_weights(self, file_size: int) -> int:
        """Of a file's weights, what a full offload puts on the GPU."""
        return int(file_size * (1 - self.input_embd_share))

    def ram_weights(self, file_size: int) -> int:
        """Of a file's weights, what llama.cpp keeps in RAM whatever the layers: an untied
        model's input embeddings (looked up a row at a time)."""
        return file_size - self.gpu_weights(file_size)

    def _per_cell(self, heads: int, kv_type: str) -> float:
        """K and V of one cell over layers with `heads` KV heads in all (the one formula)."""
        return heads * (self.head_dim_k + self.head_dim_v) * KV_BYTES[kv_type]

    def kv_bytes_per_token(self, kv_type: str = "f16") -> float:
        """K and V for one token across the attention layers, as llama.cpp stores them with
        full-size sliding-window caches (--swa-full)."""
        return self._per_cell(sum(layer.n_head_kv for layer in self.per_layer()), kv_type)

    def kv_bytes(self, n_ctx: int, n_slots: int = 1, kv_type: str = "f16",
                 swa_full: bool = True, n_ubatch: int = 512, unified: bool = False) -> int:
        """The KV cache of n_slots slots of n_ctx cells: full-attention layers hold every
        cell; sliding-window ones their window (`swa_cells`) unless swa_full. An encoder
        keeps none."""
        if self.encoder:
            return 0
        windowed = [] if swa_full else [layer for layer in self.per_layer() if layer.window]
        full = sum(layer.n_head_kv for layer in self.per_layer()) - sum(
            layer.n_head_kv for layer in windowed)
        total = self._per_cell(full, kv_type) * n_ctx * n_slots
        for layer in windowed:
            total += self._per_cell(layer.n_head_kv, kv_type) * swa_cells(
                layer.window, n_ctx, n_slots, n_ubatch, unified)
        return int(total)

    def state_bytes(self, n_slots: int = 1, snapshots: int = 0) -> int:
        """The recurrent state of n_slots sequences, with `snapshots` more copies of each
        (llama.cpp's n_rs_seq, for rolling back rejected guesses on a hybrid)."""
        return (self.n_recurrent * self.state_bytes_per_layer * max(n_slots, 1)
                * (1 + snapshots))

    def checkpoint_bytes(self, swa_full: bool = False) -> int:
        """One context checkpoint of a slot, as llama.cpp writes it: the partial state of its
        sequence — the recurrent state, and with small sliding-window caches (swa_full off,
        the engine's default) the window's cells of the windowed layers, each with its
        position and sequence (8 bytes) and a few bytes of header per layer; 0 where there is
        neither (measured: tiny qwen35 58,468 bytes, tiny gemma3 41,872)."""
        size = 0
        if self.n_recurrent:
            size += (self.state_bytes(1) + _CHECKPOINT_HEADER
                     + _CHECKPOINT_LAYER_HEADER * self.n_recurrent)
        windowed = [] if swa_full else [layer for layer in self.per_layer() if layer.window]
        if windowed:
            window = max(layer.window for layer in windowed)
            heads = sum(layer.n_head_kv for layer in windowed)
            size += int(window * (self._per_cell(heads, "f16") + _CHECKPOINT_CELL_HEADER)
                        + _CHECKPOINT_WINDOW_LAYER_HEADER * len(windowed))
        return size

    def checkpoints_bytes(self, n_slots: int = 1, n_checkpoints: int = 0,
                          cap: int | None = None, swa_full: bool = False) -> int:
        """What the context checkpoints of n_slots slots can take, in host RAM: each slot
        keeps at most n_checkpoints of them and `cap` bytes (the engine's
        `Checkpoints(n_max, max_bytes)`: one bigger than the cap is not kept at all; None:
        `checkpoint_cap`'s choice). 0 for a model without recurrent layers or small
        sliding-window caches, or with checkpoints off."""
        one = self.checkpoint_bytes(swa_full)
        if not one or n_checkpoints <= 0:
            return 0
        return min(n_checkpoints, checkpoint_cap(one, cap) // one) * one * max(n_slots, 1)

    def context_bytes(self, n_ctx: int, n_slots: int = 1, kv_type: str = "f16",
                      swa_full: bool = True, n_ubatch: int = 512, snapshots: int = 0) -> int:
        """What a context holds besides the weights and buffers: KV and recurrent state."""
        return (self.kv_bytes(n_ctx, n_slots, kv_type, swa_full, n_ubatch)
                + self.state_bytes(n_slots, snapshots))

    def expert_bytes(self, file_size: int) -> list[int]:
        """Per layer, the bytes of its expert tensors in a file of this size."""
        return [round(layer.expert_share * file_size) for layer in self.per_layer()]

    @property
    def n_attention(self) -> int:
        return sum(1 for layer in self.per_layer() if layer.n_head_kv)

    @property
    def n_recurrent(self) -> int:
        return sum(1 for layer in self.per_layer() if layer.recurrent)

    @property
    def n_swa(self) -> int:
        return sum(1 for layer in self.per_layer() if layer.n_head_kv and layer.window)

    @property
    def moe(self) -> bool:
        return any(layer.expert_share for layer in self.per_layer())

    @property
    def hybrid(self) -> bool:
        """Recurrent layers beside attention ones (llama.cpp's llama_model_is_hybrid)."""
        return bool(self.n_recurrent and self.n_attention)

    def describe(self) -> list[str]:
        """What the model is, in a few words each: "hybrid: 1 attention + 3 Gated DeltaNet
        layers", "sliding window 64 on 5 of 6 layers", "MoE 8 experts, 2 active"."""
        said = []
        if self.hybrid:
            said.append(f"hybrid: {self.n_attention} attention + {self.n_recurrent} "
                        f"{self.recurrent_kind} layers")
        elif self.n_recurrent:
            said.append(f"recurrent: {self.n_recurrent} {self.recurrent_kind} layers, no KV "
                        f"cache")
        if self.n_swa:
            windows = "/".join(str(w) for w in sorted({layer.window for layer in
                                                       self.per_layer() if layer.window}))
            of = "attention layers" if self.n_attention < self.n_layer else "layers"
            said.append(f"sliding window {windows} on {self.n_swa} of {self.n_attention} {of}")
        if self.n_expert:
            said.append(f"MoE {self.n_expert} experts, {self.n_expert_used} active")
        return said
