"""A projector's refusals in the engine itself (the dialects' side: tests/api/test_vision.py):
one of another model's width is refused at load with one line, and an image that one
llama.cpp batch cannot hold ends its own request, not the process (llama.cpp aborts on a
non-causal decode longer than its micro-batch) — the model goes on serving."""

from __future__ import annotations

import llama_cpp
import numpy
import pytest

from localinfer.backends.base import LoadOptions, SamplingParams, TokenEvent
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.backends.base import Image
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


@pytest.fixture(scope="module")
def slow_eye(gemma3_path):
    """Gemma 3 270M with a projector of Gemma 3's own widths at 896 px (two of its blocks):
    an image takes seconds to encode here, long enough to see what a stream does meanwhile."""
    path = projector(gemma3_path, 256, "--image-size", "896", "--gemma3", "--layers", "2")
    backend = LlamaCppBackend(gemma3_path, LoadOptions(n_ctx=2048, n_slots=2,
                                                       projector=str(path)))
    yield backend
    backend.close()


def _tokens_while_an_image_is_read(backend) -> tuple[int, int]:
    """A stream's tokens while another request's image is encoded and read; and how many
    prompt tokens that request had."""
    import threading
    import time

    stream = backend.generate(backend.tokenize("Count to a thousand:"),
                              SamplingParams(temperature=0, max_tokens=4000, ignore_eos=True))
    times: list[float] = []
    reader = threading.Thread(target=lambda: times.extend(
        time.perf_counter() for event in stream if isinstance(event, TokenEvent)))
    reader.start()
    deadline = time.monotonic() + 60
    while len(times) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(times) >= 3, "the stream did not start"
    picture = Image(bytes(range(256)) * (640 * 480 * 3 // 256), 640, 480)
    sent = time.perf_counter()
    tokens, generation = backend.start(SamplingParams(temperature=0, max_tokens=1),
                                       _asking("image", "What is it?"), images=[picture])
    generation.text()
    answered = time.perf_counter()
    stream.cancel()
    reader.join()
    return sum(sent < t < answered for t in times), len(tokens)


def test_streams_go_on_while_an_image_is_encoded(slow_eye):
    during, n_prompt = _tokens_while_an_image_is_read(slow_eye)
    assert n_prompt > 256
    slow_eye.engine.overlap_images = False
    try:
        waited, _ = _tokens_while_an_image_is_read(slow_eye)
    finally:
        slow_eye.engine.overlap_images = True
    # encoded on the projector's thread, the stream's steps went on (about 280 tokens here);
    # waited for, it stood still but while the request was tokenized (about 6)
    assert during > 4 * waited + 10, (during, waited)


def test_a_request_cancelled_while_its_image_is_encoded_frees_it(slow_eye):
    import time

    picture = Image(bytes(range(256)) * (320 * 240 * 3 // 256), 320, 240)
    _, generation = slow_eye.start(GREEDY, _asking("image", "What is it?"), images=[picture])
    time.sleep(0.3)  # (its encode under way)
    generation.cancel()
    assert generation.text() == "" and generation.stats.finish_reason == "cancelled"
    assert slow_eye.generate(slow_eye.tokenize("Still here?"), GREEDY).text()
    tokens, again = slow_eye.start(GREEDY, _asking("image", "And now?"), images=[picture])
    again.text()
    assert again.stats.finish_reason == "length" and again.stats.prompt_tokens == len(tokens)


@pytest.fixture(scope="module")
def qwen_vl():
    """A one-layer random Qwen2-VL (architecture qwen2vl: M-RoPE, MiMo-VL's template, Qwen's
    vocabulary with its vision marks) and a random Qwen2-VL projector (bench/random_mmproj.py
    --type qwen2vl): an image of 320x240 is 11x9 tokens over 11 positions."""
    import subprocess
    import sys

    from ..families import BENCH, CACHE, QWEN_VL_ADDED, family_model

    model = family_model("MiMo-VL", "qwen2", QWEN_VL_ADDED, arch="qwen2vl")
    mmproj = CACHE / "models" / "mmproj--qwen2vl--64.gguf"
    if not mmproj.exists():
        subprocess.run([sys.executable, str(BENCH / "random_mmproj.py"), str(mmproj),
                        "--type", "qwen2vl", "--n-embd", "64"], check=True, capture_output=True)
    backend = LlamaCppBackend(model, LoadOptions(n_ctx=1024, n_slots=2, n_batch=64,
                                                 projector=str(mmproj)))
    yield backend
    backend.close()


def _mrope_reference(backend, messages, picture) -> tuple[numpy.ndarray, int]:
    """The last token's logits as libmtmd's own helper reads the prompt (text, the image at
    its positions in two dimensions, text) into sequence 1; and the position after it."""
    import ctypes

    from llama_cpp import mtmd_cpp

    from localinfer.backends.native.vision import with_markers

    projector = backend.projector
    text = backend.apply_chat_template(with_markers(messages, projector.marker)).encode()
    pixels = (ctypes.c_uint8 * len(picture.rgb)).from_buffer_copy(picture.rgb)
    bitmap = mtmd_cpp.mtmd_bitmap_init(picture.width, picture.height, pixels)
    chunks = mtmd_cpp.mtmd_input_chunks_init()
    try:
        spec = mtmd_cpp.mtmd_input_text(text, len(text), True, True)
        assert mtmd_cpp.mtmd_tokenize(projector.ctx, chunks, ctypes.byref(spec),
                                      (mtmd_cpp.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) == 0
        after = llama_cpp.llama_pos(0)
        assert mtmd_cpp.mtmd_helper_eval_chunks(projector.ctx, backend.native.ctx, chunks, 0,
                                                1, 64, True, ctypes.byref(after)) == 0
        logits = numpy.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(backend.native.ctx, -1),
                                          shape=(backend.native.n_vocab,)).copy()
        return logits, after.value
    finally:
        mtmd_cpp.mtmd_input_chunks_free(chunks)
        mtmd_cpp.mtmd_bitmap_free(bitmap)
        backend.native.forget(1)


def test_an_m_rope_image_takes_its_positions_in_two_dimensions(qwen_vl):
    """Qwen-VL's image tokens share positions (rows x columns tokens over max(rows, columns)
    positions): the engine reads the prompt as libmtmd's helper does — the same logits for
    its last token, the text after the image at the position the helper gives it — and the
    same picture asked about again is cached."""
    picture = Image(bytes(range(256)) * (320 * 240 * 3 // 256), 320, 240)
    messages = _asking("image", "What is in this picture, in a word?")
    tokens, generation = qwen_vl.start(SamplingParams(temperature=0, max_tokens=1), messages,
                                       images=[picture])
    generation.text()
    logits = numpy.ctypeslib.as_array(qwen_vl.native.logits(),
                                      shape=(qwen_vl.native.n_vocab,)).copy()
    slot = max(qwen_vl.engine.slots, key=lambda s: len(s.cache))
    assert sum(1 for t in tokens if t < 0) == 99 and slot.deficit == 99 - 11
    expected, after = _mrope_reference(qwen_vl, messages, picture)
    assert slot.position(len(tokens)) == after  # the engine's next position is the helper's
    assert numpy.abs(logits - expected).max() < 1e-3 * numpy.abs(expected).max()

    again = qwen_vl.start(GREEDY, messages + [{"role": "assistant", "content": "A thing."},
                                              {"role": "user", "content": "And its colour?"}],
                          images=[picture])[1]
    again.text()
    assert again.stats.cached_tokens >= len(tokens) - 1
    text_only = qwen_vl.generate(qwen_vl.tokenize("Plain text after it"), GREEDY)
    assert text_only.text() is not None and text_only.stats.finish_reason == "length"


def _sleeps_a_token(backend) -> float:
    """Voluntary context switches of this process's threads per token of a text reply: how
    often llama.cpp's threads slept at a barrier instead of spinning (Linux's count)."""
    import os

    def switches() -> int:
        total = 0
        for task in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{task}/status") as status:
                    total += sum(int(line.split()[1]) for line in status
                                 if line.startswith("voluntary_ctxt_switches"))
            except OSError:  # (a thread that ended meanwhile)
                pass
        return total

    before = switches()
    generation = backend.generate(backend.tokenize("Tell me about the harbour at night."),
                                  SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
    n = sum(1 for event in generation if isinstance(event, TokenEvent))
    return (switches() - before) / max(n, 1)


def test_text_after_an_image_decodes_as_before_it(gemma3_path):
    """An image's encoder thread ends with its image, and its OpenMP team with it: kept, the
    two teams' threads outnumbered the cores and every barrier after slept (~98 sleeps a
    token against 2 here, and text 11-22% slower for the runner's life)."""
    import os

    cores = max(2, os.cpu_count() or 2)  # (two such teams outnumber the CPUs anywhere)
    backend = LlamaCppBackend(gemma3_path, LoadOptions(n_ctx=1024, n_threads=cores,
                                                       projector=str(projector(gemma3_path))))
    try:
        alone = min(_sleeps_a_token(backend) for _ in range(2))
        backend.start(GREEDY, _asking("image", "What is it?"), images=[PICTURE])[1].text()
        after = min(_sleeps_a_token(backend) for _ in range(2))
        assert after <= 3 * alone + 10, (alone, after)
    finally:
        backend.close()


def test_closing_the_encoder_waits_for_the_image_under_way_and_starts_no_other():
    """The projector's encoder threads (no model needed): close waits for the encode under
    way; one asked for after close never runs, its future cancelled."""
    import threading
    import time

    from localinfer.backends.native.vision import _EncoderThreads

    encoder, started, ran = _EncoderThreads(), threading.Event(), []

    def slow(n: int) -> int:
        started.set()
        time.sleep(0.3)
        ran.append(n)
        return n

    first = encoder.submit(slow, 1)
    assert started.wait(10)
    encoder.shutdown()  # (returns once the first has ended)
    assert first.done() and first.result() == 1 and ran == [1]
    late = encoder.submit(slow, 2)
    assert late.cancelled() and ran == [1]
    failing = _EncoderThreads().submit(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        failing.result(timeout=10)
