"""Write a tiny Gemma 3 vision projector (mmproj) GGUF with random weights.

libmtmd pairs a text model with an "mmproj" file: a SigLIP vision tower, then Gemma 3's
average pool, soft-embedding RMS norm and input projection into the text model's embedding
width. Real ones are 400+ MiB; this one is a megabyte or two and encodes an image in a few
milliseconds on a CPU, which is enough to exercise the image path (tokenize, encode, decode
embeddings into a llama_context) without downloading a vision model. Its output is noise.

The projection's width must equal the text model's `{arch}.embedding_length`, else
mtmd_init_from_file refuses the pair, so give that width or the text GGUF to read it from:

    python3 bench/random_mmproj.py /tmp/mmproj.gguf --text-model gemma-3-270m-q4_k_m.gguf
    python3 bench/random_mmproj.py /tmp/mmproj.gguf --n-embd 640 --tokens 16
    python3 bench/random_mmproj.py /tmp/mmproj.gguf --n-embd 576 --image-size 112 --tokens 64

Every image becomes `--tokens` image tokens (a square number): Gemma 3 resizes any image to
image_size x image_size, cuts it into patches and average-pools them, so the count is fixed.

`--type qwen2vl` writes Qwen2-VL's instead (its merger, for a text model of architecture
qwen2vl): an image keeps its aspect, cut into 28-pixel squares (a token each), and its
tokens take positions in two dimensions in the text model (M-RoPE), as Qwen2/2.5/3-VL's do:

    python3 bench/random_mmproj.py /tmp/qwen-mmproj.gguf --type qwen2vl --n-embd 64
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Tower:
    image_size: int  # pixels per side after mtmd's resize
    patch_size: int
    n_merge: int  # patches per side that one output token averages (the pool kernel)
    n_embd: int  # the vision tower's width
    n_head: int
    n_ff: int
    n_layer: int

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def n_tokens(self) -> int:
        return (self.patches_per_side // self.n_merge) ** 2


# Real Gemma 3 is 896 px, patch 14, width 1152, 16 heads, ff 4304, 27 blocks, pool 4
# (256 tokens). These keep the geometry and shrink the rest.
_N_EMBD, _N_HEAD, _N_FF, _N_LAYER = 128, 4, 256, 2
_EPS = 1e-6  # SigLIP's layer_norm_eps, as the converter writes it


def text_n_embd(path: Path) -> int:
    """`{arch}.embedding_length` of a text GGUF (the width the projector must output)."""
    import gguf

    reader = gguf.GGUFReader(path)
    arch = reader.get_field("general.architecture").contents()
    field = reader.get_field(f"{arch}.embedding_length")
    if field is None:
        sys.exit(f"{path} has no {arch}.embedding_length")
    return int(field.contents())


def make_tower(image_size: int, patch_size: int, n_tokens: int, real: bool = False,
               n_layer: int | None = None) -> Tower:
    """The tower whose pool turns image_size/patch_size patches a side into n_tokens; `real`:
    SigLIP-400M's widths (Gemma 3's own tower), `n_layer` of its blocks [27]."""
    per_side = math.isqrt(n_tokens)
    if per_side * per_side != n_tokens:
        sys.exit(f"--tokens must be a square number (the pool's output is square), not {n_tokens}")
    if image_size % patch_size:
        sys.exit(f"--image-size {image_size} is not a multiple of the patch size {patch_size}")
    patches = image_size // patch_size
    # clip.cpp pools with kernel = stride = n_merge and no padding; a remainder would be
    # dropped silently and the token count would not be what was asked for
    if patches % per_side:
        fits = [(patches // k) ** 2 for k in range(1, patches + 1) if patches % k == 0]
        sys.exit(f"{patches} patches a side do not pool evenly into {per_side} tokens a side; "
                 f"pick --tokens from {fits}")
    if real:
        return Tower(image_size, patch_size, patches // per_side, 1152, 16, 4304, n_layer or 27)
    return Tower(image_size, patch_size, patches // per_side, _N_EMBD, _N_HEAD, _N_FF,
                 n_layer or _N_LAYER)


class _Writer:
    """A projector GGUF being written: its header keys, then random tensors as the
    converters type them (matrices f16, the rest f32)."""

    def __init__(self, out: Path, name: str, kind, image_size: int, patch_size: int, d: int,
                 n_ff: int, n_layer: int, n_head: int, n_embd_text: int, seed: int,
                 mean: list[float], std: list[float]):
        import gguf

        self.rng = np.random.default_rng(seed)
        self.gguf = writer = gguf.GGUFWriter(out, "clip")
        writer.add_name(name)
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
        writer.add_clip_has_vision_encoder(True)
        writer.add_clip_projector_type(kind)
        writer.add_vision_image_size(image_size)
        writer.add_vision_patch_size(patch_size)
        writer.add_vision_embedding_length(d)
        writer.add_vision_feed_forward_length(n_ff)
        writer.add_vision_block_count(n_layer)
        writer.add_vision_head_count(n_head)
        writer.add_vision_attention_layernorm_eps(_EPS)
        # required by clip.cpp even where a family reads its output width off a tensor
        writer.add_vision_projection_dim(n_embd_text)
        # SigLIP's MLP is gelu-tanh; without this key clip.cpp would use quick-gelu
        writer.add_vision_use_gelu(True)
        # clip.cpp refuses a vision model without mean/std
        writer.add_vision_image_mean(mean)
        writer.add_vision_image_std(std)

    def matrix(self, tensor: str, rows: int, cols: int) -> None:
        # numpy's (rows, cols) is ggml's ne = [cols, rows]: `cols` inputs, `rows` outputs
        self.gguf.add_tensor(tensor, (self.rng.standard_normal((rows, cols)) * 0.02
                                      ).astype(np.float16))

    def f32(self, tensor: str, *shape: int, fill: float | None = None) -> None:
        data = (np.full(shape, fill) if fill is not None
                else self.rng.standard_normal(shape) * 0.02)
        self.gguf.add_tensor(tensor, data.astype(np.float32))

    def layer_norm(self, prefix: str, width: int) -> None:
        self.f32(f"{prefix}.weight", width, fill=1.0)
        self.f32(f"{prefix}.bias", width, fill=0.0)

    def blocks(self, n_layer: int, d: int, n_ff: int) -> None:
        """The vision tower's blocks: LayerNorm, attention with biases, LayerNorm, an MLP."""
        for i in range(n_layer):
            blk = f"v.blk.{i}"
            self.layer_norm(f"{blk}.ln1", d)
            for proj in ("attn_q", "attn_k", "attn_v", "attn_out"):
                self.matrix(f"{blk}.{proj}.weight", d, d)
                self.f32(f"{blk}.{proj}.bias", d)
            self.layer_norm(f"{blk}.ln2", d)
            # clip.cpp swaps up/down for some families when ffn_down's input width equals
            # n_embd (old converters named them backwards); n_ff != n_embd keeps them
            self.matrix(f"{blk}.ffn_up.weight", n_ff, d)
            self.f32(f"{blk}.ffn_up.bias", n_ff)
            self.matrix(f"{blk}.ffn_down.weight", d, n_ff)
            self.f32(f"{blk}.ffn_down.bias", d)

    def close(self) -> None:
        self.gguf.write_header_to_file()
        self.gguf.write_kv_data_to_file()
        self.gguf.write_tensors_to_file()
        self.gguf.close()


