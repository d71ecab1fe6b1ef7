"""The llama.cpp implementation of `Backend`: a native model plus the batching engine."""

from __future__ import annotations

import dataclasses
import os
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any
from pathlib import Path

from localinfer.backends.base import Backend, Generation, Image, LoadOptions, ModelInfo, SamplingParams
from localinfer.chat_formats.detect import detect
from localinfer.chat_formats.template import ChatTemplate, fallback_template
from localinfer.backends.engine.draft import DraftModel
from localinfer.chat_formats.fim import infill_tokens
from localinfer.backends.native.embeddings import Embedder
from localinfer.backends.engine.scheduler import Engine
from localinfer.backends.native.model import NativeModel
from localinfer.backends.metrics import EngineStats
from localinfer.backends.native.rerank import Reranker
from localinfer.backends.engine.threads import (CoreShare, ThreadTuner, free_cores, open_share,
                                                physical_cores)
from localinfer.backends.native.vision import Pictures, Projector, count_images, with_markers
from localinfer.errors import InvalidRequest, ModelLoadFailed, PromptTooLong
from localinfer.model_store.gguf_info import quant_name, read_gguf_info
from localinfer.model_store.hardware import SERVER_PID, ram_available
from localinfer.model_store.planner import pooled_bytes, reserved_outputs
from localinfer.model_store.shape import POOLED_EMBED_CTX, POOLED_UBATCH
from localinfer.settings import default

__all__ = ["LlamaCppBackend", "default_threads"]

_MARK = re.compile("\ue000(\\d+)\ue001")  # where a message's own text goes


@dataclass
class _Images:
    """A request's images on their way into its prompt: those not yet placed, in order, and
    the chunks of those that are."""

    left: Iterator[Image]
    pictures: Pictures


def default_threads() -> int:
    """The physical cores other processes leave free (hyper-threads only add contention); in a
    runner, its server (or command) is not one of them."""
    server = os.environ.get(SERVER_PID, "")
    ours = [int(server)] if server.isdigit() and int(server) == os.getppid() else []
    return free_cores(ours=ours)  # (a variable inherited further down names no parent)


