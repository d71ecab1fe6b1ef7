"""Images in: a vision model's projector (an mmproj GGUF, through llama.cpp's libmtmd) turns a
picture into embeddings the text model reads in its place.

In a prompt an image is a run of placeholder ids, one per embedding it becomes: the same
negative id throughout, drawn from the picture's digest. So the engine's cache treats the
same picture as the same tokens (a second question about it is a cached prefix), and no
placeholder is ever a vocabulary id. The prompt's `Pictures` keep each image's encoded chunk
by that id; the engine reads a run by `Projector.read`: the encoder's embeddings, decoded into
the slot's sequence in one batch of their own (a batch holds tokens or embeddings, not both).

Each image goes where its message's text has the projector's marker: a per-process random
string, so no text a client writes can stand for an image. libmtmd adds the family's own
wrapping tokens (Gemma 3's <start_of_image> … <end_of_image>).
"""

from __future__ import annotations

import ctypes
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

import numpy

from localinfer.backends.base import Image
from localinfer.backends.native.model import NativeModel
from localinfer.errors import EngineError, InvalidRequest, ModelLoadFailed

__all__ = ["Pictures", "Projector"]

log = logging.getLogger("localinfer.vision")


class Pictures:
    """A prompt's images, tokenized chunks by placeholder id, and their embeddings once the
    encoder has made them; freed with the request. An encode under way holds the chunks: a
    close meanwhile frees them when it is done."""

    def __init__(self) -> None:
        self.chunks: dict[int, int] = {}  # placeholder → mtmd_input_chunk (a copy we own)
        self.sizes: dict[int, int] = {}  # placeholder → embeddings it becomes
        # placeholder → positions they take (fewer than the embeddings with M-RoPE)
        self.positions: dict[int, int] = {}
        self.encoding: dict[int, Future] = {}  # placeholder → its encode (Projector.encode)
        self._lock = threading.Lock()
        self._held = 0
        self._closed = False

    def hold(self) -> bool:
        """(The encoder's thread.) Keep the chunks while one is encoded; False once closed."""
        with self._lock:
            if self._closed:
                return False
            self._held += 1
            return True

    def release(self) -> None:
        with self._lock:
            self._held -= 1
            free = self._closed and not self._held
        if free:
            self._free()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            free = not self._held
        for future in self.encoding.values():
            future.cancel()  # (one not started yet never starts)
        if free:
            self._free()

    def _free(self) -> None:
        from llama_cpp import mtmd_cpp

        for chunk in self.chunks.values():
            mtmd_cpp.mtmd_input_chunk_free(chunk)
        self.chunks.clear()


class _EncoderThreads:
    """Encodes one at a time, each on a thread of its own that ends with it.

    llama.cpp's CPU threads are an OpenMP team per calling thread, and libgomp keeps a
    thread's team until that thread exits. While the threads of all teams outnumber the
    CPUs, every barrier of every team sleeps instead of spinning: a thread kept for images
    left its team behind, and the engine decoded text 11-22% slower for the rest of the
    runner's life after one image (2 cores; ~98 sleeps a token against 2). Its team now
    goes with the thread, once the image is read."""

    def __init__(self) -> None:
        self._one = threading.Lock()  # (libmtmd keeps one output)
        self._closed = False
        self._threads: set[threading.Thread] = set()
        self._guard = threading.Lock()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()

        def run() -> None:
            try:
                with self._one:
                    if self._closed or not future.set_running_or_notify_cancel():
                        future.cancel()
                        return
                    try:
                        future.set_result(fn(*args))
                    except BaseException as exc:  # (the engine reads it from the future)
                        future.set_exception(exc)
            finally:
                with self._guard:
                    self._threads.discard(threading.current_thread())

        thread = threading.Thread(target=run, name="image-encoder", daemon=True)
        with self._guard:
            if self._closed:
                future.cancel()
                return future
            self._threads.add(thread)
        thread.start()
        return future

    def shutdown(self) -> None:
        """No new encode starts; the one under way ends first."""
        with self._guard:
            self._closed = True
            threads = list(self._threads)
        for thread in threads:
            thread.join()


