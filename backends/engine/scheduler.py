"""The engine: one thread owns the llama.cpp context and serves every request from it.

Vocabulary follows llama.cpp's server. A `Task` enters through a queue; a free `Slot`
(one sequence id in the shared context) takes it. Each step builds one batch holding the
next token of every generating slot plus prompt chunks of slots still processing their
prompt, decodes it once, and samples every slot whose logits came out of that batch.
A slot keeps its tokens' KV after a request ends, so the next request that shares the
prefix (the same system prompt, earlier turns of the same chat) prefills only the rest.
"""

from __future__ import annotations

import codecs
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import CancelledError
from dataclasses import replace
from typing import TypeVar

from localinfer.backends.engine.checkpoints import Checkpoints
from localinfer.backends.engine.batch import StepBatch
from localinfer.backends.engine.draft import DraftModel, common_prefix
from localinfer.backends.engine.cells import SharedCells, SplitCells
from localinfer.backends.base import DoneEvent, ErrorEvent, Generation, SamplingParams, TokenEvent
from localinfer.backends.native.model import NativeModel
from localinfer.backends.metrics import EngineStats, RequestStats
from localinfer.backends.engine.padding import StepPadding, ways
from localinfer.backends.engine.prompt_cache import PromptCache
from localinfer.backends.engine.slots import Slot, SlotState, Task
from localinfer.backends.engine.speculator import Speculator
from localinfer.backends.engine.think_budget import ThinkBudget
from localinfer.backends.engine.task_queue import (CANCEL_ALL, CLOSE, WAKE, Job, TaskQueue,
                                                  check_request)
from localinfer.backends.engine.step_budget import DEFAULT_STEP_MS, StepBudget, piece_floor
from localinfer.backends.engine.stop import StopMatcher
from localinfer.backends.engine.threads import ThreadTuner
from localinfer.backends.base import is_image
from localinfer.backends.native.vision import Pictures, Projector
from localinfer.errors import EngineBusy, EngineClosed, EngineError, InvalidRequest, LocalinferError

__all__ = ["Engine", "Slot", "SlotState", "Task"]

log = logging.getLogger("localinfer.engine")

_T = TypeVar("_T")