def write_mmproj(tower: Tower, n_embd_text: int, out: Path, seed: int = 0) -> None:
    import gguf

    d = tower.n_embd
    # Gemma 3's mean/std take pixels to [-1, 1]
    w = _Writer(out, f"random gemma3 mmproj {tower.n_tokens} tokens -> {n_embd_text}",
                gguf.VisionProjectorType.GEMMA3, tower.image_size, tower.patch_size, d,
                tower.n_ff, tower.n_layer, tower.n_head, n_embd_text, seed,
                [0.5, 0.5, 0.5], [0.5, 0.5, 0.5])
    # clip.cpp defaults the pool to 4 for gemma3 and reads this key to override it, as
    # llama.cpp's tinygemma3 test model does; written always so the file says what it does
    w.gguf.add_vision_projector_scale_factor(tower.n_merge)
    # f32 as the converter forces for SigLIP's embeddings (patch conv kernel, positions):
    # real files have them so, and the graph adds the positions to f32 activations
    w.f32("v.patch_embd.weight", d, 3, tower.patch_size, tower.patch_size)
    w.f32("v.patch_embd.bias", d)
    w.f32("v.position_embd.weight", tower.patches_per_side ** 2, d)
    w.blocks(tower.n_layer, d, tower.n_ff)
    w.layer_norm("v.post_ln", d)
    # Gemma3RMSNorm multiplies by (1 + w); the converter stores 1 + w, so ones is a no-op
    w.f32("mm.soft_emb_norm.weight", d, fill=1.0)
    # ne = [n_embd_text, d]: clip_n_mmproj_embd returns ne[0], which mtmd checks against the
    # text model. f16 as the converter forces (llama.cpp issue 13025)
    w.matrix("mm.input_projection.weight", d, n_embd_text)
    w.close()