class LlamaCppBackend(Backend):
    def __init__(self, path: str | os.PathLike[str], options: LoadOptions, name: str | None = None):
        path = str(path)
        n_ctx = options.n_ctx or default("ctx")
        n_threads = options.n_threads or default_threads()
        split, main_gpu, n_local = options.tensor_split, options.main_gpu, 0
        if options.workers:  # their devices join llama.cpp's before it places the layers
            from localinfer.backends.native.ggml import devices
            from localinfer.model_store.hardware import gpu_count
            from localinfer.backends.rpc.library import join, llama_order

            n_local = gpu_count(devices())
            split, main_gpu = llama_order(split, main_gpu, n_local,
                                          join(options.workers, options.worker_key,
                                               options.worker_head))
        # a CPU head keeps the output layer: one hidden state crosses the network each token,
        # not the logits (a GPU head's last device is its own GPU, where llama.cpp puts it)
        output_on_cpu = bool(options.workers) and not n_local
        self.native = NativeModel(
            path,
            n_ctx_total=n_ctx * options.n_slots,
            n_slots=options.n_slots,
            n_batch=options.n_batch,
            n_threads=n_threads,
            n_gpu_layers=options.n_gpu_layers or 0,
            kv_type=options.kv_type,
            flash_attn=options.flash_attn,
            kv_unified=options.kv_unified,
            n_outputs=reserved_outputs(options.n_outputs, options.flash_attn is not False),
            split_mode=options.split_mode,
            main_gpu=main_gpu,
            tensor_split=split,
            output_on_cpu=output_on_cpu,
            rollback=options.guesses,  # (a hybrid's rejected guesses are rolled back)
            cpu_experts=options.cpu_experts,
            swa_full=options.swa_full,
        )
        architecture = self.native.meta("general.architecture") or "unknown"
        self.template = ChatTemplate(
            self._template_source() or fallback_template(architecture),
            bos_token=self.native.token_text(self.native.bos()),
            eos_token=self.native.token_text(self.native.eos()),
        )
        for marker in detect(self.template.source).preserved:
            self.native.preserve(marker)
        # what the first request asks of every token, asked now (after `preserve`, which
        # changes the pieces)
        self.native.learn_vocabulary()
        n_batch = min(options.n_batch, self.native.n_batch())  # more would abort the process
        self.projector = None
        if options.projector:  # on the GPU where the model's layers are
            try:
                self.projector = Projector(options.projector, self.native, n_threads,
                                           use_gpu=bool(options.n_gpu_layers))
            except Exception:
                self.native.close()
                raise
        drafter = None
        if options.draft_model:
            try:
                # small next to the model: all on the GPU whenever the model uses one
                drafter = DraftModel(options.draft_model, self.native,
                                     n_ctx=n_ctx * (options.n_slots if options.kv_unified else 1),
                                     n_batch=n_batch, n_threads=n_threads,
                                     n_gpu_layers=999 if options.n_gpu_layers and not
                                     options.workers else 0,
                                     main_gpu=options.main_gpu)
            except Exception:
                if self.projector:
                    self.projector.close()
                self.native.close()
                raise
        self.engine = Engine(self.native, n_slots=options.n_slots, n_batch=n_batch,
                             prefill_chunk=options.prefill_chunk,
                             step_budget=options.step_budget, step_ms=options.step_ms,
                             draft_tokens=options.guesses,
                             unified=options.kv_unified, drafter=drafter,
                             reply_cap=options.reply_cap,
                             cache_reuse=options.cache_reuse,
                             ctx_checkpoints=options.ctx_checkpoints,
                             checkpoint_bytes=None if options.ctx_checkpoint_mib is None
                             else options.ctx_checkpoint_mib << 20,
                             cache_ram=options.cache_ram << 20,
                             projector=self.projector,
                             # a count the user chose stays; ours follows the machine's load
                             threads=None if options.n_threads else ThreadTuner(
                                 n_threads, physical_cores(),
                                 share=self._core_share(options)))
        # their decodes on the engine's thread: one thread of the process calls llama_decode
        tuner = self.engine.threads  # pooled decodes read whole inputs, as prompt steps do
        pooled_threads = n_threads if tuner is None else tuner.for_pooled
        self.embedder = Embedder(self.native, n_ctx=min(self.engine.n_ctx_slot, POOLED_EMBED_CTX),
                                 n_threads=pooled_threads, run=self.engine.call,
                                 before_made=partial(self._room_to_embed, path, options))
        # (a pair read at once: the context a request gets)
        self.reranker = Reranker(self.native, n_ctx=self.engine.n_ctx_slot,
                                 n_threads=pooled_threads, run=self.engine.call)
        self.info = ModelInfo(
            name=name or Path(path).stem,
            path=path,
            architecture=architecture,
            quant=self._quant(),
            n_ctx=self.engine.n_ctx_slot,
            n_ctx_train=self.native.n_ctx_train(),
            n_slots=options.n_slots,
            n_params=self.native.n_params(),
            size_bytes=self.native.size_bytes(),
            has_chat_template=self._template_source() is not None,
            reply_cap=self.engine.reply_cap,
            chat_template=self.template.source,
            fim=self.native.fim().complete,
            vision=self.projector is not None,
        )
        try:  # what a first decode costs beyond the next, paid by the load, not the first
            # request's TTFT, on the engine's thread: the one that calls llama_decode (a team of
            # OpenMP threads each thread that decodes keeps; two make each other's barriers sleep)
            self.engine.call(self._warm_up)
        except Exception:
            self.close()
            raise

    def _warm_up(self) -> None:
        self.native.warm_up()
        if self.engine.speculator.drafter is not None:
            self.engine.speculator.drafter.native.warm_up()  # (its first guesses, as fast)

    def _quant(self) -> str:
        file_type = self.native.meta("general.file_type")
        return quant_name(int(file_type)) if file_type and file_type.isdigit() else "unknown"

    def _template_source(self) -> str | None:
        return self.native.chat_template()

    def fewest_tokens(self, text_bytes: int) -> int:
        # halved: a tokenizer's normalisation may shorten a text before it is split
        return text_bytes // self.native.longest_piece() // 2

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        # a template that writes the BOS itself must not get a second one
        if add_special and self.template.bos_token and text.startswith(self.template.bos_token):
            add_special = False
        return self.native.tokenize(text, add_special=add_special, parse_special=True)

    def prompt_tokens(self, messages: Sequence[Mapping[str, Any]],
                      template_args: Mapping[str, Any] | None = None,
                      images: Sequence[Image] = ()) -> list[int]:
        if not images:
            return self._prompt_tokens(messages, template_args, None)
        given = self._given(messages, images)
        try:  # (an image's tokens are placeholders: what it costs, not what it holds)
            return self._prompt_tokens(messages, template_args, given)
        finally:
            given.pictures.close()

    def _given(self, messages: Sequence[Mapping[str, Any]] | None, images: Sequence[Image]
               ) -> _Images:
        if self.projector is None:
            raise InvalidRequest(f"{self.info.name} takes no images — send text only, or use "
                                 f"a vision model")
        if messages is None or count_images(messages) != len(images):
            raise InvalidRequest("each image must have its place in a message")
        return _Images(iter(images), Pictures())

    def _prompt_tokens(self, messages: Sequence[Mapping[str, Any]],
                       template_args: Mapping[str, Any] | None, images: _Images | None
                       ) -> list[int]:
        """The messages in the chat template, as tokens. What a message says stays text: a
        typed `<|im_end|>` is not the control token, so no one can forge a turn or a role.
        Only the template writes control tokens. With `images`, each image part of a message
        becomes the image's tokens (vision.py)."""
        if images is not None:
            messages = with_markers(messages, self.projector.marker)
        typed = [i for i, m in enumerate(messages) if self._holds_control(m.get("content"))]
        if not typed:
            return self._tokens(self.apply_chat_template(messages, True, template_args), True,
                                True, images)
        marked = [{**m, "content": f"\ue000{i}\ue001"} if i in typed else m
                  for i, m in enumerate(messages)]
        text = self.apply_chat_template(marked, True, template_args)
        tokens: list[int] = []
        at, seen = 0, set()
        for mark in _MARK.finditer(text):  # the template's text, then the message's, in turn
            i = int(mark.group(1))
            tokens += self._tokens(text[at:mark.start()], not tokens and not at, True, images)
            tokens += self._tokens(messages[i]["content"], False, False, images)
            at = mark.end()
            seen.add(i)
        if seen != set(typed):
            raise InvalidRequest("a message holds text that this model reads as a control "
                                 "token, and its chat template changes messages as it writes "
                                 "them, so the two cannot be kept apart — remove it")
        return tokens + self._tokens(text[at:], not tokens, True, images)

    def _tokens(self, text: str, add_special: bool, parse_special: bool,
                images: _Images | None) -> list[int]:
        """Text as tokens; with `images`, each of the projector's markers in it as the next
        image's tokens."""
        if images is None:
            if parse_special:
                return self.tokenize(text, add_special=add_special)
            return self.native.tokenize(text, add_special=add_special, parse_special=False)
        pieces = text.split(self.projector.marker)
        tokens = self._tokens(pieces[0], add_special, parse_special, None)
        for piece in pieces[1:]:
            tokens += self.projector.tokens(images.left, images.pictures)
            tokens += self._tokens(piece, False, parse_special, None)
        return tokens

    def start(self, params: SamplingParams, messages: Sequence[Mapping[str, Any]] | None = None,
              prompt: str | Sequence[int] | None = None,
              template_args: Mapping[str, Any] | None = None,
              images: Sequence[Image] = ()) -> tuple[list[int], Generation]:
        if not images:
            return super().start(params, messages, prompt, template_args)
        given = self._given(messages, images)
        try:
            tokens = self._prompt_tokens(messages, template_args, given)
        except BaseException:
            given.pictures.close()
            raise
        return tokens, self.engine.submit(tokens, params, given.pictures)

    def _holds_control(self, content: object) -> bool:
        if not isinstance(content, str) or not self.native.control_heads().intersection(content):
            return False
        return (self.native.tokenize(content, add_special=False, parse_special=True)
                != self.native.tokenize(content, add_special=False, parse_special=False))

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.native.detokenize(tokens)

    def infill_tokens(self, prefix: str, suffix: str, extra: Sequence[tuple[str, str]] = (),
                      prompt: str = "", room: int | None = None) -> list[int]:
        return infill_tokens(self.native, self.native.fim(), prefix, suffix, extra, prompt,
                             room or self.engine.n_ctx_slot, self.native.adds_bos())

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True,
        template_args: Mapping[str, Any] | None = None,
    ) -> str:
        return self.template.render(messages, add_generation_prompt, template_args)

    def generate(self, prompt: str | Sequence[int], params: SamplingParams) -> Generation:
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        return self.engine.submit(tokens, params)

    def _core_share(self, options: LoadOptions) -> CoreShare | None:
        """The machine's core share, where this model's layers run on the CPU (a model whose
        every layer is on a GPU neither waits for cores nor holds them)."""
        on_gpu = ((options.n_gpu_layers or 0) > self.native.n_layer()  # (and its output layer)
                  and not options.cpu_experts)  # (a mixture's experts in RAM run on the CPU)
        return None if on_gpu or not options.core_share else open_share(physical_cores())

    def _room_to_embed(self, path: str, options: LoadOptions) -> None:
        """A chat model's embedding context, which its plan did not count (an embedding
        model's it does: model_store.planner.pooled_bytes), is made only where the RAM it
        takes is free: all of it on a CPU, its output rows where the layers are on a GPU
        (whose own buffers llama.cpp fails to make, and says so, where they do not fit)."""
        info = read_gguf_info(path)  # (its header only)
        if info.embedding or info.rerank:
            return
        shape = dataclasses.replace(info.shape(), pooled="embed", pooled_ubatch=POOLED_UBATCH)
        kv, state, compute, outputs = pooled_bytes(shape, self.embedder.n_ctx)
        need = outputs if options.n_gpu_layers else kv + state + compute + outputs
        free = ram_available()  # (not the weights mapped: the OS counts them as free)
        if need > free:
            raise ModelLoadFailed(
                f"embeddings with {self.info.name} need {need / (1 << 30):.2f} GiB of RAM for a "
                f"context of their own and {free / (1 << 30):.2f} GiB is free — free some, or "
                f"embed with an embedding model (localinfer pull nomic-embed-text)")

    def embed(self, text: str) -> tuple[list[float], int]:
        vectors, n_tokens = self.embed_many([text])
        return vectors[0], n_tokens

    def embed_many(self, texts: Sequence[str], stop: threading.Event | None = None,
                   truncate: bool = False) -> tuple[list[list[float]], int]:
        inputs = [self.tokenize(text) for text in texts]
        if truncate:
            inputs = [self._cut(tokens, self.embedder.n_ctx) for tokens in inputs]
        return self.embedder.embed_many(inputs, stop), sum(len(tokens) for tokens in inputs)

    def _cut(self, tokens: list[int], n_ctx: int) -> list[int]:
        """An input cut to `n_ctx` tokens; an end token the vocabulary adds stays last (what a
        last-token pooling reads)."""
        if len(tokens) <= n_ctx:
            return tokens
        if self.native.adds_eos() and tokens[-1] == self.native.eos():
            return tokens[:n_ctx - 1] + tokens[-1:]
        return tokens[:n_ctx]

    def rerank(self, query: str, documents: Sequence[str], stop: threading.Event | None = None
               ) -> tuple[list[float], int]:
        n_ctx = self.reranker.n_ctx
        query_bytes = len(query.encode("utf-8", "surrogatepass"))
        for document in documents:  # a text too big is refused before it is tokenized
            size = query_bytes + len(document.encode("utf-8", "surrogatepass"))
            if size > n_ctx and self.fewest_tokens(size) > n_ctx:
                raise PromptTooLong(self.fewest_tokens(size), n_ctx, at_least=True)
        pairs = [self.reranker.tokens(query, d, self._holds_control) for d in documents]
        return self.reranker.score(pairs, stop), sum(len(pair) for pair in pairs)

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def cancel_all(self) -> None:
        self.engine.cancel_all()

    def close(self) -> None:
        """Free in the reverse order of the load: the engine's thread stops first (nothing
        decodes, every request's sampler is freed), then what was built on the model — the
        projector (its encoding thread with it), the embeddings' and reranking's contexts —
        and last the engine's batch, draft model, context and the model itself."""
        self.engine.stop()
        if self.projector:
            self.projector.close()
        self.embedder.close()
        self.reranker.close()
        self.engine.close()
