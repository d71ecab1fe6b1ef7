"""A projector's refusals in the engine itself (the dialects' side: tests/api/test_vision.py):
one of another model's width is refused at load with one line, and an image that one
llama.cpp batch cannot hold ends its own request, not the process (llama.cpp aborts on a
non-causal decode longer than its micro-batch) — the model goes on serving."""

from __future__ import annotations

import pytest

from localinfer.backends.base import LoadOptions, SamplingParams
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.backends.vision import Image
from localinfer.errors import InvalidRequest, ModelLoadFailed

from ..families import projector

GREEDY = SamplingParams(temperature=0, max_tokens=3)
PICTURE = Image(bytes(range(256)) * (96 * 96 * 3 // 256), 96, 96)


def _asking(*parts: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image"} if p == "image"
                                         else {"type": "text", "text": p} for p in parts]}]


def test_a_projector_of_another_width_is_refused_at_load(gemma3_path, smollm2_path):
    wrong = projector(smollm2_path)  # 576 wide; Gemma 3 270M is 640
    with pytest.raises(ModelLoadFailed, match="does not load with this model"):
        LlamaCppBackend(gemma3_path, LoadOptions(n_ctx=512, projector=str(wrong)))


def test_an_image_larger_than_a_batch_ends_only_its_request(gemma3_path):
    backend = LlamaCppBackend(gemma3_path, LoadOptions(n_ctx=512, n_batch=32,
                                                       projector=str(projector(gemma3_path))))
    try:
        tokens, generation = backend.start(GREEDY, _asking("image", "What is it?"),
                                           images=[PICTURE])
        assert sum(1 for t in tokens if t < 0) == 64  # its placeholders, 64 > 32
        with pytest.raises(InvalidRequest, match="more than one batch holds"):
            generation.text()
        assert backend.generate(backend.tokenize("Still here?"), GREEDY).text()
        with pytest.raises(InvalidRequest, match="each image must have its place"):
            backend.start(GREEDY, _asking("image", "image", "Two?"), images=[PICTURE])
    finally:
        backend.close()


@pytest.mark.parametrize("shape", [
    (64,),  # the tests' narrow tower at 224 px
    (256, "--image-size", "896"),  # the narrow tower at Gemma 3's size: the first step peaks
    (64, "--image-size", "448", "--gemma3", "--layers", "2"),  # Gemma 3's widths: a block peaks
    # (as much for 6 blocks: the buffer holds one block's activations at a time)
])
def test_the_planner_counts_a_projector_as_libmtmd_reserves_it(gemma3_path, caplog, shape):
    """projector_memory (what `prepare` and `show` keep free for a vision model's projector)
    against the compute buffer libmtmd reports as it loads, and the weights it reads."""
    import logging
    import re

    from localinfer.model_store.fit import projector_memory
    from localinfer.model_store.gguf_info import read_projector_info

    path = projector(gemma3_path, *shape)
    caplog.set_level(logging.INFO, logger="localinfer.llama_cpp")
    LlamaCppBackend(gemma3_path, LoadOptions(n_ctx=256, projector=str(path))).close()
    reserved = re.findall(r"compute buffer size = +([\d.]+) MiB", "\n".join(
        r.getMessage() for r in caplog.records if "compute_meta" in r.getMessage()))
    assert reserved, "libmtmd did not report its compute buffer"
    info = read_projector_info(path)
    planned = (projector_memory(info) - info.file_size) / 2**20
    assert planned == pytest.approx(float(reserved[-1]), abs=0.01)
