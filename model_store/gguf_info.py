"""Read and validate a GGUF file's header before llama.cpp ever sees it."""

from __future__ import annotations

import dataclasses
import itertools
import math
import mmap
import os
import re
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localinfer.errors import InvalidModelFile, ModelFileMissing
from localinfer.model_store.arch import read_layers
from localinfer.model_store.shape import POOLED_SEQUENCES, POOLED_UBATCH, Layer, ModelShape

__all__ = ["GGUFInfo", "ProjectorInfo", "has_fim_tokens", "part_paths", "quant_name",
           "read_gguf_header", "read_gguf_info", "read_gguf_part", "read_projector_header",
           "read_projector_info"]



def _import_gguf() -> Any:
    """The gguf package, with sentencepiece and mistral_common kept out of the process.

    gguf's vocab module imports them where they are installed, to write vocabularies, which
    the store never does. sentencepiece brings a private libstdc++ into the process, which
    made a CUDA build of llama.cpp crash at a model load (the package's root now makes the
    system's libstdc++ global first: app/__init__.py). Kept out, the store loads no native
    library (tests/test_import_order.py, tests/test_layers.py)."""
    blocked = [name for name in ("sentencepiece", "mistral_common") if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment]  # an import of it fails at once
    try:
        import gguf
    finally:
        for name in blocked:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]
    return gguf


gguf = _import_gguf()
_MAGIC = b"GGUF"


@dataclass(frozen=True)
class GGUFInfo:
    path: Path
    file_size: int
    architecture: str
    name: str
    quant: str
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_ctx_train: int
    sliding_window: int | None
    n_vocab: int
    chat_template: str | None
    n_embd: int = 0
    n_params: int = 0
    separate_output: bool = False
    input_embd_bytes: int = 0  # token_embd.weight's bytes, as its type stores them
    # an embedding model: a pooling type in its header (BERT's kin, Qwen3-Embedding, …)
    embedding: bool = False
    # a reranker (a cross-encoder, which scores a query and a document read together): rank
    # pooling in its header (Qwen3-Reranker) or a classification head (cls.output, as
    # llama.cpp's converter writes bge-reranker's and BERT cross-encoders'); it embeds nothing
    rerank: bool = False
    head: bool = False  # a classification head (cls or cls.output), in any part
    pooling: int = 0  # the header's pooling type (llama.cpp's enum: 1 mean, 2 CLS, 3 last, 4 rank)
    # per layer where they are not all full attention with n_head_kv heads (n_head_kv is
    # the largest of a per-layer array): attention kind, KV heads, recurrent (arch.py)
    layers: tuple[Layer, ...] = ()
    state_bytes: int = 0  # a recurrent layer's state of one sequence
    recurrent_kind: str = "recurrent"
    n_expert: int = 0
    n_expert_used: int = 0
    expert_bytes: tuple[int, ...] = ()  # per layer, its expert tensors' bytes (ffn_*_exps)

    def shape(self) -> ModelShape:
        """What the fit planner needs to know of the model."""
        layers = self.layers
        if any(self.expert_bytes) and self.file_size:
            layers = tuple(dataclasses.replace(layer, expert_share=n / self.file_size)
                           for layer, n in zip(layers or (Layer(self.n_head_kv),) * self.n_layer,
                                               self.expert_bytes))
        encoder = self.architecture in _ENCODERS
        # a causal model reads an input in micro-batches, but for CLS pooling (its first token);
        # pooled at the last token (or ranked), with one output row an input
        spans = not encoder and (self.rerank or self.pooling != _CLS)
        last = not encoder and (self.rerank or self.pooling == _LAST)
        return ModelShape(self.n_layer, self.n_head_kv, self.head_dim_k, self.head_dim_v,
                          self.n_vocab, self.n_ctx_train, self.n_embd,
                          input_embd_share=self.input_embd_share(), layers=layers,
                          state_bytes_per_layer=self.state_bytes, n_expert=self.n_expert,
                          n_expert_used=self.n_expert_used,
                          recurrent_kind=self.recurrent_kind,
                          pooled="rerank" if self.rerank else "embed" if self.embedding else "",
                          pooled_ubatch=POOLED_UBATCH if spans else 0,
                          pooled_outputs=POOLED_SEQUENCES if last else 0, encoder=encoder,
                          n_head=self.n_head)

    def input_embd_share(self) -> float:
        """The share of the weights that llama.cpp keeps in RAM whatever the GPU layers: the
        input embeddings, looked up row by row on the CPU — unless the output layer is the
        same tensor (tied), which then goes to the GPU with the output layer."""
        if not self.separate_output or not self.n_params:
            return 0.0
        if self.input_embd_bytes and self.file_size:  # (its own type: Q8_0 beside MXFP4)
            return self.input_embd_bytes / self.file_size
        return self.n_vocab * self.n_embd / self.n_params

    def kv_bytes_per_token(self, kv_type: str = "f16") -> float:
        """K and V for one token across all layers, as llama.cpp stores them (the shape's)."""
        return self.shape().kv_bytes_per_token(kv_type)


