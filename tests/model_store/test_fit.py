from __future__ import annotations

import pytest

from localinfer.errors import ContextTooLarge
from localinfer.model_store.fit import check_context, estimate_memory, max_context
from localinfer.model_store.gguf_info import read_gguf_info

GIB = 2**30


@pytest.fixture(scope="module")
def info(smollm2_path):
    return read_gguf_info(smollm2_path)


def test_estimate_adds_weights_kv_and_buffers(info):
    e = estimate_memory(info, n_ctx=4096, n_slots=2)
    assert e.weights == info.file_size
    assert e.kv_cache == 30 * 3 * (64 + 64) * 2 * 4096 * 2  # layers × kv heads × (K+V dims) × f16
    assert e.outputs == 16 * 49152 * 4  # the default 16 rows of logits, f32
    assert e.total == e.weights + e.kv_cache + e.compute + e.outputs


def test_context_beyond_training_length_is_refused(info):
    with pytest.raises(ContextTooLarge, match="more than the 8192 'smollm2:135m' was trained for"):
        check_context(info, 16384, 1, available=64 * GIB, name="smollm2:135m")


def test_context_beyond_memory_is_refused_with_a_context_that_fits(info):
    available = info.file_size + 200 * 2**20
    with pytest.raises(ContextTooLarge, match=r"GiB is available — use --ctx (\d+) or less") as err:
        check_context(info, 8192, 1, available=available)
    suggested = int(str(err.value).rsplit("--ctx ", 1)[1].split()[0])
    assert 0 < suggested < 8192
    check_context(info, suggested, 1, available=available)  # the suggestion really fits
    with pytest.raises(ContextTooLarge):
        check_context(info, suggested + 64, 1, available=available)


def test_nothing_fits_in_too_little_memory(info):
    assert max_context(info, available=info.file_size // 2) == 0
    with pytest.raises(ContextTooLarge, match="pick a smaller model"):
        check_context(info, 512, 1, available=info.file_size // 2)


@pytest.mark.parametrize("flash_attn", [None, False])
@pytest.mark.parametrize("model,n_ctx,n_slots", [("smollm2_path", 2048, 1),
                                                  ("smollm2_path", 1024, 4),
                                                  ("gemma3_path", 2048, 1),
                                                  ("gemma3_path", 8192, 1)])
def test_estimate_agrees_with_the_buffers_llama_cpp_allocates(model, n_ctx, n_slots, flash_attn,
                                                              request, caplog):
    """Weights + KV + compute + output, against llama.cpp's own report after loading: within
    10%; the compute buffer alone, reserved for the logits a step may ask for (and without
    flash attention a layer's attention scores), never under; the output buffer, a row of
    logits a slot, to the row."""
    import logging
    import re

    from localinfer.backends.base import LoadOptions
    from localinfer.backends.llamacpp import LlamaCppBackend

    path = request.getfixturevalue(model)
    caplog.set_level(logging.INFO, logger="localinfer.llama_cpp")
    options = LoadOptions(n_ctx=n_ctx, n_slots=n_slots, flash_attn=flash_attn)
    with LlamaCppBackend(path, options):
        pass
    pattern = r"^(?!~).*(?:model|KV|compute|output) buffer size =\s+([\d.]+) MiB"
    reported = sum(float(m) for m in re.findall(pattern, caplog.text, re.M)) * 2**20
    compute = float(re.search(r"compute buffer size =\s+([\d.]+) MiB", caplog.text)[1]) * 2**20
    estimate = estimate_memory(read_gguf_info(path), n_ctx, n_slots,
                               n_outputs=options.n_outputs, flash_attn=flash_attn is None)
    assert reported == pytest.approx(estimate.total, rel=0.10)
    assert compute <= estimate.compute <= 1.5 * compute
    # the output buffer, reserved for a row of logits a slot (the log's 2 decimals)
    output = float(re.search(r"output buffer size =\s+([\d.]+) MiB", caplog.text)[1]) * 2**20
    assert output == pytest.approx(estimate.outputs, abs=0.006 * 2**20)
    assert estimate.outputs == n_slots * read_gguf_info(path).n_vocab * 4


def test_the_compute_buffer_holds_the_logits_a_step_asks_for(gemma3_path):
    """gemma3's 262k vocabulary: 1 MiB of logits per output. llama.cpp would reserve 512 of
    them (514 MiB); one slot asks for one, a lone stream with 8 guesses for nine."""
    from localinfer.backends.base import LoadOptions

    info = read_gguf_info(gemma3_path)
    one = estimate_memory(info, 2048, n_outputs=LoadOptions().n_outputs).compute
    guessing = estimate_memory(info, 2048, n_outputs=LoadOptions(draft_tokens=8).n_outputs)
    many = estimate_memory(info, 2048, n_outputs=512).compute
    assert one < 32 * 2**20 < many
    assert guessing.compute == one  # nine logits fit where the activations already are
    assert estimate_memory(info, 2048, n_outputs=64).compute > 64 * 2**20


_MEASURE = """
import json, sys, psutil
from localinfer.backends.base import LoadOptions, SamplingParams
from localinfer.backends.llamacpp import LlamaCppBackend
path, n_ctx = sys.argv[1], int(sys.argv[2])
before = psutil.Process().memory_info().rss
backend = LlamaCppBackend(path, LoadOptions(n_ctx=n_ctx))
backend.generate(backend.tokenize("hello " * 600), SamplingParams(temperature=0, max_tokens=4)).text()
print(json.dumps(psutil.Process().memory_info().rss - before))
"""


@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2_path", "gemma3_path"])
@pytest.mark.parametrize("n_ctx", [2048, 8192])
def test_resident_estimate_agrees_with_measured_memory_growth(model, n_ctx, request):
    """A fresh process loads the model and prefills a full chunk; its RSS growth is the truth."""
    import json
    import subprocess
    import sys

    path = request.getfixturevalue(model)
    out = subprocess.run([sys.executable, "-c", _MEASURE, str(path), str(n_ctx)],
                         capture_output=True, text=True, timeout=120, check=True)
    grown = json.loads(out.stdout.strip().splitlines()[-1])
    estimate = estimate_memory(read_gguf_info(path), n_ctx, 1)
    assert grown == pytest.approx(estimate.resident, rel=0.10)