class Engine:
    def __init__(
        self,
        native: NativeModel,
        n_slots: int,
        n_batch: int,
        max_waiting: int = 64,
        clock: Callable[[], float] = time.perf_counter,
        prefill_chunk: int | None = None,
        step_budget: float | None = None,
        step_ms: int | None = 0,
        draft_tokens: int = 0,
        unified: bool = False,
        drafter: DraftModel | None = None,
        threads: ThreadTuner | None = None,
        grammar_limit_s: float = 1.0,
        reply_cap: int | None = None,
        cache_reuse: int = 0,
        projector: Projector | None = None,
        ctx_checkpoints: int = 0,
        checkpoint_bytes: int | None = None,
        cache_ram: int = 0,
    ):
        self.native = native
        self.projector = projector  # reads a prompt's images (vision.py), if the model takes any
        # an image is encoded while the other streams decode (False: they wait for it, as
        # before; bench/vision.py's baseline)
        self.overlap_images = True
        self._followers: set[int] = set()  # slots that waited last step (_share_reads)
        self._shares: dict[tuple[int, int], int] = {}  # two reading prompts' shared start
        # the longest reply of a request that sets no limit (the one place it is applied:
        # every front end's requests pass here); None or 0: none
        self.reply_cap = reply_cap or None
        # one token of a grammar-constrained reply may take this long to sample; past it the
        # request ends with an error, so a costly grammar cannot stall every other stream
        # (measured here: JSON grammars on gemma3's 262k vocabulary take 41 ms a token, at
        # most 121 ms; a slower CPU has room to spare)
        self.grammar_limit_s = grammar_limit_s
        # re-chooses llama.cpp's thread count as other processes load the CPU (threads.py);
        # None: the count the context was made with stays
        self.threads = threads
        self.n_batch = max(n_batch, n_slots)
        # prompt tokens one slot may add to a step: smaller chunks keep running streams
        # moving while a long prompt is read, at some cost to that prompt's own prefill speed
        self.prefill_chunk = max(1, min(prefill_chunk or self.n_batch, self.n_batch))
        # while streams generate, prompt tokens per step are held to what keeps a step within
        # `step_ms` milliseconds or `step_budget` decode-only steps' time (step_budget.py);
        # neither: chunks only
        if step_ms is None:
            step_ms = DEFAULT_STEP_MS
        self.budget = StepBudget(step_budget,
                                 floor=piece_floor(native.flash_attn) if step_ms else 1,
                                 target_s=step_ms / 1000)
        # a lone stream also decodes guesses with its next token (speculator.py); a
        # recurrent state must be rolled back past the guesses it rejects, which llama.cpp
        # does only for hybrids, and as many tokens as it keeps snapshots for
        if draft_tokens and native.stateful and native.rollback < draft_tokens:
            log.warning("speculative decoding is off for this model: its recurrent state "
                        "cannot be rolled back to a rejected guess")
            draft_tokens = 0
            if drafter is not None:
                drafter.close()
                drafter = None
        self.speculator = Speculator(draft_tokens, drafter, cores=self._cores)
        if native.windowed:
            log.info("sliding-window layers keep their last %d tokens only: no context shift "
                     "or cache reuse, and a prompt that leaves the cached one further back "
                     "goes back to a checkpoint or is read again (--swa-full keeps every "
                     "cell)", native.n_swa)
        # a slot's sequence saved in RAM before another request overwrites it (or, in one
        # pool, before an idle prefix gives its cells back), and put back for a prompt that
        # comes back: `cache_ram` bytes at most (prompt_cache.py; 0: off)
        self.prompts = PromptCache(native, cache_ram)
        # how the slots share the context's cells: a fixed share each, or one pool that
        # admits and preempts requests by free cells (cells.py); past a request's cached
        # prefix, cached runs of `cache_reuse` tokens or more are moved into place (0: off);
        # a recurrent state that cannot be cut goes back to one of its slot's last
        # `ctx_checkpoints` checkpoints, `checkpoint_bytes` in all (checkpoints.py; 0: off;
        # None: model_store.shape.checkpoint_cap's choice)
        self.cells = (SharedCells if unified else SplitCells)(
            native, n_slots, cache_reuse, Checkpoints(native, ctx_checkpoints, self.prefill_chunk,
                                                      max_bytes=checkpoint_bytes),
            self.prompts)
        self.n_cells = self.cells.n_cells
        self.n_ctx_slot = self.cells.per_slot
        # a decode step of streams takes fillers in idle slots where a larger count decodes
        # faster (padding.py): where a filler's cell can be taken back exactly
        self.padding = StepPadding(not unified and not native.stateful and not native.windowed)
        self.slots = [Slot(id=i) for i in range(n_slots)]
        self._clock = clock
        self.queue = TaskQueue(max_waiting)  # requests on their way to a slot (task_queue.py)
        self._ids = itertools.count(1)
        self._closed = False
        self._closing = threading.Lock()  # a job is queued before CLOSE, or refused
        self._counters = {"steps": 0, "evaluated": 0, "generated": 0, "finished": 0,
                          "preempted": 0}
        # seconds inside llama_decode, and in whole steps (batch filling, decode, sampling):
        # their difference is what the engine itself costs on top of llama.cpp
        self._seconds = {"decode": 0.0, "step": 0.0}
        self._waited_s = 0.0  # how long this step's draft waited for a core (_cores)
        # the last step, for the thread tuner: (when it began, its decode and prompt tokens);
        # None when the engine has waited or run other work since
        self._last_step: tuple[float, int, int] | None = None
        self.batch = StepBatch(native, self.n_batch)  # the step being filled (batch.py)
        # called on the engine thread after each step with (seconds, decode tokens, prompt
        # tokens): for tracing and benchmarks
        self.on_step: Callable[[float, int, int], None] | None = None
        # called on the engine thread after each pass of its loop, before it waits for work,
        # and once it has stopped: every event of the pass has been put by then (a runner
        # process sends them to its parent in one message)
        self.after_pass: Callable[[], None] = lambda: None
        self._freed = False
        self._thread = threading.Thread(target=self._run, name="localinfer-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ callers' side
    def submit(self, prompt: Sequence[int], params: SamplingParams,
               pictures: Pictures | None = None) -> Generation:
        """Queue a request. `pictures`: its images' chunks, by the placeholder ids that stand
        for them in `prompt` (vision.py); the engine frees them when the request ends."""
        try:
            if self._closed:
                raise EngineClosed("the engine has been shut down")
            prompt = list(prompt)
            if params.max_tokens is None and params.capped and self.reply_cap:
                params = replace(params, max_tokens=self.reply_cap, context_shift=False)
            if pictures and pictures.chunks:  # an image's tokens are never cut in half
                params = replace(params, context_shift=False)
            check_request(prompt, params, self.native.n_vocab, self.n_ctx_slot,
                          pictures.chunks if pictures else ())
            # built here, in the caller's thread (it reads only the vocabulary): a grammar
            # that does not parse is refused before it is queued, and parsed once
            sampler = self.native.sampler(params, prompt)
            if not self.queue.admit():
                sampler.close()
                raise EngineBusy(f"{self.queue.queued} requests are already waiting — retry "
                                 f"shortly")
        except BaseException:
            if pictures:
                pictures.close()
            raise
        task_id = next(self._ids)
        generation = Generation(id=task_id, _on_cancel=self._wake)
        stats = RequestStats(submitted_at=self._clock())
        self.queue.put(Task(task_id, prompt, params, generation, stats, sampler,
                            pictures=pictures if pictures and pictures.chunks else None,
                            think=ThinkBudget(params.think, prompt) if params.think else None))
        return generation

    def stats(self) -> EngineStats:
        """Safe from any thread; the figures may be one step apart from each other."""
        slots = list(self.slots)
        return EngineStats(
            n_slots=len(slots),
            active=sum(1 for s in slots if s.task is not None),
            waiting=self.queue.queued,
            kv_cells_used=sum(len(s.cache) for s in slots),
            kv_cells_total=self.native.n_cells(),
            steps=self._counters["steps"],
            tokens_evaluated=self._counters["evaluated"],
            tokens_generated=self._counters["generated"],
            requests_finished=self._counters["finished"],
            preemptions=self._counters["preempted"],
            checkpoints_restored=self.cells.checkpoints.restored,
            checkpoint_tokens=self.cells.checkpoints.restored_tokens,
            prompts_saved=self.prompts.saves,
            prompts_restored=self.prompts.restored,
            restored_tokens=self.prompts.restored_tokens,
            saved_bytes=self.prompts.bytes,
            decode_seconds=self._seconds["decode"],
            step_seconds=self._seconds["step"],
            threads=self.native.threads(),
        )

    @property
    def steps(self) -> int:
        """Steps so far: a counter, safe from any thread, before and after close."""
        return self._counters["steps"]

    def cancel_all(self) -> None:
        """End every request submitted so far within a step (a server shutting down): each
        gets its DoneEvent, so its stream closes properly. Safe from any thread."""
        self.queue.put(CANCEL_ALL)

    def call(self, work: Callable[[], _T]) -> _T:
        """Run `work` on the engine thread, between two steps, and give back its result or
        raise its exception (any other thread; it waits). A pooled context's decode goes
        here: llama.cpp's CPU threads are an OpenMP team of the thread that calls
        llama_decode, and while a second thread's team exists libgomp's barriers sleep
        instead of spinning (~200 sleeps a decode, a tenth of 2 cores idle), for every
        context of the process. One decoding thread keeps one team."""
        if threading.current_thread() is self._thread:
            return work()
        job = Job(work)
        with self._closing:
            if self._closed:
                raise EngineClosed("the engine has been shut down")
            self.queue.put(job)
        return job.done.result()

    def stop(self) -> None:
        """The engine's thread ends: every request ends (EngineClosed), its sampler freed,
        every job not yet run refused; nothing runs on the model afterwards. (close frees
        what the engine holds.)"""
        with self._closing:
            if self._closed:
                return
            self._closed = True
            self.queue.put(CLOSE)
        self._thread.join()

    def close(self) -> None:
        if self._freed:
            return
        self._freed = True
        self.stop()
        self.batch.free()
        self.speculator.close()
        self.prompts.clear()  # (their RAM goes with the model)
        self.native.close()
        if self.threads is not None and self.threads.share is not None:
            self.threads.share.close()  # (its slot free for another process)

    # ------------------------------------------------------------------ engine thread
    def _run(self) -> None:
        try:
            self._loop()
        finally:
            self.after_pass()

    def _loop(self) -> None:
        while self._take_new_tasks():
            self._drop_cancelled()
            self._assign_slots()
            if not any(s.task for s in self.slots):
                continue
            try:
                self.cells.before_step(self.slots, self._preempt)
                self._step()
            except Exception as exc:  # never let one bad step kill the engine thread
                log.exception("decode step failed")
                self._fail_active(EngineError(f"generation failed: {exc}"))
        self._fail_all(EngineClosed("the engine was shut down"))

    def _take_new_tasks(self) -> bool:
        """Move arrivals into the wait queue; block only when there is nothing to do."""
        self.after_pass()
        if self.prompts.due() == 0.0:  # (memory the saved prompts may have to give back)
            self.prompts.give_back()
        idle = ((not self.queue.waiting and not any(s.task for s in self.slots))
                or self._waiting_for_images())
        if idle:
            self._last_step = None
        for signal in self.queue.arrivals(block=idle, timeout=self.prompts.due()):
            if signal is CLOSE:
                return False
            if isinstance(signal, Job):
                self._last_step = None
                self._run_job(signal)
                continue
            if signal is CANCEL_ALL:  # every request so far ends now, with what it has
                for task in [*self.queue.waiting, *(s.task for s in self.slots if s.task)]:
                    task.generation.cancelled = True
        return True

    @contextlib.contextmanager
    def _cores(self, n_prompt: int) -> Iterator[int | None]:
        """Claim the cores for llama.cpp work on this thread outside a step's own decode (a
        draft model's guesses), as a step claims its own: the thread count it may use (None:
        a count the user set). A wait for a core is not the step's time (`_waited_s`)."""
        if self.threads is None:
            yield None
            return
        try:
            count = self.threads.begin(n_prompt)
            self._waited_s += self.threads.waited_s
            yield count
        finally:
            self.threads.release()

    def _run_job(self, job: Job) -> None:
        """A pooled read (Engine.call), its cores claimed from other localinfer processes
        for as long as it runs, as a step's are."""
        if not job.done.set_running_or_notify_cancel():
            return
        try:
            try:
                if self.threads is not None:
                    self.threads.begin_pooled()
                result = job.work()
            finally:  # (the claim ends before the caller wakes)
                if self.threads is not None:
                    self.threads.release()
        except BaseException as exc:  # noqa: BLE001 - the caller raises it
            job.done.set_exception(exc)
        else:
            job.done.set_result(result)

    def _drop_cancelled(self) -> None:
        for task in self.queue.drop_cancelled():
            task.close()
            task.stats.finish_reason = "cancelled"
            task.generation.put(DoneEvent(task.stats))
        for slot in self.slots:
            if slot.task and slot.task.generation.cancelled:
                self._finish(slot, "cancelled")

    def _assign_slots(self) -> None:
        while self.queue.waiting:
            idle = [s for s in self.slots if s.state is SlotState.IDLE]
            if not idle:
                return
            task = self.queue.waiting[0]
            tokens = task.resume.tokens if task.resume else task.prompt
            limit = len(tokens) - (0 if task.resume else 1)
            prefixes = self.cells.prefixes(tokens, self.slots)
            slot = max(idle, key=lambda s: self._worth(s, tokens, limit, prefixes))
            if not self.cells.admit(slot, tokens, self.slots):
                return  # first come, first served: nobody overtakes the head of the queue
            self.queue.waiting.popleft()
            self.queue.taken(task)
            self._start(slot, task)

    def _worth(self, slot: Slot, tokens: list[int], limit: int, prefixes: dict[int, int]
               ) -> tuple[int, ...]:
        """How good `slot` is for a request. First the slots it would go on from: the tokens
        it finds cached there (the slot's prefix and runs to be moved into place, or a longer
        prefix borrowed from another slot) outweigh those of the slot's own it drops, each
        of which counts half (its conversation may come back, or not), the more the better.
        Then the slots it would mostly overwrite: an empty one, else by the quarter of the
        prompt found cached, else the least recently used (a slot whose chat shares only the
        template's first tokens is not one to go on from: another conversation is kept there
        for when it comes back)."""
        own = self.cells.reusable(slot, tokens, limit, self.slots)
        kept = self.cells.kept(slot, tokens, limit, self.slots, own, prefixes)
        gain = kept - (len(slot.cache) - (own if kept == own else 0)) // 2
        if gain > 0:
            return 1, gain, -slot.last_used
        return 0, 0 if slot.cache else 1, 4 * kept // max(limit, 1), -slot.last_used

    def _start(self, slot: Slot, task: Task) -> None:
        resume, task.resume = task.resume, None
        tokens = resume.tokens if resume else task.prompt
        # a new prompt keeps at least one token to evaluate: its logits give the first token
        limit = len(tokens) - (0 if resume else 1)
        if self.prompts.on:
            own = self.cells.reusable(slot, tokens, limit, self.slots)
            have = self.cells.kept(slot, tokens, limit, self.slots, own)
            # (what the slot keeps of its own: nothing where it borrows another's prefix)
            self.prompts.swap(slot, tokens, limit, have, own if have == own else 0,
                              min(self.n_ctx_slot, self.cells.free(self.slots) + len(slot.cache)),
                              self.budget.per_token_s)
        self.cells.borrow_prefix(slot, tokens, self.slots)
        n_keep = min(slot.common_prefix(tokens), limit)
        if not task.pictures:  # (an image's KV is not moved: a run could start inside one)
            n_keep = self.cells.reuse_chunks(slot, tokens, n_keep, limit, self.slots)
        n_keep = self.cells.keep_prefix(slot, tokens, n_keep)
        slot.task = task
        slot.to_read = tokens
        slot.n_prompt_done = n_keep
        slot.draft_quality = 1.0
        if resume:
            slot.sampler, slot.decoder, slot.stop = resume.sampler, resume.decoder, resume.stop
            slot.next_token = resume.next_token
            slot.state = SlotState.PROCESSING_PROMPT if n_keep < len(tokens) else SlotState.GENERATING
            log.debug("slot %d: task %d resumes, %d tokens, %d cached",
                      slot.id, task.id, len(tokens), n_keep)
            return
        slot.state = SlotState.PROCESSING_PROMPT
        slot.sampler, task.sampler = task.sampler, None
        slot.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        slot.stop = StopMatcher(task.params.stop, task.params.min_indent)
        task.stats.started_at = self._clock()
        task.stats.prompt_tokens = len(task.prompt)
        task.stats.cached_tokens = n_keep
        log.debug("slot %d: task %d, %d prompt tokens, %d cached",
                  slot.id, task.id, len(task.prompt), n_keep)

    # ------------------------------------------------------------ unified cache: preemption
    def _preempt(self, slot: Slot) -> None:
        """Drop a request's KV and queue it first, to be rebuilt from its tokens later (what
        it keeps to go on where it was: Slot.hand_back)."""
        task = slot.task
        task.stats.preemptions += 1
        self._counters["preempted"] += 1
        slot.hand_back()
        log.debug("slot %d: task %d preempted at %d tokens", slot.id, task.id, len(slot.cache))
        self.cells.forget(slot)
        slot.release(self._clock())
        self.queue.requeue_first(task)

    def _step(self) -> None:
        started = time.perf_counter()
        if self.threads is not None and self._last_step is not None:
            # the tuner times a step from its start to the next one's: what runs between
            # steps (sampling, the events, the parent and the clients on the same cores)
            # slows with the threads llama.cpp keeps spinning beside it
            began, decoded, read = self._last_step
            self.threads.observe(started - began, decoded, read)
        self._last_step = None
        self._waited_s = 0.0
        n_decode, n_prompt, depth, shape = self._fill_batch()
        if not self.batch.n_tokens:  # (the step read an image that ended its prompt)
            return
        n_tokens = self.batch.n_tokens - n_prompt  # (fillers included)
        try:
            if self.threads is not None:  # (decode steps: the tuned count; prompt steps:
                # threads.py; either, no more than other localinfer processes leave now)
                count = self.threads.begin(n_prompt, n_tokens)
                # (a wait for a core, here or for a draft model's guesses, is not the step's)
                started += self.threads.waited_s + self._waited_s
                if count != self.native.threads():
                    self.native.set_threads(count)
            decode_started = time.perf_counter()
            # until the device is done: the wait for a GPU belongs to the decode, not to the
            rc = self.batch.decode()  # engine's own time
        finally:  # (the cores are free again: what follows is this thread's alone)
            if self.threads is not None:
                self.threads.release()
            self._take_fillers()
        decode_s = time.perf_counter() - decode_started
        self._seconds["decode"] += decode_s
        if shape is not None and rc == 0:
            self.padding.observe(shape, decode_s)
        if rc != 0:
            raise EngineError(f"llama_decode returned {rc}")
        self._counters["steps"] += 1
        self._counters["evaluated"] += n_prompt
        best = self.batch.greedy_picks(self.slots)
        for slot in self.slots:
            if slot.task and slot.draft:
                if not self.speculator.verify(slot, self._sample, self._on_token,
                                              self.native.forget):
                    self._lost(slot, "llama.cpp could not drop the guesses it rejected")
            elif slot.task and slot.batch_index >= 0:
                forced = self._forced(slot)
                if forced is not None:
                    token = forced
                elif best is not None and slot.sampler.argmax:
                    token = int(best[slot.output_row])
                else:
                    token = self._sample(slot, slot.batch_index)
                    if token is None:
                        continue
                slot.state = SlotState.GENERATING
                self._on_token(slot, token, slot.batch_index)
            elif (slot.state is SlotState.PROCESSING_PROMPT and slot.rebuilding
                  and slot.n_prompt_done == len(slot.to_read)):
                slot.state = SlotState.GENERATING
        seconds = time.perf_counter() - started
        self._seconds["step"] += seconds
        self.budget.observe(seconds, n_tokens, n_prompt, depth)
        self._last_step = started, n_tokens, n_prompt
        if self.on_step is not None:
            self.on_step(seconds, n_decode, n_prompt)

    def _fillers(self) -> tuple[tuple[int, ...] | None, tuple[int, ...]]:
        """Where every slot's token this step is a stream's next one, the shape to decode it
        at and the idle slots that carry a filler for it (padding.py); else (None, ())."""
        if not self.padding.enabled:
            return None, ()
        active = [s.id for s in self.slots if s.state is SlotState.GENERATING]
        # (one token alone is the cheapest step, and it may carry guesses; with every slot
        # generating there is no idle one)
        if not 2 <= len(active) < len(self.slots) or any(
                s.state is SlotState.PROCESSING_PROMPT for s in self.slots):
            return None, ()
        options = ways(active, self._fillable)
        shape, fillers = options[self.padding.choose(options)]
        return shape, fillers

    def _fillable(self, seq: int) -> bool:
        """Whether slot `seq` may carry a filler: idle, room in its share, and its sequence
        going on where its cache says (llama.cpp refuses a whole step whose positions skip)."""
        if not 0 <= seq < len(self.slots):
            return False
        slot = self.slots[seq]
        return (slot.task is None and not slot.deficit and len(slot.cache) < self.n_ctx_slot - 1
                and self.native.next_position(seq) == len(slot.cache))

    def _take_fillers(self) -> None:
        """The step's filler cells removed: each idle slot keeps exactly its prefix (one
        that llama.cpp will not cut there is dropped whole, never kept with a stray cell)."""
        for slot in self.batch.fillers:
            if not self.native.forget(slot.id, len(slot.cache)):
                log.warning("llama.cpp kept a filler token in slot %d: its prefix is dropped",
                            slot.id)
                self.cells.forget(slot)
        self.batch.fillers = []

    def _fill_batch(self) -> tuple[int, int, float, tuple[int, ...] | None]:
        """Fill the batch: every generating slot's next token (and idle slots' fillers, in
        sequence order), a lone stream's guesses, then prompt chunks as the step budget and
        the free cells allow. The tokens decoded and read, the prompt tokens' mean depth (for
        the step budget), and the step's shape where StepPadding chose it."""
        batch = self.batch
        batch.clear()
        depths = 0.0  # Σ over the prompt tokens carried of their depth
        waiting = self._share_reads()
        shape, fillers = self._fillers()
        for slot in self.slots:
            slot.batch_index = -1
            if slot.state is SlotState.GENERATING:
                batch.add(slot, slot.next_token, logits=True)
            elif slot.id in fillers:
                batch.add_filler(slot)
        if fillers:
            self.padding.padded_steps += 1
        self.speculator.add_guesses(self.slots, batch, min(
            self.n_batch - batch.n_tokens, self.cells.free(self.slots)), self.n_ctx_slot)
        n_decode = batch.n_tokens - len(fillers)
        reading = next((s for s in self.slots if s.state is SlotState.PROCESSING_PROMPT
                        and s not in waiting), None)
        allowed = self.budget.allowance(n_decode, self.n_batch - n_decode,
                                        depth=len(reading.cache) if reading else 0)
        # (the decode tokens' cells are already counted in the caches)
        free = self.cells.free(self.slots)
        allowed = min(allowed, free)
        for slot in self.slots:
            read = batch.n_tokens - n_decode - len(fillers)
            room = min(self.prefill_chunk, allowed - read)
            if slot.state is not SlotState.PROCESSING_PROMPT or room <= 0 or slot in waiting:
                continue
            encoding = False
            while (slot.task and slot.n_prompt_done < len(slot.to_read)
                   and is_image(slot.to_read[slot.n_prompt_done])):
                if not self._read_image(slot):  # a decode of its own once it is encoded
                    encoding = True
                    break
            if encoding or not slot.task or slot.n_prompt_done == len(slot.to_read):
                continue  # (its image being encoded; failed; a rebuilt request all read)
            end = min(len(slot.to_read), slot.n_prompt_done + room)
            left = len(slot.to_read) - end
            whole = len(slot.to_read) - slot.n_prompt_done
            if (n_decode and 0 < left < self.budget.floor
                    and whole <= min(self.prefill_chunk, self.n_batch - batch.n_tokens,
                                     free - read)):
                # a prompt's tail below the floor: where the rest makes two pieces of a floor
                # or more, it is read in two halves, each within the step's allowance; else,
                # with flash attention, it rides along (read in a step of its own it costs
                # more than this step does with it: 4,000 deep, 28 tokens 1.7 s where 65 took
                # 0.6); without it, it takes a short step of its own (riding along, 4,000
                # deep, would have made this step 30-100 ms longer than its target)
                if whole >= 2 * self.budget.floor:
                    end = slot.n_prompt_done + (whole + 1) // 2
                elif self.native.flash_attn:
                    end = len(slot.to_read)
            if slot.task.pictures:  # up to its next image
                end = next((i for i in range(slot.n_prompt_done, end)
                            if is_image(slot.to_read[i])), end)
            if not slot.rebuilding:  # (a checkpoint where it starts, if due; where it ends)
                end = self.cells.checkpoints.before_chunk(slot, slot.to_read, end)
            depth = len(slot.cache)
            batch.add_prompt(slot, slot.to_read, slot.n_prompt_done, end,
                             logits_last=not slot.rebuilding)
            depths += (end - slot.n_prompt_done) * (depth + len(slot.cache)) / 2
            slot.n_prompt_done = end
        n_prompt = batch.n_tokens - n_decode - len(fillers)
        return n_decode, n_prompt, depths / n_prompt if n_prompt else 0.0, shape

    def _share_reads(self) -> list[Slot]:
        """Prompts being read at once that start alike (clients arriving together with the
        same system prompt, an agent's parallel tasks with the same tools) read what they
        share once: the slot furthest along reads it, those behind it wait, and each takes
        the shared start (`borrow_prefix`) once a slot holds all of it, then reads its own
        rest. Before, each read the whole of it, side by side: 8 requests at once with one
        600-word system prompt read 1,432-2,456 prompt tokens, now 732, and SmolLM2's first
        tokens came after 7.8 s, now 4.2 (bench/results/shared_start.md). The slots that
        wait this step. Only where a sequence's KV can be cut back to the shared start
        (not a recurrent state's, nor a sliding window's) and the prompt has no images; a
        shared start shorter than `MIN_SHARED` is read by each."""
        if self.native.stateful or self.native.windowed:
            return []
        reading = sorted((s for s in self.slots if s.state is SlotState.PROCESSING_PROMPT
                          and s.task and not s.rebuilding and not s.task.pictures),
                         key=lambda s: (-s.n_prompt_done, s.id))
        if len(reading) < 2 and not any(s.id in self._followers for s in reading):
            self._followers, self._shares = set(), {}
            return []
        readers: list[Slot] = []  # (the furthest along first)
        waiting = []
        known, self._shares = self._shares, {}
        for slot in reading:
            last = len(slot.to_read) - 1  # (a prompt's last token is read for its logits)
            # what a slot reading ahead of it will hold (two prompts' shared start, asked
            # once a pair); for one that waits, or would, what any slot holds now (its
            # reader may have read all it has to, or stopped)
            coming = 0
            for r in readers:
                pair = r.task.id, slot.task.id
                shared = known.get(pair)
                if shared is None:
                    shared = common_prefix(r.to_read, slot.to_read)
                self._shares[pair] = shared
                coming = max(coming, shared)
            least = slot.n_prompt_done + self.cells.MIN_SHARED
            if min(coming, last) < least and slot.id not in self._followers:
                readers.append(slot)
                continue
            held = max((common_prefix(s.cache, slot.to_read) for s in self.slots
                        if s is not slot and s.cache), default=0)
            target = min(max(coming, held), last)
            if target < least:
                readers.append(slot)
            elif held < target:  # (this step's tokens are not in the caches yet)
                waiting.append(slot)
            else:
                task, done = slot.task, slot.n_prompt_done
                self.cells.borrow_prefix(slot, slot.to_read, self.slots)
                # (the prompt's tokens read here stay counted; all of them, where the copy
                # was refused and the slot reads its prompt from the start)
                task.stats.cached_tokens = max(0, len(slot.cache)
                                               - (done - task.stats.cached_tokens))
                slot.n_prompt_done = len(slot.cache)
                readers.append(slot)
        self._followers = {s.id for s in waiting}
        return waiting

    def _read_image(self, slot: Slot) -> bool:
        """The image whose placeholders come next in the slot's prompt. It is encoded on the
        projector's own thread while the other streams go on (with `overlap_images`; else
        the engine waits for it), then decoded into the slot's sequence whole, between steps
        (one image cannot be split: its tokens may attend to each other both ways). False
        while it is being encoded (bench/vision.py measures both ways)."""
        start = slot.n_prompt_done
        place = slot.to_read[start]
        pictures = slot.task.pictures
        size = pictures.sizes[place]
        try:
            if self.projector is None:
                raise InvalidRequest("this model takes no images")
            future = pictures.encoding.get(place) or self.projector.encode(
                pictures, place, self.n_batch, self._wake)
            if self.overlap_images and not future.done():
                return False
            try:
                embeddings = future.result()  # (its copy stays: a rebuilt request reuses it)
            except CancelledError:
                raise EngineError("the image's encode was cancelled") from None
            self.projector.decode(pictures, place, embeddings, slot.id, slot.position(start),
                                  self.n_batch)
        except LocalinferError as exc:
            self.cells.forget(slot)  # (what the decode may have half-written)
            self._fail(slot, exc)
            return True
        positions = pictures.positions[place]
        if positions != size:  # (M-RoPE: its tokens share positions)
            slot.spans[place] = (size, positions)
            slot.deficit += size - positions
        slot.cache.extend(slot.to_read[start:start + size])
        slot.n_prompt_done = start + size
        self._counters["evaluated"] += size
        return True

    def _wake(self) -> None:
        self.queue.put(WAKE)

    def _waiting_for_images(self) -> bool:
        """Whether the last step had nothing to decode but images being encoded: the engine
        then sleeps until one is done (its encode wakes it), or a request comes."""
        return not self.batch.n_tokens and any(
            not future.done() for slot in self.slots if slot.task and slot.task.pictures
            for future in slot.task.pictures.encoding.values())

    def _sample(self, slot: Slot, batch_index: int) -> int | None:
        """The slot's next token; None when its grammar took too long and it was failed."""
        if not slot.sampler.constrained:
            return slot.sampler.sample(self.native, batch_index)
        started = time.perf_counter()
        token = slot.sampler.sample(self.native, batch_index)
        spent = time.perf_counter() - started
        if spent <= self.grammar_limit_s:
            return token
        log.warning("slot %d: task %d's grammar took %.2f s for one token; ending it",
                    slot.id, slot.task.id, spent)
        self._fail(slot, InvalidRequest(
            f"following the response format took {spent:.2f} s for one token, more than the "
            f"{self.grammar_limit_s:g} s allowed — simplify the schema (nested repetitions, "
            "long alternatives)"))
        return None

    @staticmethod
    def _forced(slot: Slot) -> int | None:
        """The token a spent reasoning budget writes now (think_budget.py), taken by the
        request's sampler as if drawn; None: sample as usual."""
        think = slot.task.think
        token = think.forced() if think is not None else None
        if token is not None and not slot.sampler.accept(token):
            slot.task.think = None  # (its grammar will not have it: the model goes on)
            return None
        return token

    def _on_token(self, slot: Slot, token: int, row: int) -> None:
        """A written token (drawn from the logits at `row` of this step's decode)."""
        task = slot.task
        task.stats.token_times.append(self._clock())
        self._counters["generated"] += 1
        if task.think is not None:
            task.think.observe(token)
        if self.native.is_eog(token):
            return self._finish(slot, "stop")
        if task.params.logprobs is not None:  # (paid only by a request that asks)
            task.logprobs.append(self.native.logprob(row, token, task.params.logprobs))
        text = slot.stop.feed(slot.decoder.decode(self.native.piece(token)))
        if text:
            task.generation.put(TokenEvent(text, token, len(task.stats.token_times) - 1,
                                           self._take_logprobs(task)))
        if slot.stop.stopped:
            task.stats.stop_string = slot.stop.matched
            return self._finish(slot, "stop")
        max_tokens = task.params.max_tokens
        if max_tokens is not None and task.stats.generated_tokens >= max_tokens:
            return self._finish(slot, "length")
        limit = task.params.line_time_limit
        if (limit is not None and slot.stop.newline
                and task.stats.token_times[-1] - task.stats.token_times[0] > limit):
            return self._finish(slot, "length")
        if len(slot.cache) >= self.n_ctx_slot:  # no cell left to feed this token back
            # shifting only with a limit: without one, a model that never writes its end
            # token would hold the slot for ever
            shift = task.params.context_shift and task.params.max_tokens is not None
            if not (shift and self.cells.shift(slot, task.params.n_keep)):
                return self._finish(slot, "length")
            task.stats.context_shifts += 1
        slot.next_token = token

    def _finish(self, slot: Slot, reason: str) -> None:
        task = slot.task
        # the decoder's pending bytes are a character cut short (by max_tokens, say): they
        # are dropped, not sent as U+FFFD
        tail = slot.stop.flush()
        if tail and reason != "cancelled":
            task.generation.put(TokenEvent(tail, -1, len(task.stats.token_times) - 1,
                                           self._take_logprobs(task)))
        task.stats.finish_reason = reason
        self._counters["finished"] += 1
        slot.release(self._clock())  # first: whoever sees the end may count on a free slot
        task.close()
        task.generation.put(DoneEvent(task.stats))

    @staticmethod
    def _take_logprobs(task: Task) -> tuple:
        """The log probabilities of the tokens whose text goes out now (a stop string's
        tokens, whose text never does, keep theirs)."""
        taken, task.logprobs = tuple(task.logprobs), []
        return taken

    def _fail(self, slot: Slot, error: LocalinferError) -> None:
        """End one request with an error; its slot's KV stays valid for the next."""
        task = slot.task
        task.generation.put(ErrorEvent(error))
        self._counters["finished"] += 1
        slot.release(self._clock())
        task.close()

    def _lost(self, slot: Slot, why: str) -> None:
        """The slot's sequence no longer holds what the slot says (llama.cpp refused a cut):
        its request ends with an error rather than go on from a wrong state, and the
        sequence is dropped."""
        log.error("slot %d: %s", slot.id, why)
        if slot.task:
            self._fail(slot, EngineError(f"generation stopped: {why}"))
        self.cells.forget(slot)

    def _fail_active(self, error: LocalinferError) -> None:
        for slot in self.slots:
            if slot.task:
                task = slot.task
                task.generation.put(ErrorEvent(error))
                # its KV may be half-written: forget it
                self.cells.forget(slot)
                slot.release(self._clock())
                task.close()

    def _fail_all(self, error: LocalinferError) -> None:
        self._fail_active(error)
        for item in self.queue.drain():
            if isinstance(item, Job):
                item.done.set_exception(error)
                continue
            item.close()
            item.generation.put(ErrorEvent(error))