_SCALARS = {
    gguf.GGUFValueType.UINT8: "<B", gguf.GGUFValueType.INT8: "<b",
    gguf.GGUFValueType.UINT16: "<H", gguf.GGUFValueType.INT16: "<h",
    gguf.GGUFValueType.UINT32: "<I", gguf.GGUFValueType.INT32: "<i",
    gguf.GGUFValueType.FLOAT32: "<f", gguf.GGUFValueType.BOOL: "<?",
    gguf.GGUFValueType.UINT64: "<Q", gguf.GGUFValueType.INT64: "<q",
    gguf.GGUFValueType.FLOAT64: "<d",
}
# architectures that only embed (llama.cpp's encoder-only ones)
_ENCODERS = {"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3",
             "modern-bert", "neo-bert", "eurobert"}
_CLS, _LAST, _RANK = 2, 3, 4  # llama.cpp's LLAMA_POOLING_TYPE_CLS, _LAST and _RANK
_CLASSIFIER = "cls.output.weight"
_HEADS = {"cls.weight", _CLASSIFIER}  # what llama.cpp's rank pooling reads a score from
_SMALL_ARRAY = 4096  # arrays longer than this (the vocabulary) are skipped, not read
_MAX_ARRAY_NESTING = 4  # arrays of arrays: llama.cpp's own files use none
_MAX_DIMS = 4  # GGML_MAX_DIMS: llama.cpp refuses a tensor with more
_MAX_COUNT = 2**31  # a layer, head or context count beyond this is damage, not a model
# a layer's expert tensors, as llama.cpp's --fit names them (common/fit.cpp)
_EXPERTS = re.compile(r"^blk\.(\d+)\.ffn_(up|down|gate_up|gate)_(ch|)exps")


@dataclass(frozen=True)
class SkippedArray:
    length: int


class _Cursor:
    """Walks a GGUF header in a memory map. `gguf.GGUFReader` materialises every
    vocabulary entry as a numpy view, which takes seconds on a 262k-token vocabulary;
    this reads only what the planner and validator need."""

    def __init__(self, buf: mmap.mmap):
        self.buf = buf
        self.pos = 0

    def scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        raw = self.buf[self.pos : self.pos + n]
        if len(raw) != n:
            raise ValueError("string runs past the end of the file")
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int, depth: int = 0) -> Any:
        vtype = gguf.GGUFValueType(vtype)
        if vtype == gguf.GGUFValueType.STRING:
            return self.string()
        if vtype == gguf.GGUFValueType.ARRAY:
            if depth >= _MAX_ARRAY_NESTING:
                raise ValueError(f"arrays nest more than {_MAX_ARRAY_NESTING} deep")
            return self.array(depth + 1)
        return self.scalar(_SCALARS[vtype])

    def array(self, depth: int = 1) -> list[Any] | SkippedArray:
        item_type = gguf.GGUFValueType(self.scalar("<I"))
        n = self.scalar("<Q")
        if item_type in _SCALARS and n > _SMALL_ARRAY:  # token scores and types
            self.pos += n * struct.calcsize(_SCALARS[item_type])
            return SkippedArray(n)
        if n > _SMALL_ARRAY:  # the vocabulary: step over it without decoding
            if item_type != gguf.GGUFValueType.STRING:
                raise ValueError(f"unexpected large array of {item_type.name}")
            for _ in range(n):
                length = self.scalar("<Q")
                self.pos += length
            return SkippedArray(n)
        return [self.value(item_type, depth) for _ in range(n)]