class Projector:
    """An mmproj file loaded beside its text model (its width must be the model's)."""

    def __init__(self, path: str, native: NativeModel, n_threads: int, use_gpu: bool):
        from llama_cpp import mtmd_cpp

        from localinfer.backends.native.ggml import route_mtmd_log

        route_mtmd_log()  # (its loader writes every tensor to stderr otherwise)
        self._m = mtmd_cpp
        self.native = native
        self.marker = f"<__image_{secrets.token_hex(8)}__>"
        params = mtmd_cpp.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = n_threads
        params.print_timings = False
        params.media_marker = self.marker.encode()
        self.ctx = mtmd_cpp.mtmd_init_from_file(path.encode(), native.model, params)
        if not self.ctx:
            raise ModelLoadFailed(f"the projector {path} does not load with this model (a "
                                  f"projector of another model, or of another width?) — pull "
                                  f"the model again, or run it without images")
        if not mtmd_cpp.mtmd_support_vision(self.ctx):
            self.close()
            raise ModelLoadFailed(f"{path} is not a vision projector")
        # Qwen2/2.5/3-VL's: an image's tokens take positions in two dimensions (M-RoPE)
        self.mrope = bool(mtmd_cpp.mtmd_decode_use_mrope(self.ctx))
        self.n_embd = native.n_embd_inp()  # what one image token's embedding row holds
        self._encoder = _EncoderThreads()

    # ------------------------------------------------------------ a request's thread
    def tokens(self, images: Iterator[Image], pictures: Pictures) -> list[int]:
        """One image where the marker stood: the family's wrapping tokens around its run of
        placeholders (its chunk kept in `pictures`)."""
        image = next(images, None)
        if image is None:
            raise InvalidRequest("the messages name more images than were sent")
        m = self._m
        data = (ctypes.c_uint8 * len(image.rgb)).from_buffer_copy(image.rgb)
        bitmap = m.mtmd_bitmap_init(image.width, image.height, data)
        chunks = m.mtmd_input_chunks_init()
        try:
            text = self.marker.encode()
            spec = m.mtmd_input_text(text, len(text), False, True)
            bitmaps = (m.mtmd_bitmap_p_ctypes * 1)(bitmap)
            if m.mtmd_tokenize(self.ctx, chunks, ctypes.byref(spec), bitmaps, 1) != 0:
                raise InvalidRequest("this model's projector could not read an image")
            out: list[int] = []
            for i in range(m.mtmd_input_chunks_size(chunks)):
                chunk = m.mtmd_input_chunks_get(chunks, i)
                if m.mtmd_input_chunk_get_type(chunk) == m.MTMD_INPUT_CHUNK_TYPE_TEXT:
                    n = ctypes.c_size_t()
                    ids = m.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                    out += ids[:n.value]
                elif m.mtmd_input_chunk_get_type(chunk) == m.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                    size = m.mtmd_input_chunk_get_n_tokens(chunk)
                    place = image.placeholder
                    if place not in pictures.chunks:
                        pictures.chunks[place] = m.mtmd_input_chunk_copy(chunk)
                        pictures.sizes[place] = size
                        pictures.positions[place] = m.mtmd_input_chunk_get_n_pos(chunk)
                    out += [place] * size
                else:
                    raise InvalidRequest("this model's projector takes images only")
            return out
        finally:
            m.mtmd_input_chunks_free(chunks)
            m.mtmd_bitmap_free(bitmap)

    # ------------------------------------------------------------ the engine's thread
    def encode(self, pictures: Pictures, place: int, n_ubatch: int,
               done: Callable[[], None]) -> Future:
        """Start encoding an image on the encoder's own thread (one image at a time: libmtmd
        keeps one output), while the engine goes on decoding the other streams. Its result:
        the image's embeddings, a copy. `done` is called when it ends (it wakes the engine)."""
        chunk = pictures.chunks[place]
        n = self._m.mtmd_input_chunk_get_n_tokens(chunk)
        if self._m.mtmd_decode_use_non_causal(self.ctx, chunk) and n > n_ubatch:
            # (llama.cpp would abort the process on a non-causal decode past its micro-batch)
            raise InvalidRequest(f"an image of {n} tokens is more than one batch holds "
                                 f"({n_ubatch}) — load the model with a larger batch")
        future = self._encoder.submit(self._encode, pictures, chunk, n)
        future.add_done_callback(lambda _: done())
        pictures.encoding[place] = future
        return future

    def _encode(self, pictures: Pictures, chunk: int, n: int) -> numpy.ndarray:
        if not pictures.hold():
            raise EngineError("the request ended before its image was read")
        try:
            started = time.perf_counter()
            if self._m.mtmd_encode_chunk(self.ctx, chunk) != 0:
                raise EngineError("the projector failed to encode an image")
            log.debug("image of %d tokens encoded in %.3f s", n, time.perf_counter() - started)
            return numpy.ctypeslib.as_array(self._m.mtmd_get_output_embd(self.ctx),
                                            shape=(n * self.n_embd,)).copy()
        finally:
            pictures.release()

    def decode(self, pictures: Pictures, place: int, embd: numpy.ndarray, seq: int,
               start: int, n_batch: int) -> None:
        """An encoded image's embeddings into sequence `seq` from position `start`: one
        llama_decode of embeddings at positions [start, start + its size), attention within
        the image both ways where the family's is (Gemma 3); with M-RoPE (Qwen-VL), at its
        positions in two dimensions, `n_batch` a decode."""
        chunk = pictures.chunks[place]
        if self.mrope:
            rc = self.native.decode_embeddings_mrope(embd, seq, self._positions(chunk, start),
                                                     n_batch)
        else:
            non_causal = self._m.mtmd_decode_use_non_causal(self.ctx, chunk)
            rc = self.native.decode_embeddings(embd, seq, start, causal=not non_causal)
        if rc != 0:
            raise EngineError(f"llama_decode of an image returned {rc}")

    def _positions(self, chunk: int, start: int) -> numpy.ndarray:
        """An M-RoPE image's positions from `start`: four rows (time, row, column, unused),
        one value per token, as libmtmd gives them."""
        m = self._m
        tokens = m.mtmd_input_chunk_get_tokens_image(chunk)
        n = m.mtmd_input_chunk_get_n_tokens(chunk)
        out = numpy.empty((4, n), numpy.int32)
        for i in range(n):
            at = m.mtmd_image_tokens_get_decoder_pos(tokens, start, i)
            out[:, i] = at.t, at.y, at.x, at.z
        return out

    def close(self) -> None:
        self._encoder.shutdown()
        if self.ctx:
            self._m.mtmd_free(self.ctx)
            self.ctx = None


def with_markers(messages: Iterable[dict], marker: str) -> list[dict]:
    """Messages whose content is a list of parts (text, image) as text, with the marker where
    each image goes; others as they are."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(marker if part.get("type") == "image" else part.get("text", "")
                              for part in content)
            message = {**message, "content": content}
        out.append(message)
    return out


def count_images(messages: Sequence[dict]) -> int:
    return sum(1 for m in messages if isinstance(m.get("content"), list)
               for part in m["content"] if part.get("type") == "image")