def write_qwen2vl(n_embd_text: int, out: Path, seed: int = 0) -> None:
    """Qwen2-VL's vision tower (two patch convolutions over a frame pair, LayerNorm blocks
    whose attention turns by M-RoPE) and merger (2x2 patches into one token, an MLP into the
    text model's width), narrow."""
    import gguf

    d, n_ff, patch = _N_EMBD, _N_FF, 14
    # (image size: what clip.cpp sizes its first buffers by; CLIP's mean and std, as Qwen's)
    w = _Writer(out, f"random qwen2vl mmproj -> {n_embd_text}",
                gguf.VisionProjectorType.QWEN2VL, 560, patch, d, n_ff, _N_LAYER, _N_HEAD,
                n_embd_text, seed, [0.48145466, 0.4578275, 0.40821073],
                [0.26862954, 0.26130258, 0.27577711])
    # the converter splits Qwen's 3-D patch convolution (2 frames) into two 2-D kernels
    w.f32("v.patch_embd.weight", d, 3, patch, patch)
    w.f32("v.patch_embd.weight.1", d, 3, patch, patch)
    w.blocks(_N_LAYER, d, n_ff)
    w.layer_norm("v.post_ln", d)  # the merger's ln_q
    w.matrix("mm.0.weight", 4 * d, 4 * d)
    w.f32("mm.0.bias", 4 * d)
    w.matrix("mm.2.weight", n_embd_text, 4 * d)
    w.f32("mm.2.bias", n_embd_text)
    w.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    width = parser.add_mutually_exclusive_group(required=True)
    width.add_argument("--n-embd", type=int, help="the text model's embedding width")
    width.add_argument("--text-model", type=Path, help="text GGUF to read the width from")
    parser.add_argument("--image-size", type=int, default=224,
                        help="pixels a side that every image is resized to [224]")
    parser.add_argument("--patch-size", type=int, default=14, help="[14, as SigLIP]")
    parser.add_argument("--tokens", type=int, default=64,
                        help="image tokens per image, a square number [64]")
    parser.add_argument("--gemma3", action="store_true",
                        help="Gemma 3's own tower widths (SigLIP-400M: 1152 wide, 16 heads, "
                        "ff 4304, 27 blocks; with --image-size 896 --tokens 256, its shape)")
    parser.add_argument("--layers", type=int, help="vision blocks [2; 27 with --gemma3]")
    parser.add_argument("--type", choices=("gemma3", "qwen2vl"), default="gemma3",
                        help="whose projector [gemma3]")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    n_embd_text = args.n_embd if args.n_embd is not None else text_n_embd(args.text_model)
    if args.type == "qwen2vl":
        write_qwen2vl(n_embd_text, args.out, args.seed)
        print(f"{args.out}: Qwen2-VL's merger into width {n_embd_text}, "
              f"{args.out.stat().st_size / 2**20:.1f} MiB")
        return
    tower = make_tower(args.image_size, args.patch_size, args.tokens, args.gemma3, args.layers)
    write_mmproj(tower, n_embd_text, args.out, args.seed)
    print(f"{args.out}: {tower.n_tokens} tokens of width {n_embd_text} per image, "
          f"{args.out.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