@dataclass(frozen=True)
class _Header:
    meta: dict[str, Any]
    data_end: int  # where the last tensor's data ends
    n_params: int
    separate_output: bool  # an output.weight of its own (not the input embeddings, tied)
    expert_bytes: dict[int, int]  # layer → bytes of its expert tensors
    classifier: bool = False  # a classification head (cls.output.weight): a reranker's
    head: bool = False  # any head rank pooling reads (cls.weight or cls.output.weight)
    input_embd_bytes: int = 0  # token_embd.weight's


def _read_header(buf: mmap.mmap, size: int) -> _Header:
    cur = _Cursor(buf)
    cur.pos = 4
    version = cur.scalar("<I")
    if version < 2:
        raise ValueError(f"GGUF version {version} is too old")
    n_tensors, n_kv = cur.scalar("<Q"), cur.scalar("<Q")
    meta = {}
    for _ in range(n_kv):
        key = cur.string()
        meta[key] = cur.value(cur.scalar("<I"))
    data_end, n_params, separate_output, experts, classifier = 0, 0, False, {}, False
    head, input_embd = False, 0
    for _ in range(n_tensors):
        name = cur.string()
        separate_output |= name == "output.weight"
        classifier |= name == _CLASSIFIER
        head |= name in _HEADS
        n_dims = cur.scalar("<I")
        if n_dims > _MAX_DIMS:
            raise ValueError(f"tensor {name[:40]!r} has {n_dims:,} dimensions (at most "
                             f"{_MAX_DIMS})")
        dims = [cur.scalar("<Q") for _ in range(n_dims)]
        if math.prod(dims) >= 2**63:
            raise ValueError(f"tensor {name[:40]!r} has more than 2^63 elements")
        n_params += math.prod(dims)
        qtype = gguf.GGMLQuantizationType(cur.scalar("<I"))
        offset = cur.scalar("<Q")
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        n_bytes = math.prod(dims) // block * type_size
        data_end = max(data_end, offset + n_bytes)
        if name == "token_embd.weight":
            input_embd = n_bytes
        expert = _EXPERTS.match(name)
        if expert:
            layer = int(expert[1])
            experts[layer] = experts.get(layer, 0) + n_bytes
    alignment = meta.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT)
    if (not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0
            or alignment > 2**30 or alignment & (alignment - 1)):
        raise ValueError(f"general.alignment is {alignment!r}, not a power of two")
    data_start = -(-cur.pos // alignment) * alignment
    if n_tensors == 0:
        raise ValueError("it holds no tensors")
    return _Header(meta, data_start + data_end, n_params, separate_output, experts, classifier,
                   head, input_embd)


def _count(key: str, value: Any, default: int) -> int:
    """A count from the header (layers, heads, lengths): a whole number, or per-layer whole
    numbers (e.g. head_count_kv), of which the largest counts."""
    if value is None:
        return default
    values = value if isinstance(value, list) else [value]
    if not values:
        return default
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < _MAX_COUNT
               for v in values):
        raise ValueError(f"{key} is {value!r:.60}, not a count")  # (repr: the string "32" too)
    return max(values)


