"""Loaded models for a long-running process (the API server, the TUI).

A model loads on first use and stays while requests keep it busy or its keep-alive has
not run out; a request for a model that is still loading waits for that load. When a
new model would not fit beside the loaded ones (by count, or by the memory estimate),
the least recently used idle one is unloaded first. Loads of different models take turns:
each checks for room against memory as the loads before it left it. The pool is the one
owner of its models' runners: it starts them (a load), stops them (an unload) and starts
them again — a model whose runner died (its backend `ended`, each call RunnerDied) is
loaded again by its next request, through the same plan and check. Told to shut down
(`cancel_all`), it ends the requests of the loaded models and those still waiting for a
plan or a load alike: the latter with EngineClosed (a 503) at once, not when the load ends;
a load still running is stopped, its runner killed (a big model's load takes minutes).
"""

from __future__ import annotations

import asyncio
import dataclasses
import contextlib
import logging
import math
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from localinfer.backends.base import Backend, LoadOptions
from localinfer.errors import (ContextTooLarge, EngineBusy, EngineClosed, InvalidRequest,
                               LocalinferError)
from localinfer.model_store.gguf_info import GGUFInfo, read_gguf_info
from localinfer.backends.native.machine import detect
from localinfer.backends.runner.replicas import Replicas
from localinfer.model_store.hardware import Hardware, free_gpu_memory
from localinfer.model_store.planner import free_memory
from localinfer.model_store.sources import ResolvedModel, resolve
from localinfer.runners import BackendFactory, runner_backend, warm_runner
from localinfer.service import Prepared, default_context, prepare, ram_available
from localinfer.settings import Settings, default

__all__ = ["LoadedModel", "ModelPool", "parse_keep_alive"]

log = logging.getLogger("localinfer.pool")

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
CLAIM_SECONDS = 10.0  # a model loaded for callers that all gave up becomes unloadable
# after an unload, the driver is asked every RECOVER_POLL s until this share of the model's
# GPU memory shows free again, for at most RECOVER_SECONDS (as Ollama's scheduler waits)
RECOVERED, RECOVER_POLL, RECOVER_SECONDS = 0.75, 0.1, 5.0
_DURATION = re.compile(r"(-?\d+(?:\.\d+)?)(ms|s|m|h)")
# Ollama's "forever" is Go's longest duration (2**63 ns, 292 years): a longer keep-alive, an
# infinite one included, is forever too (it would not fit a date, nor Ollama's duration)
_FOREVER = 2**63 / 1e9


def parse_keep_alive(value: str | float | int | None, default: float | None) -> float | None:
    """Seconds to keep a model after its last request; None is forever (Ollama's rules).

    Numbers are seconds; strings are Go-style durations ("5m", "1h30m", "10s"); anything
    negative, infinite or longer than Ollama's longest duration (292 years) means forever,
    and 0 means unload as soon as the request ends. NaN is no duration (Ollama's JSON
    reader refuses it): a 400, not a model unloaded at its first idle second.
    """
    if value is None:
        return default
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and re.fullmatch(r"-?\d+(\.\d+)?", value.strip()):
        seconds = float(value)
    elif isinstance(value, str) and re.fullmatch(rf"(?:{_DURATION.pattern})+", value.strip()):
        seconds = sum(float(n) * _UNITS[u] for n, u in _DURATION.findall(value.strip()))
    else:
        raise InvalidRequest(f"keep_alive {value!r} is not a duration — use e.g. 5m, 30s or -1")
    if math.isnan(seconds):
        raise InvalidRequest(f"keep_alive {value!r} is not a number of seconds — use e.g. 5m, "
                             f"30s or -1")
    return None if seconds < 0 or seconds >= _FOREVER else seconds



def _unwaited(task: asyncio.Future[Any]) -> None:
    """A plan or load no request waits for any more (a shutdown began): its outcome is the
    pool's to handle (`close`), not an unread exception in the log."""
    if not task.cancelled():
        task.exception()


def _per_gpu(uses: Iterable[dict[int, int]]) -> dict[int, int]:
    """Bytes per GPU index, summed over models."""
    total: dict[int, int] = {}
    for use in uses:
        for index, size in use.items():
            total[index] = total.get(index, 0) + size
    return total

