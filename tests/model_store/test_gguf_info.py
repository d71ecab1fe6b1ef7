from __future__ import annotations

import logging
import os
import re
import struct

import pytest

from localinfer.backends.base import LoadOptions, SamplingParams
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.errors import InvalidRequest, InvalidModelFile, ModelFileMissing
from localinfer.model_store.gguf_info import read_gguf_info


def test_reads_architecture_facts_of_both_models(smollm2_path, gemma3_path):
    s = read_gguf_info(smollm2_path)
    assert (s.architecture, s.quant, s.n_layer, s.n_head, s.n_head_kv) == ("llama", "Q4_1", 30, 9, 3)
    assert (s.head_dim_k, s.n_ctx_train, s.n_vocab, s.sliding_window) == (64, 8192, 49152, None)
    assert s.chat_template and "<|im_start|>" in s.chat_template
    g = read_gguf_info(gemma3_path)
    assert (g.architecture, g.quant, g.n_layer, g.n_head_kv, g.head_dim_k) == ("gemma3", "Q4_K_M", 18, 1, 256)
    assert (g.n_ctx_train, g.sliding_window, g.n_vocab, g.chat_template) == (32768, 512, 262144, None)


@pytest.mark.parametrize("model,kv_type", [("smollm2_path", "f16"), ("gemma3_path", "f16"),
                                           ("smollm2_path", "q8_0"), ("gemma3_path", "q4_0")])
def test_kv_bytes_agree_with_what_llama_cpp_allocates(model, kv_type, request, caplog):
    path = request.getfixturevalue(model)
    info = read_gguf_info(path)
    caplog.set_level(logging.INFO, logger="localinfer.llama_cpp")
    with LlamaCppBackend(path, LoadOptions(n_ctx=2048, kv_type=kv_type)) as backend:
        # a quantised cache still generates
        assert backend.generate(backend.tokenize("The sky is"),
                                SamplingParams(temperature=0, max_tokens=3)).text()
    reported = [float(m) for m in re.findall(r"KV buffer size =\s+([\d.]+) MiB", caplog.text)]
    assert reported, "llama.cpp did not report its KV buffer"
    # (gemma3's sliding-window layers at their window: the engine's default, swa_full off)
    ours = info.shape().kv_bytes(2048, 1, kv_type, swa_full=LoadOptions().swa_full) / 2**20
    assert sum(reported) == pytest.approx(ours, rel=0.05)