def _per_layer(key: str, value: Any, default: int, n_layer: int) -> list[int]:
    """A per-layer count (head_count_kv, feed_forward_length): an array read layer by layer
    (a layer it does not reach: 0), or one number for every layer."""
    if not isinstance(value, list):
        return [_count(key, value, default)] * n_layer
    _count(key, value, default)  # (validated)
    return [value[i] if i < len(value) else 0 for i in range(n_layer)]


def quant_name(file_type: int | None) -> str:
    """`general.file_type` as the usual label: 15 → "Q4_K_M"."""
    if file_type is None:
        return "unknown"
    try:
        return gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_")
    except ValueError:
        return f"type{file_type}"


def _check_header(path: Path) -> int:
    if not path.exists():
        raise ModelFileMissing(str(path))
    if not path.is_file():  # (a device or a pipe would be read without end, or block)
        what = "a directory" if path.is_dir() else "not a regular file (a device or a pipe)"
        raise InvalidModelFile(str(path), f"it is {what}, not a model file")
    size = path.stat().st_size
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != _MAGIC:
        raise InvalidModelFile(str(path), f"it does not start with the GGUF magic (found {magic!r})")
    return size


_PART = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def part_paths(path: Path, count: int) -> list[Path]:
    """The parts of a split model (llama.cpp's naming: NAME-00001-of-00003.gguf), from the
    first's path."""
    match = _PART.match(path.name)
    if not match or int(match["no"]) != 1 or int(match["count"]) != count:
        raise InvalidModelFile(str(path), f"it is part of a model split in {count}, but not "
                                          f"named as its first part (NAME-00001-of-"
                                          f"{count:05d}.gguf) — load the first part")
    return [path.with_name(f"{match['prefix']}-{i:05d}-of-{count:05d}.gguf")
            for i in range(1, count + 1)]


def read_gguf_info(path: str | os.PathLike[str]) -> GGUFInfo:
    """Parse the header and tensor table; reject files that are not GGUF or are cut short.
    A model split in parts is read from its first: the size and weights are the whole set's,
    and a part missing or damaged is an error naming it."""
    info, meta = _read_part(Path(path))
    try:
        count = _count("split.count", meta.get("split.count"), 1) or 1
        number = _count("split.no", meta.get("split.no"), 0)
    except ValueError as exc:
        raise InvalidModelFile(str(path), f"the header is damaged ({exc})") from None
    if count == 1:
        return _with_head(info)
    if number != 0:
        raise InvalidModelFile(str(path), "it is not the first part of its split model — "
                                          "load the part named -00001-of-")
    size, n_params, separate = info.file_size, info.n_params, info.separate_output
    input_embd = info.input_embd_bytes
    experts, rerank, head = list(info.expert_bytes), info.rerank, info.head
    for number, part in enumerate(part_paths(Path(path), count)[1:], start=2):
        if not part.is_file():
            raise InvalidModelFile(str(path), f"part {number} of {count}, {part.name}, is not "
                                              f"beside it — put it there, or pull the model "
                                              f"again")
        other, _ = _read_part(part)
        size, n_params = size + other.file_size, n_params + other.n_params
        separate |= other.separate_output
        input_embd += other.input_embd_bytes  # (in one part of them)
        rerank |= other.rerank  # (its head may be in any part)
        head |= other.head
        experts = [a + b for a, b in itertools.zip_longest(experts, other.expert_bytes,
                                                           fillvalue=0)]
    return _with_head(dataclasses.replace(
        info, file_size=size, n_params=n_params, separate_output=separate,
        input_embd_bytes=input_embd, expert_bytes=tuple(experts), rerank=rerank, head=head,
        embedding=info.embedding and not rerank))


def _with_head(info: GGUFInfo) -> GGUFInfo:
    """A file that asks for rank pooling has the head it is read from: llama.cpp would score
    each pair with the first number of a hidden state instead (no error: a wrong answer)."""
    if info.pooling == _RANK and not info.head:
        raise InvalidModelFile(str(info.path), "it asks for rank pooling but has no "
                                               "classification head (cls.output) — a reranker "
                                               "converted before llama.cpp wrote the head; "
                                               "convert it again, or pull another conversion")
    return info