@dataclass
class LoadedModel:
    name: str
    backend: Backend
    info: GGUFInfo
    resolved: ResolvedModel
    options: LoadOptions
    load_duration: float
    ram_bytes: int  # as the fit check planned it (service.Prepared)
    gpu_use: dict[int, int]  # GPU index → bytes, likewise
    keep_alive: float | None
    active: int = 0
    last_used: float = field(default_factory=time.monotonic)
    # handed to a caller yet: until then (or for CLAIM_SECONDS) no other load may unload it,
    # or a request could find the model it waited for gone before it starts
    claimed: bool = False
    loaded_at: float = field(default_factory=time.monotonic)
    # a smaller context → whether it would put more of this model on the GPUs (planned
    # once each: pool._faster_smaller)
    faster_smaller: dict[int, bool] = field(default_factory=dict)

    @property
    def gpu_bytes(self) -> int:
        return sum(self.gpu_use.values())

    @property
    def memory_bytes(self) -> int:
        return self.ram_bytes + self.gpu_bytes

    @property
    def expires_in(self) -> float | None:
        """Seconds until unload, None for never (or while requests are running)."""
        if self.keep_alive is None or self.active:
            return None
        return max(0.0, self.last_used + self.keep_alive - time.monotonic())


def _placed(options: LoadOptions) -> tuple[int, int]:
    """How much of a model a plan puts on the GPUs, to compare: its layers there, then
    fewer layers' experts left in RAM."""
    return options.n_gpu_layers or 0, -len(options.cpu_experts)