def test_truncated_file_is_rejected_with_sizes(smollm2_path, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(smollm2_path.read_bytes()[:20_000_000])
    with pytest.raises(InvalidModelFile, match=r"truncated: 20,000,000 bytes but its tensors need"):
        read_gguf_info(cut)


def test_file_cut_inside_the_header_is_rejected(smollm2_path, tmp_path):
    cut = tmp_path / "head.gguf"
    with smollm2_path.open("rb") as f:
        cut.write_bytes(f.read(5000))
    with pytest.raises(InvalidModelFile, match="damaged or cut short"):
        read_gguf_info(cut)


def test_not_gguf_missing_and_directory(tmp_path):
    text = tmp_path / "notes.gguf"
    text.write_text("hello world")
    with pytest.raises(InvalidModelFile, match="GGUF magic"):
        read_gguf_info(text)
    with pytest.raises(ModelFileMissing):
        read_gguf_info(tmp_path / "absent.gguf")
    with pytest.raises(InvalidModelFile, match="directory"):
        read_gguf_info(tmp_path)
    if hasattr(os, "mkfifo"):  # a pipe is neither a directory nor read (it would block)
        os.mkfifo(tmp_path / "pipe.gguf")
        with pytest.raises(InvalidModelFile, match="not a regular file"):
            read_gguf_info(tmp_path / "pipe.gguf")


def test_a_quantised_cache_without_flash_attention_is_refused():
    with pytest.raises(InvalidRequest, match="flash attention"):
        LoadOptions(kv_type="q8_0", flash_attn=False)
    with pytest.raises(InvalidRequest, match="f16, q8_0 or q4_0"):
        LoadOptions(kv_type="q5_1")


def _tiny_gguf(path, separate_output: bool):
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_context_length(256)
    writer.add_token_list([f"t{i}" for i in range(1000)])
    writer.add_tensor("token_embd.weight", np.zeros((1000, 64), dtype=np.float32))
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((64, 64), dtype=np.float32))
    if separate_output:
        writer.add_tensor("output.weight", np.zeros((1000, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return read_gguf_info(path)


def test_the_input_embeddings_of_an_untied_model_stay_off_the_gpu(tmp_path):
    """llama.cpp looks input embeddings up on the CPU; only a tied model's (the same tensor as
    its output layer) go to the GPU. The plan takes the untied share off the GPU's weights."""
    untied = _tiny_gguf(tmp_path / "untied.gguf", separate_output=True)
    tied = _tiny_gguf(tmp_path / "tied.gguf", separate_output=False)
    assert untied.n_params == 2 * 64_000 + 64 * 64 and tied.n_params == 64_000 + 64 * 64
    # their bytes as their type stores them (F32 here), of the file's
    assert untied.input_embd_bytes == 64_000 * 4
    assert untied.input_embd_share() == 64_000 * 4 / untied.file_size
    assert tied.input_embd_share() == 0
    shape = untied.shape()
    assert shape.gpu_weights(1_000_000) == int(1_000_000 * (1 - 256_000 / untied.file_size))


def _pooled(path, arch: str, pooling: int | None, head: bool):
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_embedding_length(32)
    writer.add_head_count(2)
    writer.add_token_list([f"t{i}" for i in range(8)])
    if pooling is not None:
        writer.add_pooling_type(gguf.PoolingType(pooling))
    writer.add_tensor("token_embd.weight", np.zeros((8, 32), dtype=np.float32))
    if head:  # a classifier, as llama.cpp's converter names it
        writer.add_tensor("cls.output.weight", np.zeros((1, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return read_gguf_info(path)


@pytest.mark.parametrize("arch, pooling, head, kind", [
    ("bert", 1, False, "embedding"),  # mean pooling: an embedding model
    ("bert", None, False, "embedding"),  # an encoder with no pooling key
    ("qwen3", 3, False, "embedding"),  # last-token pooling (Qwen3-Embedding)
    ("qwen3", 4, True, "rerank"),  # rank pooling (Qwen3-Reranker)
    ("bert", None, True, "rerank"),  # a classifier, no pooling key (bge-reranker converted)
    ("bert", 2, True, "rerank"),  # a classifier beside a CLS pooling key
    ("qwen3", None, False, "chat"),
])
def test_embedding_models_and_rerankers_are_told_apart(tmp_path, arch, pooling, head, kind):
    info = _pooled(tmp_path / "m.gguf", arch, pooling, head)
    assert (info.embedding, info.rerank) == (kind == "embedding", kind == "rerank")


def test_rank_pooling_without_a_head_is_refused(tmp_path):
    """A reranker converted before llama.cpp wrote its head (older Qwen3-Reranker GGUFs):
    llama.cpp would score each pair with the first number of a hidden state, no error."""
    with pytest.raises(InvalidModelFile, match="no classification head"):
        _pooled(tmp_path / "m.gguf", "qwen3", 4, False)


# ------------------------------------------------------------ crafted headers, byte by byte
_U32, _STR, _ARR = 4, 8, 9  # GGUF value types


def _kv(key: str, vtype: int, payload: bytes) -> bytes:
    raw = key.encode()
    return struct.pack("<Q", len(raw)) + raw + struct.pack("<I", vtype) + payload


def _string(text: str) -> bytes:
    return struct.pack("<Q", len(text.encode())) + text.encode()


def _crafted(path, kvs: list[bytes], dims: tuple[int, ...] = (64, 64)) -> None:
    """A GGUF header with these key-value pairs and one F32 tensor of these dimensions."""
    tensor = (_string("blk.0.attn_q.weight") + struct.pack("<I", len(dims))
              + struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", 0, 0))
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, len(kvs)) + b"".join(kvs) + tensor
                     + bytes(64 * 64 * 4 + 32))


_ARCH = _kv("general.architecture", _STR, _string("llama"))
_NESTED = struct.pack("<IQ", _ARR, 1) * 50_000 + struct.pack("<IQ", _U32, 0)
CRAFTED = {
    "alignment 0": ([_ARCH, _kv("general.alignment", _U32, struct.pack("<I", 0))], (64, 64),
                    "not a power of two"),
    "alignment an array": ([_ARCH, _kv("general.alignment", _ARR, struct.pack("<IQI", _U32, 1, 32))],
                           (64, 64), "not a power of two"),
    "block count a string": ([_ARCH, _kv("llama.block_count", _STR, _string("thirty"))], (64, 64),
                             "llama.block_count is 'thirty', not a count"),
    "head count a mixed list": ([_ARCH, _kv("llama.attention.head_count", _ARR,
                                            struct.pack("<IQ", _STR, 2) + _string("8") + _string("x"))],
                                (64, 64), "not a count"),
    "50,000 nested arrays": ([_ARCH, _kv("x.nested", _ARR, _NESTED)], (64, 64), "nest more than 4"),
    "200,000 dimensions": ([_ARCH], (2**64 - 1,) * 200_000, "200,000 dimensions"),
    "2^64 elements": ([_ARCH], (2**32, 2**32, 2**32), "more than 2\\^63 elements"),
}


@pytest.mark.parametrize("case", CRAFTED)
def test_a_crafted_header_is_one_clear_error(tmp_path, case):
    """Each of these once escaped as a raw ZeroDivisionError, TypeError, RecursionError or a
    minute of big-integer arithmetic — and broke the model listing of the whole server."""
    kvs, dims, message = CRAFTED[case]
    path = tmp_path / "crafted.gguf"
    _crafted(path, kvs, dims)
    with pytest.raises(InvalidModelFile, match=message):
        read_gguf_info(path)


def test_the_crafting_makes_a_readable_file_when_nothing_is_wrong(tmp_path):
    path = tmp_path / "fine.gguf"
    _crafted(path, [_ARCH, _kv("llama.block_count", _U32, struct.pack("<I", 2))])
    info = read_gguf_info(path)
    assert (info.architecture, info.n_layer, info.n_params) == ("llama", 2, 64 * 64)