# the texts llama.cpp knows fill-in-the-middle tokens by, where the file names none by key
_FIM = (("fim_pre", ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>",
                     "<PRE>", "▁<PRE>", "<|code_prefix|>")),
        ("fim_suf", ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>",
                     "<SUF>", "▁<SUF>", "<|code_suffix|>")),
        ("fim_mid", ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>",
                     "<MID>", "▁<MID>", "<|code_middle|>")))
_FIM_SCAN = 64 << 20  # the header's first bytes: where the vocabulary is


def has_fim_tokens(path: str | os.PathLike[str]) -> bool:
    """Whether a model's vocabulary has the three fill-in-the-middle tokens (prefix, suffix,
    middle): named by their keys, or among the tokens by the texts llama.cpp knows them by.
    Read from the header's bytes (a string there is its length, 8 bytes, then the text)."""
    def stored(text: str) -> bytes:
        data = text.encode()
        return struct.pack("<Q", len(data)) + data

    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            end = min(len(buf), _FIM_SCAN)
            return all(buf.find(stored(f"tokenizer.ggml.{key}_token_id"), 0, end) >= 0
                       or any(buf.find(stored(text), 0, end) >= 0 for text in texts)
                       for key, texts in _FIM)
    except (OSError, ValueError):
        return False


def read_gguf_part(path: str | os.PathLike[str]) -> GGUFInfo:
    """One file's header and tensors, whether or not it is a part of a split model."""
    return _read_part(Path(path))[0]


def _read_part(path: Path) -> tuple[GGUFInfo, dict[str, Any]]:
    size = _check_header(path)
    try:
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            header = _read_header(buf, size)
    except _DAMAGE as exc:
        raise InvalidModelFile(str(path), f"the header is damaged or cut short ({exc})") from exc
    if header.data_end > size:
        raise InvalidModelFile(
            str(path),
            f"the file is truncated: {size:,} bytes but its tensors need {header.data_end:,} "
            "— download it again",
        )
    return _info_from_header(path, size, header), header.meta


# what a damaged header raises while it is read: each becomes InvalidModelFile
_DAMAGE = (ValueError, KeyError, TypeError, struct.error, OverflowError, MemoryError)


@dataclass(frozen=True)
class ProjectorInfo:
    """A vision projector (an mmproj GGUF, architecture "clip"): what its memory takes."""

    path: Path
    file_size: int
    quant: str
    projector_type: str  # clip.projector_type: gemma3, idefics3, qwen2vl_merger, …
    image_size: int  # pixels a side an image is resized to
    patch_size: int
    n_embd: int  # the vision tower's width
    n_ff: int
    projection_dim: int  # the text model's width it writes (0 where the file does not say)

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2 if self.patch_size else 0


def read_projector_info(path: str | os.PathLike[str]) -> ProjectorInfo:
    """A projector file's facts; InvalidModelFile where it is no vision projector."""
    path = Path(path)
    info, meta = _read_part(path)
    return _projector(path, info, meta)


def read_projector_header(data: bytes, path: Path, file_size: int) -> ProjectorInfo:
    """The same, from a file's first bytes (a range request to the hub)."""
    header = _first_bytes_header(data, path, file_size)
    return _projector(path, _info_from_header(path, file_size, header), header.meta)


def _projector(path: Path, info: GGUFInfo, meta: dict[str, Any]) -> ProjectorInfo:
    if info.architecture != "clip" or not meta.get("clip.has_vision_encoder"):
        raise InvalidModelFile(str(path), "it is not a vision projector (an mmproj GGUF with "
                                          "a vision encoder)")

    def count(key: str) -> int:
        return _count(key, meta.get(key), 0) or 0

    kind = meta.get("clip.vision.projector_type", meta.get("clip.projector_type", ""))
    return ProjectorInfo(path, info.file_size, info.quant, str(kind),
                         count("clip.vision.image_size"), count("clip.vision.patch_size"),
                         count("clip.vision.embedding_length"),
                         count("clip.vision.feed_forward_length"),
                         count("clip.vision.projection_dim"))