class ModelPool:
    def __init__(
        self,
        settings: Settings,
        options: LoadOptions,
        *,
        max_loaded: int = 3,
        default_keep_alive: float | None = parse_keep_alive(default("keep_alive"), None),
        backend_factory: BackendFactory = runner_backend,
        available_memory: Callable[[], int] = ram_available,
        hardware: Hardware | None = None,  # else probed on first use
        probe: Callable[[], Hardware] | None = None,  # how to probe it (hardware.detect)
        # the GPU driver, asked at each load decision: each GPU's free bytes now, by index
        # (hardware.free_gpu_memory; where `hardware` or `probe` stands in for the machine,
        # none unless given: the GPUs are then counted from the probe and the plans)
        gpu_free: Callable[[], dict[int, int]] | None = None,
        paths: bool = False,  # any name may be a file's path, not only the operator's aliases
    ):
        self.settings = settings
        self.options = options
        self.paths = paths
        self.max_loaded = max_loaded
        self.default_keep_alive = default_keep_alive
        self._factory = backend_factory
        self._available = available_memory
        self._loaded: dict[str, LoadedModel] = {}
        self._loading: dict[str, asyncio.Task[LoadedModel]] = {}
        self._lock = asyncio.Lock()
        self._turn = asyncio.Lock()  # one load at a time makes room and loads
        self._changes = 0  # loads and unloads so far: a plan made before the last is stale
        self._reaper: asyncio.Task[None] | None = None
        self._aliases: dict[str, str] = {}
        self._names: dict[str, str] = {}  # what requests said → the name it loaded under
        self.default: str | None = None  # for requests that name no model (serve --model)
        self._hw: Hardware | None = hardware
        self._probe = probe
        self._probing = threading.Lock()
        self._driver = gpu_free or (free_gpu_memory if hardware is None and probe is None
                                    else dict)
        self.closing = False  # shutting down: no request starts, none waits for a load
        self._closed = asyncio.Event()
        # set as it shuts down: a load still running is stopped (its runner killed), not
        # waited for — a big model's takes minutes, and Ctrl-C must not
        self._stop_loads = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def hardware(self) -> Hardware:
        """The machine as probed once: its devices (each GPU's free memory is asked of
        the driver again at each load decision: `_ask_driver`)."""
        with self._probing:  # requests plan in threads: one probe, not one each at once
            if self._hw is None:
                self._hw = (self._probe or detect)()
            return self._hw

    def _ask_driver(self) -> dict[int, int]:
        """Each local GPU's free memory now, by index, as its driver says ({} where no GPU
        is used, or the driver says nothing). Blocking: a vendor's tool may run."""
        hw = self.hardware()
        if not (hw.gpu_offload and hw.gpus):
            return {}
        try:
            return dict(self._driver())
        except Exception:  # noqa: BLE001 - a driver that cannot say: counted from the plans
            log.warning("the GPU driver could not say how much memory is free", exc_info=True)
            return {}

    def _machine_now(self, asked: Mapping[int, int], taken: Mapping[int, int],
                     gone: Mapping[int, int] | None = None) -> Hardware:
        """The machine as a load decision sees it: a GPU the driver answered for has what it
        says is free now, plus what `gone` (models to be unloaded) holds there; any other,
        what the probe found less what the loaded models' plans hold there (`taken`)."""
        hw = self.hardware()
        gone = gone or {}
        gpus = tuple(
            dataclasses.replace(g, free_bytes=asked[g.index] + gone.get(g.index, 0))
            if g.index in asked else
            dataclasses.replace(g, free_bytes=max(0, free_memory(g) - taken.get(g.index, 0)))
            for g in hw.gpus)
        return dataclasses.replace(hw, gpus=gpus)

    def alias(self, name: str, ref: str) -> None:
        """Let requests name a model the operator gave as a path (`serve --model x.gguf`)."""
        self._aliases[name] = ref

    # ------------------------------------------------------------------ queries
    def loaded(self) -> list[LoadedModel]:
        return list(self._loaded.values())

    @property
    def aliases(self) -> list[str]:
        return list(self._aliases)

    @property
    def loading(self) -> list[str]:
        return list(self._loading)

    # ------------------------------------------------------------------ use
    @contextlib.asynccontextmanager
    async def use(self, ref: str | None, keep_alive: str | float | None = None,
                  n_ctx: int | None = None) -> AsyncIterator[LoadedModel]:
        """The loaded model for `ref`, kept loaded while the block runs. n_ctx: the context
        per request a client asks for (Ollama's num_ctx): a model loaded with less is
        loaded again once its requests are done (see `get` for when a larger one stays)."""
        seconds = parse_keep_alive(keep_alive, self.default_keep_alive)  # bad value: fail first
        model = await self.get(ref, n_ctx=n_ctx)
        model.active += 1
        try:
            yield model
        finally:
            model.active -= 1
            model.last_used = time.monotonic()
            if keep_alive is not None:
                model.keep_alive = seconds
            if model.keep_alive == 0 and not model.active:
                await self.unload(model.name)

    async def canonical(self, ref: str | None) -> str:
        """The name a model is loaded under, without loading it."""
        return (await asyncio.to_thread(self._resolve, ref)).name

    def _target(self, ref: str | None) -> tuple[str | None, bool]:
        """What to resolve for a request's model name, and whether it may be a path: only
        the operator's own names (`serve --model x.gguf`) may, or every name where the user
        is the only one naming models (the chat app)."""
        alias = self._aliases.get(ref or "")
        return alias or ref, alias is not None or self.paths

    def _resolve(self, ref: str | None) -> ResolvedModel:
        """A request's model name to its file, without loading it (blocking)."""
        target, allow_paths = self._target(ref or self.default)
        return resolve(target or self.settings.default_model, self.settings.models_dir,
                       allow_paths)

    def describe(self, ref: str | None) -> tuple[ResolvedModel, GGUFInfo]:
        """A model's file and header, loaded or not (blocking: call from a thread); a loaded
        model's header as its load read it, not read again."""
        resolved = self._resolve(ref)
        loaded = self._loaded.get(resolved.name)
        if loaded is not None and loaded.resolved.path == resolved.path:
            return resolved, loaded.info
        return resolved, read_gguf_info(resolved.path)

    def check_open(self) -> None:
        """EngineClosed once the pool was told to shut down."""
        if self.closing:
            raise EngineClosed("the server is shutting down — send the request again once "
                               "it is back")

    async def _unless_closing(self, work: Any) -> Any:
        """`work`'s result, or EngineClosed as soon as a shutdown begins. The work itself
        goes on (a plan in a thread cannot be stopped, and a load is shared), unwaited."""
        self.check_open()
        self._loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(work)
        closing = asyncio.ensure_future(self._closed.wait())
        try:
            await asyncio.wait({task, closing}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closing.cancel()
        if not task.done():
            task.add_done_callback(_unwaited)
            self.check_open()
        return task.result()

    async def get(self, ref: str | None, prepared: Prepared | None = None,
                  n_ctx: int | None = None) -> LoadedModel:
        """The loaded model for `ref`, loading it if need be. prepared: its plan, when the
        caller has just made it (`plan`), not to read the header twice. n_ctx: as `use`.
        EngineClosed where a shutdown begins before it is loaded.

        The context a request gets (`_context`: its num_ctx, else the server's) is a floor,
        not an order to load again: a model loaded with a larger one serves it as it is,
        unless the smaller context would put more of it on the GPUs. Ollama loads again
        whenever num_ctx differs, and aider sends a new one with every message (its prompt's
        tokens × 1.25 + 8,192), so each turn there pays a load and reads the whole chat
        again. A context that has to grow for a client's num_ctx grows with room to spare
        (`_plan_with_room`)."""
        self.check_open()
        self._loop = asyncio.get_running_loop()
        ref = ref or self.default
        known = self._loaded.get(self._names.get(ref or "", ""))
        if known is not None and not known.backend.ended:
            wanted = self._context(known.info, n_ctx)
            if known.options.n_ctx < wanted or await self._faster_smaller(ref, known, wanted):
                while known.active and not known.backend.ended:  # its requests finish first
                    await asyncio.sleep(0.05)
                if self._loaded.get(known.name) is known:
                    log.info("%s: loading again with a %d-token context", known.name, wanted)
                    await self.unload(known.name)
                known = None
                prepared = prepared or await self._unless_closing(
                    self._plan_with_room(ref, wanted, n_ctx))
            elif self._loaded.get(known.name) is not known:  # unloaded while it was checked
                return await self.get(ref, prepared, n_ctx)
        if known is not None and known.backend.ended:
            # its runner died (a copy's, at least) and freed its memory, which another load
            # may have taken since: loaded again through the plan, once the requests still
            # running on its other copies are done
            while known.active:
                await asyncio.sleep(0.05)
            if self._loaded.get(known.name) is known:
                log.info("the runner of %s has ended; loading it again", known.name)
                await self.unload(known.name)
        elif known is not None:  # the usual request: no resolving, no header parsing
            known.last_used, known.claimed = time.monotonic(), True
            return known
        planned_at = self._changes
        prepared = prepared or await self._unless_closing(
            self._plan_with_room(ref, n_ctx, n_ctx) if n_ctx else self.plan(ref))
        name = prepared.model.name
        self._names[ref or ""] = name
        async with self._lock:
            if name in self._loaded and not self._loaded[name].backend.ended:
                model = self._loaded[name]
                model.last_used, model.claimed = time.monotonic(), True
                return model
            task = self._loading.get(name)
            if task is None:
                task = asyncio.create_task(self._load(ref, prepared, planned_at, n_ctx))
                self._loading[name] = task
        # shield: one caller giving up (a disconnect) must not cancel the load others wait for
        model = await self._unless_closing(asyncio.shield(task))
        model.claimed = True  # (use() marks it busy before anything else runs)
        return model

    async def _faster_smaller(self, ref: str | None, known: LoadedModel, wanted: int) -> bool:
        """Whether `known`, loaded with more context than `wanted`, would have more of its
        layers (or experts) on the GPUs with `wanted`: then it is loaded again with it, as
        a request that asks for less should not decode slower for a context it does not
        use. On the CPU alone, or with every layer offloaded, nothing is asked."""
        if known.options.n_ctx <= wanted or not known.options.n_gpu_layers:
            return False
        if (known.options.n_gpu_layers > known.info.n_layer
                and not known.options.cpu_experts):
            return False  # (all of it on the GPUs already)
        if wanted not in known.faster_smaller:
            try:
                smaller = await self.plan(ref, wanted)
                known.faster_smaller[wanted] = _placed(smaller.options) > _placed(known.options)
            except LocalinferError:
                known.faster_smaller[wanted] = False
        return known.faster_smaller[wanted]

    async def _plan_with_room(self, ref: str | None, wanted: int | None,
                              asked: int | None) -> Prepared:
        """The plan for a context `wanted` (None: the server's). Where a client asked for
        it (`asked`: Ollama's num_ctx), the next power of two, within what the model was
        trained on, when that places as much on the GPUs and fits: a client whose prompt
        grows asks a little more each time (aider), and each would be a load."""
        exact = await self.plan(ref, wanted)
        if not asked or not wanted:
            return exact
        roomy = 1 << (wanted - 1).bit_length()
        trained = exact.info.n_ctx_train or roomy
        if min(roomy, trained) <= exact.options.n_ctx:
            return exact
        try:
            grown = await self.plan(ref, min(roomy, trained))
        except LocalinferError:
            return exact
        same = (_placed(grown.options) >= _placed(exact.options)
                and len(grown.copies) == len(exact.copies)
                and grown.options.workers == exact.options.workers)
        # room to spare is taken from what is free now, never by unloading other models
        return grown if same and (await self._fits_now(grown))[0] else exact

    async def _fits_now(self, prepared: Prepared) -> tuple[bool, Mapping[int, int]]:
        """Whether `prepared` fits in the RAM and on the GPUs free now, beside every model
        loaded (none unloaded for it), as each GPU's driver says now (where it says
        nothing, as the plans count it); and what the drivers said."""
        asked = await asyncio.to_thread(self._ask_driver)
        gpu_free = self._gpu_room(asked)
        return (prepared.ram_bytes <= self._available()
                and all(need <= gpu_free.get(i, 0) for i, need in prepared.gpu_use.items()
                        if need)), asked

    def _context(self, info: GGUFInfo, n_ctx: int | None) -> int:
        """The context a request needs: what it asks for (Ollama's num_ctx) within what the
        model was trained on, else the server's own — not what the last client asked for:
        a smaller one would hold for every client after it (a model loaded with less is
        loaded again with this, as Ollama goes back to its default)."""
        if n_ctx:
            return min(n_ctx, info.n_ctx_train or n_ctx)
        return self.options.n_ctx or default_context(info, self.settings)

    async def plan(self, ref: str | None, n_ctx: int | None = None) -> Prepared:
        """The fit check for `ref` beside the loaded models, loading nothing. Planned first
        beside every loaded model; where that puts fewer layers on the GPUs than planning
        as if the idle ones were gone (the least recently used then go first to make room),
        the latter: busy ones always keep what they hold. Raises what `get` would."""
        target, allow_paths = self._target(ref or self.default)
        idle_ram = sum(m.ram_bytes for m in self._idle())
        busy_gpu = _per_gpu(m.gpu_use for m in self._loaded.values() if m.active)
        all_gpu = _per_gpu(m.gpu_use for m in self._loaded.values())

        idle_gpu = {i: n - busy_gpu.get(i, 0) for i, n in all_gpu.items()}

        def planned() -> Prepared:
            warm_runner(self._factory)  # a load may follow: its runner starts meanwhile
            options = self.options
            if n_ctx:  # asked by the client: within what the model was trained on (Ollama)
                trained = self.describe(ref)[1].n_ctx_train
                options = dataclasses.replace(options, n_ctx=min(n_ctx, trained or n_ctx))
            asked = self._ask_driver()
            evicting = prepare(target, options, self.settings,
                               lambda: self._available() + idle_ram, allow_paths,
                               lambda: self._machine_now(asked, busy_gpu, idle_gpu))
            if all_gpu == busy_gpu or not evicting.options.n_gpu_layers:
                return evicting  # no idle model holds a GPU, or none is used: the same plan
            try:  # beside them all: another card may have the room
                beside = prepare(target, options, self.settings, self._available,
                                 allow_paths, lambda: self._machine_now(asked, all_gpu))
            except ContextTooLarge:  # not without unloading
                return evicting
            keep = beside.options.n_gpu_layers >= evicting.options.n_gpu_layers
            return beside if keep else evicting

        return await asyncio.to_thread(planned)

    async def _load(self, ref: str | None, prepared: Prepared, planned_at: int,
                    asked: int | None = None) -> LoadedModel:
        """`asked`: the context a client asked for, where `prepared` took more of it
        (`_plan_with_room`): what the load falls back to if that no longer fits."""
        resolved = prepared.model
        try:
            async with self._turn:  # two loads checked at once would both find the same room
                if self._changes != planned_at:  # planned beside models since (un)loaded
                    try:
                        prepared = await self.plan(ref, prepared.options.n_ctx)
                    except ContextTooLarge:
                        if not asked or asked >= (prepared.options.n_ctx or 0):
                            raise
                        prepared = await self.plan(ref, asked)
                await self._make_room(prepared)
                started = time.monotonic()
                backend = await asyncio.to_thread(self._start_copies, prepared,
                                                  asyncio.get_running_loop())
            model = LoadedModel(
                name=resolved.name, backend=backend, info=prepared.info, resolved=resolved,
                options=prepared.options, load_duration=time.monotonic() - started,
                ram_bytes=prepared.ram_bytes, gpu_use=prepared.gpu_use,
                keep_alive=self.default_keep_alive,
            )
            async with self._lock:
                self._loaded[resolved.name] = model
                self._changes += 1
            log.info("loaded %s in %.2f s", resolved.name, model.load_duration)
            return model
        finally:
            self._loading.pop(resolved.name, None)

    async def _make_room(self, prepared: Prepared) -> None:
        """Unload idle models, least recently used first, until this one fits beside the
        rest: by count, in RAM as it is free now, and on each GPU as its driver says now
        (where it says nothing, as the plans count it). After each unload, the driver is
        asked until the model's memory has come back (`_memory_back`)."""
        for model in [m for m in self._loaded.values() if m.backend.ended]:
            await self.unload(model.name)  # holds nothing now
        while True:
            in_memory, asked = await self._fits_now(prepared)
            if len(self._loaded) < self.max_loaded and in_memory:
                return
            victim = min(self._idle(), key=lambda m: m.last_used, default=None)
            if victim is None:
                if len(self._loaded) < self.max_loaded:
                    return  # the plan counted on no more than this; llama.cpp has the last word
                raise EngineBusy(
                    f"{len(self._loaded)} models are loaded and busy — wait for their requests "
                    f"to finish or raise the number of models kept loaded")
            log.info("unloading %s to make room for %s", victim.name, prepared.model.name)
            await self.unload(victim.name)
            await self._memory_back(victim, asked)

    async def _memory_back(self, gone: LoadedModel, before: Mapping[int, int]) -> None:
        """After an unload: ask the driver until each GPU shows most of what the model held
        free again (a runner's memory is given back a moment after it exits), or until
        RECOVER_SECONDS have passed (Ollama's waitForVRAMRecovery)."""
        wanted = {i: before[i] + int(n * RECOVERED) for i, n in gone.gpu_use.items()
                  if n and i in before}
        deadline = time.monotonic() + RECOVER_SECONDS
        while wanted:
            now = await asyncio.to_thread(self._ask_driver)
            if all(now.get(i, 0) >= w for i, w in wanted.items()):
                return
            if time.monotonic() > deadline:
                log.info("the GPU memory of %s did not all come back within %g s",
                         gone.name, RECOVER_SECONDS)
                return
            await asyncio.sleep(RECOVER_POLL)

    def _start_copies(self, prepared: Prepared, loop: asyncio.AbstractEventLoop) -> Backend:
        """The model's backend: one runner, or one per copy (`--replicas`) serving as one."""
        path, name = prepared.model.path, prepared.model.name
        first = self._factory(path, prepared.options, name, loop, stop=self._stop_loads)
        if not prepared.copies:
            return first
        members = [first]
        try:
            for options in prepared.copies:
                members.append(self._factory(path, options, name, loop, stop=self._stop_loads))
        except BaseException:
            for member in members:
                member.close()
            raise
        log.info("%s: %d copies, on GPUs %s", name, len(members),
                 ", ".join(str(o.main_gpu) for o in (prepared.options, *prepared.copies)))
        return Replicas(members)

    def _gpu_room(self, asked: Mapping[int, int]) -> dict[int, int]:
        """Each usable GPU's free memory for a new model, by index: what the driver said
        (`asked`); where it said nothing (Apple's, a worker's device), what the probe found
        less what the loaded models' plans hold there."""
        taken = _per_gpu(m.gpu_use for m in self._loaded.values())
        return {g.index: asked[g.index] if g.index in asked
                else max(0, free_memory(g) - taken.get(g.index, 0))
                for g in self.hardware().usable_gpus}

    def _idle(self) -> list[LoadedModel]:
        """Models that may be unloaded to make room: no request runs on them, and the one
        that asked for each has had it."""
        now = time.monotonic()
        return [m for m in self._loaded.values()
                if not m.active and (m.claimed or now - m.loaded_at > CLAIM_SECONDS)]

    async def unload(self, name: str) -> bool:
        async with self._lock:
            model = self._loaded.pop(name, None)
        if model is None:
            return False
        self._changes += 1
        await asyncio.to_thread(model.backend.close)
        log.info("unloaded %s", name)
        return True

    def cancel_all(self) -> None:
        """Shutting down: end every request of every loaded model, and those waiting for a
        plan or a load (EngineClosed); no request starts after it. Safe from a signal."""
        self.closing = True
        # (safe from a signal handler: nothing waits on this event, so set() never finds
        # its lock held)
        self._stop_loads.set()
        for model in list(self._loaded.values()):
            model.backend.cancel_all()
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._closed.set)

    # ------------------------------------------------------------------ lifetime
    def start(self, interval: float = 1.0) -> None:
        """Unload models whose keep-alive ran out (call from the running loop)."""
        self._reaper = asyncio.create_task(self._reap(interval))

    async def _reap(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            for model in list(self._loaded.values()):
                if model.expires_in == 0:
                    await self.unload(model.name)

    async def close(self) -> None:
        if self._reaper:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        self.closing = True  # (a load a caller would start after this is refused)
        self._stop_loads.set()
        self._closed.set()
        for task in list(self._loading.values()):
            with contextlib.suppress(Exception):
                await task
        for name in list(self._loaded):
            await self.unload(name)
