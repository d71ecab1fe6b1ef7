"""What each layer of an architecture keeps, read from its header keys as llama.cpp reads them.

llama.cpp decides per architecture which layers attend over a sliding window, which are
recurrent and how large a recurrent state is (src/models/<arch>.cpp `load_arch_hparams`,
llama-hparams.cpp `n_embd_r` / `n_embd_s`); the header carries the numbers, the code the
rules. This module holds those rules for the architectures we plan for; an architecture
it does not know is planned as a transformer with full attention on every layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from localinfer.model_store.shape import Layer

__all__ = ["Layers", "read_layers"]

# sliding-window layers where the header gives no per-layer pattern: (n, dense_first) of
# llama.cpp's set_swa_pattern — of each n layers, the last (or, dense first, the first)
# attends to the whole context
_SWA_PATTERN = {"gemma2": (2, False), "gemma3": (6, False), "gemma3n": (5, False),
                "gemma-embedding": (6, False), "cohere2": (4, False),
                "cohere2moe": (4, True), "gpt-oss": (2, False), "llama4": (4, False),
                "exaone4": (4, False), "exaone-moe": (4, False), "olmo2": (4, False),
                "afmoe": (4, False), "mellum": (4, False), "muse-glimmer": (4, False),
                "plamo3": (8, False), "smallthinker": (4, True), "laguna": (4, True)}
# recurrent architectures: every layer holds a state, none attends
_RECURRENT = {"mamba": "Mamba", "mamba2": "Mamba-2", "rwkv6": "RWKV", "rwkv6qwen2": "RWKV",
              "rwkv7": "RWKV", "arwkv7": "RWKV"}
# hybrids: a layer is recurrent where `attention.recurrent_layers` says so, else one in
# `full_attention_interval` (4 by default) attends
_BY_INTERVAL = {"qwen3next": "Gated DeltaNet", "qwen35": "Gated DeltaNet",
                "qwen35moe": "Gated DeltaNet"}
# hybrids whose recurrent layers are those without KV heads (Nemotron-H: and without a
# feed-forward network, which a layer of its own holds)
_BY_KV_HEADS = {"lfm2": "short convolution", "lfm2moe": "short convolution",
                "jamba": "Mamba", "granitehybrid": "Mamba-2", "plamo2": "Mamba",
                "nemotron_h": "Mamba-2", "nemotron_h_moe": "Mamba-2"}
_BOTH = {"falcon-h1": "Mamba-2"}  # every layer attends and holds a state
_F32 = 4  # llama.cpp keeps recurrent states in F32


@dataclass(frozen=True)
class Layers:
    layers: tuple[Layer, ...]  # () where every layer is full attention with the same heads
    state_bytes: int  # one recurrent layer's state of one sequence
    recurrent_kind: str


def _swa(meta_get: Callable, n_layer: int, window: int, arch: str) -> list[bool]:
    """Which layers attend over the sliding window (llama_hparams::set_swa_pattern)."""
    if not window:
        return [False] * n_layer
    pattern = meta_get("attention.sliding_window_pattern")
    if isinstance(pattern, list) and pattern:
        return [bool(pattern[i]) if i < len(pattern) else False for i in range(n_layer)]
    if arch == "lfm2":
        return [True] * n_layer  # (its attention layers; the others attend to nothing)
    n, dense_first = _SWA_PATTERN.get(arch, (1, False))
    if isinstance(pattern, int) and not isinstance(pattern, bool):
        n = pattern
    if arch not in _SWA_PATTERN and not isinstance(pattern, int):
        return [False] * n_layer
    if dense_first:
        return [n == 0 or i % n != 0 for i in range(n_layer)]
    return [n == 0 or i % n < n - 1 for i in range(n_layer)]


def _recurrent(get: Callable, meta_get: Callable, arch: str, kv_heads: list[int],
               n_layer: int) -> list[bool]:
    if arch in _RECURRENT or arch in _BOTH:
        return [True] * n_layer
    marked = meta_get("attention.recurrent_layers")
    if isinstance(marked, list) and marked:
        return [bool(marked[i]) if i < len(marked) else False for i in range(n_layer)]
    if arch in _BY_INTERVAL:
        interval = get("full_attention_interval", 4) or 4
        return [(i + 1) % interval != 0 for i in range(n_layer)]
    if arch in _BY_KV_HEADS:
        ffn = get("feed_forward_length", 0, per_layer=True) if arch.startswith(
            "nemotron_h") else [0] * n_layer
        return [kv_heads[i] == 0 and ffn[i] == 0 for i in range(n_layer)]
    return [False] * n_layer


def _state_bytes(get: Callable, arch: str, n_embd: int) -> int:
    """One recurrent layer's state of one sequence: llama.cpp's r (convolution or token
    shift) and s (the state proper) rows, F32 (llama_hparams::n_embd_r, n_embd_s)."""
    if arch.startswith(("rwkv", "arwkv")):
        head_size = get("wkv.head_size", 0)
        return (get("token_shift_count", 2) * n_embd + n_embd * head_size) * _F32
    l_cache = get("shortconv.l_cache", 0)
    d_conv, d_inner = get("ssm.conv_kernel", 0), get("ssm.inner_size", 0)
    d_state, n_group = get("ssm.state_size", 0), get("ssm.group_count", 0)
    r = (n_embd * (l_cache - 1) if l_cache else
         max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state))
    return (r + d_state * d_inner) * _F32


def read_layers(get: Callable, meta_get: Callable, arch: str, n_layer: int, n_embd: int,
                window: int, n_head_kv: int) -> Layers:
    """Each layer's kind from the header. `get(key, default, per_layer=False)`: a count
    under the architecture's prefix (per_layer: a list of n_layer, an array read layer by
    layer or one number for all); `meta_get(key)`: the raw value."""
    kv_heads = get("attention.head_count_kv", n_head_kv, per_layer=True)
    recurrent = _recurrent(get, meta_get, arch, kv_heads, n_layer)
    swa = _swa(meta_get, n_layer, window, arch)
    # the next-token-prediction (MTP) layers at the end: not in the main context's cache
    trunk = n_layer - (get("nextn_predict_layers", 0) or 0)
    attends = [i < trunk and (not recurrent[i] or arch in _BOTH) for i in range(n_layer)]
    layers = tuple(Layer(kv_heads[i] if attends[i] else 0, window if swa[i] else 0,
                         recurrent[i] and i < trunk) for i in range(n_layer))
    kind = _RECURRENT.get(arch) or _BY_INTERVAL.get(arch) or _BY_KV_HEADS.get(arch) or \
        _BOTH.get(arch) or "recurrent"
    state = _state_bytes(get, arch, n_embd) if any(recurrent) else 0
    if layers == (Layer(n_head_kv),) * n_layer:
        layers = ()  # a dense transformer
    return Layers(layers, state, kind)