def read_gguf_header(data: bytes, path: Path, file_size: int) -> GGUFInfo:
    """The same, from the first bytes of a file elsewhere (a range request to the hub)."""
    header = _first_bytes_header(data, path, file_size)
    if file_size and header.data_end > file_size:
        raise InvalidModelFile(str(path), f"its tensors need {header.data_end:,} bytes but the "
                                          f"file has {file_size:,}")
    return _info_from_header(path, file_size, header)


def _first_bytes_header(data: bytes, path: Path, file_size: int) -> _Header:
    """The header read from a file's first bytes; InvalidModelFile where they hold none."""
    if data[:4] != _MAGIC:
        raise InvalidModelFile(str(path), f"it does not start with the GGUF magic (found {data[:4]!r})")
    try:
        return _read_header(data, file_size)
    except _DAMAGE as exc:
        raise InvalidModelFile(str(path), f"the header is damaged or cut short ({exc})") from exc


def _array_length(value: Any) -> int:
    if isinstance(value, SkippedArray):
        return value.length
    return len(value) if isinstance(value, list) else 0


def _info_from_header(path: Path, size: int, header: _Header) -> GGUFInfo:
    try:
        return _facts(path, size, header)
    except _DAMAGE as exc:
        raise InvalidModelFile(str(path), f"the header is damaged ({exc})") from exc


def _facts(path: Path, size: int, header: _Header) -> GGUFInfo:
    meta = header.meta
    arch = str(meta.get("general.architecture", "unknown"))

    def get(key: str, default: int | None = 0, per_layer: bool = False) -> Any:
        if per_layer:
            return _per_layer(f"{arch}.{key}", meta.get(f"{arch}.{key}"), default, n_layer)
        return _count(f"{arch}.{key}", meta.get(f"{arch}.{key}"), default)

    n_layer = get("block_count")
    n_head = get("attention.head_count")
    n_embd = get("embedding_length")
    n_head_kv = get("attention.head_count_kv", n_head)
    default_head_dim = n_embd // n_head if n_head else 0
    window = get("attention.sliding_window", None)
    kinds = read_layers(get, lambda key: meta.get(f"{arch}.{key}"), arch, n_layer, n_embd,
                        window or 0, n_head_kv)
    template = meta.get("tokenizer.chat_template")
    file_type = meta.get("general.file_type")
    pooling = get("pooling_type", 0)
    rerank = pooling == _RANK or header.classifier
    return GGUFInfo(
        path=path,
        file_size=size,
        architecture=arch,
        name=str(meta.get("general.name", path.stem)),
        quant=quant_name(file_type if isinstance(file_type, int) else None),
        n_layer=n_layer,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=get("attention.key_length", default_head_dim),
        head_dim_v=get("attention.value_length", default_head_dim),
        n_ctx_train=get("context_length"),
        sliding_window=window or None,
        n_vocab=_array_length(meta.get("tokenizer.ggml.tokens")),
        chat_template=template if isinstance(template, str) else None,
        n_embd=n_embd,
        n_params=header.n_params,
        separate_output=header.separate_output,
        input_embd_bytes=header.input_embd_bytes,
        embedding=not rerank and (bool(pooling) or arch in _ENCODERS),
        rerank=rerank,
        head=header.head,
        pooling=pooling if isinstance(pooling, int) else 0,
        layers=kinds.layers,
        state_bytes=kinds.state_bytes,
        recurrent_kind=kinds.recurrent_kind,
        n_expert=get("expert_count"),
        n_expert_used=get("expert_used_count"),
        expert_bytes=tuple(header.expert_bytes.get(i, 0) for i in range(n_layer))
        if header.expert_bytes else (),
    )
