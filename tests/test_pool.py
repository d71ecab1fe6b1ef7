"""The model pool of long-running processes, on the real models."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from localinfer.backends.base import LoadOptions
from localinfer.errors import EngineBusy, EngineClosed, InvalidRequest, LocalinferError
from localinfer.pool import ModelPool, parse_keep_alive
from localinfer.runners import llama_cpp_backend
from localinfer.settings import Settings


@pytest.mark.parametrize("value,seconds", [
    (None, 300.0), ("5m", 300.0), ("1h30m", 5400.0), ("10s", 10.0), ("250ms", 0.25),
    (0, 0.0), ("0", 0.0), (42, 42.0), ("-1", None), (-1, None), ("-5m", None),
    # infinite, or longer than Ollama's longest duration (292 years): forever, as negative
    (float("inf"), None), (float("-inf"), None), (1e309, None), ("99999999999999999999h", None),
    ("9" * 30, None), (1e10, None), (9e9, 9e9),
])
def test_keep_alive_follows_ollama_rules(value, seconds):
    assert parse_keep_alive(value, 300.0) == seconds


@pytest.mark.parametrize("value", ["soon", "5 minutes", "m5", True, "", float("nan"), "nan",
                                   "NaN"])
def test_bad_keep_alive_is_refused(value):
    with pytest.raises(InvalidRequest, match="keep_alive"):
        parse_keep_alive(value, 300.0)


@pytest.fixture
def settings(tmp_path: Path, _session_store: Path) -> Settings:
    home = tmp_path / "pool-home"
    home.mkdir()
    (home / "models").symlink_to(_session_store)  # the session's assembled gemma3 file
    return Settings(home=home)


class CountingFactory:
    def __init__(self):
        self.loads: list[str] = []
        self.stops: list = []  # what each load was given to be stopped by

    def __call__(self, path, options, name, loop=None, stop=None):
        self.loads.append(name)
        self.stops.append(stop)
        return llama_cpp_backend(path, options, name)


def _pool(settings, **kw) -> tuple[ModelPool, CountingFactory]:
    factory = CountingFactory()
    return ModelPool(settings, LoadOptions(n_ctx=256), backend_factory=factory, **kw), factory


def test_concurrent_requests_share_one_load_and_names_alias(settings):
    async def scenario():
        pool, factory = _pool(settings)
        models = await asyncio.gather(pool.get("smollm2"), pool.get("smollm2:135m"),
                                      pool.get("smollm2:latest"))
        assert factory.loads == ["smollm2:135m"]
        assert models[0] is models[1] is models[2]
        assert models[0].load_duration > 0 and models[0].memory_bytes > 90_000_000
        await pool.close()
        assert pool.loaded() == []
    asyncio.run(scenario())


def test_a_closed_pool_loads_nothing_more_and_its_loads_were_told_to_stop(settings):
    """After close (the chat app quitting), a load a caller would start is refused (the
    app's fallback to its previous model had started one after close), and what its loads
    are stopped by is set (a runner's load then ends at once: tests/backends/test_runner.py)."""
    async def scenario():
        pool, factory = _pool(settings)
        await pool.get("smollm2")
        await pool.close()
        with pytest.raises(EngineClosed):
            await pool.get("gemma3")
        return factory

    factory = asyncio.run(scenario())
    assert factory.loads == ["smollm2:135m"]
    assert factory.stops[0] is not None and factory.stops[0].is_set()


def test_least_recently_used_idle_model_makes_room(settings):
    async def scenario():
        pool, factory = _pool(settings, max_loaded=1)
        async with pool.use("smollm2"):
            pass
        async with pool.use("gemma3"):
            assert [m.name for m in pool.loaded()] == ["gemma3:270m"]
        await pool.close()
        assert factory.loads == ["smollm2:135m", "gemma3:270m"]
    asyncio.run(scenario())


def test_a_busy_model_is_not_evicted(settings):
    async def scenario():
        pool, _ = _pool(settings, max_loaded=1)
        try:
            async with pool.use("smollm2"):
                with pytest.raises(EngineBusy, match="busy"):
                    await pool.get("gemma3")
                assert [m.name for m in pool.loaded()] == ["smollm2:135m"]
        finally:
            await pool.close()
    asyncio.run(scenario())


def test_keep_alive_zero_unloads_after_the_request_and_expiry_unloads_idle(settings):
    async def scenario():
        pool, _ = _pool(settings, default_keep_alive=0.2)
        pool.start(interval=0.05)
        async with pool.use("smollm2", keep_alive=0):
            assert len(pool.loaded()) == 1
        assert pool.loaded() == []
        async with pool.use("smollm2") as model:
            assert model.expires_in is None  # never expires while a request runs
        assert 0 < pool.loaded()[0].expires_in <= 0.2
        await asyncio.sleep(0.5)
        assert pool.loaded() == []
        await pool.close()
    asyncio.run(scenario())


def test_a_loaded_model_is_found_without_resolving_again(settings, monkeypatch):
    async def scenario():
        pool, factory = _pool(settings)
        first = await pool.get("smollm2")

        def no_prepare(*args, **kwargs):
            raise AssertionError("resolved and re-read the GGUF header for a loaded model")

        monkeypatch.setattr("localinfer.pool.prepare", no_prepare)
        assert await pool.get("smollm2") is first
        await pool.close()
    asyncio.run(scenario())


def test_serve_with_a_model_probes_the_hardware_once(monkeypatch):
    """Start-up checks the served model against the machine; the preload then plans with the
    same reading (each probe may run vendor tools that take seconds)."""
    from localinfer import pool as pool_module
    from localinfer import service
    from localinfer.api import server
    from localinfer.backends.native.machine import detect
    from localinfer.settings import Settings

    probes = []

    def counted():
        probes.append(1)
        return detect()

    monkeypatch.setattr(pool_module, "detect", counted)
    monkeypatch.setattr(service, "detect", counted)
    pool, _, sock = server._prepare(Settings(host="127.0.0.1", port=0), LoadOptions(n_ctx=256),
                                    "smollm2:135m")
    sock.close()

    async def preload():
        loaded = await pool.get(None)  # what the server's start does with its model
        await pool.close()
        return loaded.name

    assert asyncio.run(preload()) == "smollm2:135m"
    assert len(probes) == 1


def test_serve_loads_its_model_while_it_builds_the_app(monkeypatch):
    """`serve` starts the served model's load before it imports FastAPI and builds the app
    (~0.8 s on 2 cores): the runner loads meanwhile. It built the app first, then started
    the server, whose start began the load."""
    import threading

    from localinfer.api import server as server_module
    from localinfer.backends.runner.link import Link

    began = threading.Event()
    load = Link._load

    def loading(self, *args, **kwargs):
        began.set()
        return load(self, *args, **kwargs)

    monkeypatch.setattr(Link, "_load", loading)
    built = []
    build = server_module._server

    def server(*args, **kwargs):
        built.append(began.wait(30))  # the load began before the app was built
        built.append(build(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(server_module, "_server", server)
    thread = threading.Thread(target=server_module.serve, daemon=True, args=(
        Settings(host="127.0.0.1", port=0), LoadOptions(n_ctx=256), "smollm2:135m"))
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while len(built) < 2 or not built[1].started or not built[1].config.app.state.ready:
            assert thread.is_alive() and time.monotonic() < deadline
            time.sleep(0.05)
        assert built[0] is True
        assert [m.name for m in built[1].config.app.state.pool.loaded()] == ["smollm2:135m"]
    finally:
        if len(built) == 2:
            built[1].should_exit = True
        thread.join(60)
    assert not thread.is_alive()


def test_a_start_that_fails_before_serving_says_why_and_leaves_no_runner(monkeypatch):
    """The app cannot be built while the served model loads: the caller gets that error
    (not "the server stopped as it started"), and the load's runner is gone with the pool."""
    from localinfer.api import server as server_module
    from localinfer.backends.runner.link import Link

    runners = []
    load = Link._load

    def loading(self, *args, **kwargs):
        runners.append(self.process)
        return load(self, *args, **kwargs)

    def broken(*args, **kwargs):
        while not runners:  # (the load has begun)
            time.sleep(0.01)
        raise LocalinferError("the app could not be built")

    monkeypatch.setattr(Link, "_load", loading)
    monkeypatch.setattr(server_module, "_server", broken)
    with pytest.raises(LocalinferError, match="could not be built"):
        server_module.serve_in_thread(Settings(host="127.0.0.1", port=0),
                                      LoadOptions(n_ctx=256), "smollm2:135m")
    assert len(runners) == 1
    runners[0].wait(30)  # its pipe closed as the pool closed: it has ended


def _machine(gpu_free: int):
    """A machine as NVML reports one: an RTX 4090 with `gpu_free` bytes free, a CUDA build."""
    from localinfer.model_store.hardware import CPU, GPU, Hardware

    gpu = GPU("nvidia", 0, "NVIDIA GeForce RTX 4090", 24564 * 2**20, gpu_free, "cuda",
              "550.54.14")
    return Hardware(CPU("AMD Ryzen 9 7950X", 16, 32, ("avx2",)), 64 * 2**30, 60 * 2**30, (gpu,),
                    True)


def test_the_pool_counts_what_the_fit_check_planned(settings):
    """A quantised KV cache is counted as the fit check counts it (not as f16), for /api/ps too.
    (Flash attention on for both: a quantised cache needs it, and an f16 one on the CPU
    would otherwise run without it and hold attention scores besides.)"""
    from localinfer.service import prepare

    async def loaded(kv_type: str):
        pool, _ = _pool(settings)
        pool.options = LoadOptions(n_ctx=2048, kv_type=kv_type, n_gpu_layers=0,
                                   flash_attn=True)
        model = await pool.get("smollm2")
        await pool.close()
        return model

    f16, q8 = asyncio.run(loaded("f16")), asyncio.run(loaded("q8_0"))
    planned = prepare("smollm2", LoadOptions(n_ctx=2048, kv_type="q8_0", n_gpu_layers=0,
                                             flash_attn=True), settings)
    assert q8.memory_bytes == planned.memory_bytes and q8.gpu_bytes == 0
    kv = f16.info.kv_bytes_per_token() * 2048
    assert f16.memory_bytes - q8.memory_bytes == pytest.approx(kv - kv * 34 / 64, rel=0.01)


def test_gpu_plans_make_room_on_the_gpu(settings):
    """Two models that each fit the GPU but not together: the idle one is unloaded for the
    other; a busy one keeps its share, and the newcomer is planned on what is left."""
    from localinfer.service import prepare

    options = LoadOptions(n_ctx=256)
    alone = {name: prepare(name, options, settings, hardware=lambda: _machine(24 * 2**30))
             for name in ("smollm2", "gemma3")}
    assert all(p.options.n_gpu_layers == p.info.n_layer + 1 for p in alone.values())
    free = alone["smollm2"].gpu_bytes + alone["gemma3"].gpu_bytes - 2**20

    async def scenario():
        pool = ModelPool(settings, options, backend_factory=llama_cpp_backend,
                         hardware=_machine(free))
        try:
            first = await pool.get("smollm2")
            assert first.gpu_bytes == alone["smollm2"].gpu_bytes  # as the planner counts it
            await pool.get("gemma3")  # smollm2 is idle: it goes
            assert [m.name for m in pool.loaded()] == ["gemma3:270m"]
            await pool.unload("gemma3:270m")
            async with pool.use("smollm2"):  # busy: it stays, gemma3 gets what is left
                second = await pool.get("gemma3")
                assert {m.name for m in pool.loaded()} == {"smollm2:135m", "gemma3:270m"}
                assert second.options.n_gpu_layers < second.info.n_layer + 1
                assert second.gpu_bytes <= free - alone["smollm2"].gpu_bytes
        finally:
            await pool.close()
    asyncio.run(scenario())


def test_two_gpus_each_hold_a_model_without_unloading_the_other(settings):
    """Room is counted per GPU: with two cards that each hold either model, the second goes
    on the card the first left free, and nothing is unloaded."""
    from dataclasses import replace

    from localinfer.service import prepare

    options = LoadOptions(n_ctx=256)
    need = max(prepare(name, options, settings, hardware=lambda: _machine(24 * 2**30)).gpu_bytes
               for name in ("smollm2", "gemma3"))
    one = _machine(need + 2**20)
    two = replace(one, gpus=(one.gpus[0], replace(one.gpus[0], index=1)))

    async def scenario():
        pool = ModelPool(settings, options, backend_factory=llama_cpp_backend, hardware=two)
        try:
            first = await pool.get("smollm2")
            second = await pool.get("gemma3")
            assert {m.name for m in pool.loaded()} == {"smollm2:135m", "gemma3:270m"}
            assert {first.options.main_gpu, second.options.main_gpu} == {0, 1}
            assert set(first.gpu_use) | set(second.gpu_use) == {0, 1}
            assert second.options.n_gpu_layers == second.info.n_layer + 1
        finally:
            await pool.close()
    asyncio.run(scenario())


def test_replicas_put_a_copy_on_each_card_and_spread_the_requests(settings):
    """--replicas 2 on two cards that each hold the model: two copies, one per card, served
    as one model; two requests at once go one to each copy."""
    from dataclasses import replace

    from localinfer.backends.base import SamplingParams
    from localinfer.backends.runner.replicas import Replicas
    from localinfer.service import prepare

    from .backends.test_replicas import settled_loads

    options = LoadOptions(n_ctx=256)
    need = prepare("smollm2", options, settings, hardware=lambda: _machine(24 * 2**30)).gpu_bytes
    one = _machine(need + 2**20)
    two = replace(one, gpus=(one.gpus[0], replace(one.gpus[0], index=1)))

    async def scenario():
        pool = ModelPool(settings.model_copy(update={"replicas": 2}), options,
                         backend_factory=llama_cpp_backend, hardware=two)
        try:
            model = await pool.get("smollm2")
            copies = model.backend
            assert isinstance(copies, Replicas) and len(copies.members) == 2
            assert {m.info.n_slots for m in copies.members} == {1} and copies.info.n_slots == 2
            assert model.gpu_use == {0: need, 1: need}
            prompt = copies.tokenize("Once upon a time")
            params = SamplingParams(temperature=0, max_tokens=24)
            first, second = copies.generate(prompt, params), copies.generate(prompt, params)
            assert settled_loads(copies, [1, 1]) == [1, 1]
            assert first.text() and second.text()  # each copy answers its own
            assert copies.stats().requests_finished == 2
        finally:
            await pool.close()
    asyncio.run(scenario())


def test_a_model_just_loaded_stays_until_its_request_has_it(settings):
    """Between a load's end and its waiting request's start, another load's room-making must
    not take the model away (the request would find it unloaded)."""
    async def scenario():
        pool, _ = _pool(settings, max_loaded=1)
        try:
            # loaded; its caller not resumed yet
            await pool._load("smollm2", await pool.plan("smollm2"), pool._changes)
            with pytest.raises(EngineBusy, match="busy"):
                await pool.get("gemma3")
            assert [m.name for m in pool.loaded()] == ["smollm2:135m"]
            await pool.get("smollm2")  # its caller has it: now it may go
            await pool.get("gemma3")
            assert [m.name for m in pool.loaded()] == ["gemma3:270m"]
        finally:
            await pool.close()
    asyncio.run(scenario())


def test_two_loads_at_once_do_not_both_take_the_same_room(settings):
    """Memory for one model or the other, not both: two requests at once used to pass the
    room check together (neither loaded yet) and load both."""
    async def scenario():
        pool, factory = _pool(settings)
        need = {n: (await pool.plan(n)).ram_bytes for n in ("smollm2", "gemma3")}
        total = max(need.values()) + min(need.values()) // 2
        pool._available = lambda: total - sum(m.ram_bytes for m in pool.loaded())
        beside: list[list[str]] = []
        loads = factory.__call__

        def watched(path, options, name, loop=None, stop=None):
            beside.append([m.name for m in pool.loaded()])
            return loads(path, options, name, loop)

        pool._factory = watched
        try:
            got = await asyncio.gather(pool.get("smollm2"), pool.get("gemma3"),
                                       return_exceptions=True)
            assert len(pool.loaded()) == 1, beside
            assert beside[0] == [] and all(not others for others in beside), beside
            for result in got:  # the second waited for the first: it replaced it or was refused
                assert not isinstance(result, BaseException) or isinstance(result,
                                                                          LocalinferError)
        finally:
            await pool.close()
    asyncio.run(scenario())


def test_a_runner_that_died_holds_no_room_and_loads_again_through_the_check(settings):
    """A runner killed under a busy model frees its memory: another model may take its
    place, and the next request for it loads it again through the room check (a restart
    behind the pool's back would have added it beside the other)."""
    import os
    import signal

    from localinfer.runners import runner_backend

    async def scenario():
        pool = ModelPool(settings, LoadOptions(n_ctx=256), max_loaded=1,
                         backend_factory=runner_backend)
        try:
            async with pool.use("smollm2") as smollm2:
                os.kill(smollm2.backend.pid, signal.SIGKILL)
                for _ in range(200):
                    if smollm2.backend.ended:
                        break
                    await asyncio.sleep(0.05)
                gemma3 = await pool.get("gemma3")  # no longer "busy": its runner is gone
                assert [m.name for m in pool.loaded()] == ["gemma3:270m"]
            again = await pool.get("smollm2")  # through the check: gemma3 (idle) made room
            assert [m.name for m in pool.loaded()] == ["smollm2:135m"]
            assert again is not smollm2 and not again.backend.ended
            assert gemma3.backend.ended is False  # unloaded, not died
            assert await asyncio.to_thread(again.backend.tokenize, "hi")
        finally:
            await pool.close()
    asyncio.run(scenario())


class FakeDriver:
    """A GPU driver as NVML answers "how much is free": the card's free bytes less what the
    pool's loaded models hold and what other programs took (`elsewhere`); an unloaded
    model's memory shows free again only `lag` answers later (a runner's exit frees it a
    moment after it is told to close)."""

    def __init__(self, free: int, lag: int = 0):
        self.free, self.lag, self.elsewhere = free, lag, 0
        self.pool: ModelPool | None = None
        self.answers = 0
        self._held: dict[str, int] = {}  # model → its bytes, while it holds the card
        self._leaving: dict[str, list[int]] = {}  # unloaded model → [bytes, answers to go]

    def __call__(self) -> dict[int, int]:
        self.answers += 1
        loaded = {m.name: m.gpu_bytes for m in self.pool.loaded()}
        for name, size in self._held.items():
            if name not in loaded:
                self._leaving[name] = [size, self.lag]
        self._held = loaded
        for name, left in list(self._leaving.items()):
            if left[1] <= 0:
                del self._leaving[name]
            left[1] -= 1
        taken = sum(loaded.values()) + sum(s for s, _ in self._leaving.values())
        return {0: max(0, self.free - taken - self.elsewhere)}


def _pool_on_driver(settings, free: int, lag: int = 0) -> tuple[ModelPool, FakeDriver]:
    driver = FakeDriver(free, lag)
    pool = ModelPool(settings, LoadOptions(n_ctx=256), backend_factory=llama_cpp_backend,
                     hardware=_machine(24 * 2**30), gpu_free=driver)
    driver.pool = pool
    return pool, driver



@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="RssFile is Linux's")
def test_a_loaded_models_weights_are_not_free_ram_for_the_next(settings):
    """A runner maps its model's weights from the file, and Linux counts those pages as
    available memory. The RAM the pool plans the next model into leaves them out: counted
    free, a second model would push the first's weights out of RAM, read from the disk
    again at every step."""
    import psutil

    from localinfer.runners import runner_backend
    from localinfer.service import ram_available

    def unmapped() -> int:  # what the OS calls available and the pool does not
        return psutil.virtual_memory().available - ram_available()

    async def scenario():
        pool = ModelPool(settings, LoadOptions(n_ctx=256), backend_factory=runner_backend)
        try:
            before = unmapped()
            async with pool.use("smollm2") as smollm2:
                size = smollm2.resolved.path.stat().st_size
                if psutil.Process(smollm2.backend.pid).memory_info().shared < size // 2:
                    pytest.skip("the weights were copied out of their file (a CPU layout)")
                assert unmapped() - before >= 0.8 * size
        finally:
            await pool.close()
    asyncio.run(scenario())

def test_each_load_asks_the_driver_how_much_gpu_memory_is_free(settings):
    """The machine's probe at start said 24 GiB free; since then another program took most
    of it: the next load is planned on what the driver says now, and once that program
    gives it back, the load after gets the whole card."""
    async def scenario():
        pool, driver = _pool_on_driver(settings, 24 * 2**30)
        try:
            driver.elsewhere = 24 * 2**30 - 64 * 2**20  # 64 MiB left: no room for the layers
            first = await pool.get("smollm2")
            assert first.options.n_gpu_layers < first.info.n_layer + 1
            asked = driver.answers
            assert asked >= 2  # the plan and the room check
            driver.elsewhere = 0
            second = await pool.get("gemma3")
            assert second.options.n_gpu_layers == second.info.n_layer + 1
            assert driver.answers > asked
        finally:
            await pool.close()
    asyncio.run(scenario())


def test_after_an_unload_the_pool_waits_for_the_memory_to_come_back(settings):
    """Room on the card for one model: the idle one is unloaded for the other, and the
    load waits until the driver shows its memory free again (three answers later here),
    rather than loading into memory the driver still counts as taken."""
    from localinfer.service import prepare

    alone = {name: prepare(name, LoadOptions(n_ctx=256), settings,
                           hardware=lambda: _machine(24 * 2**30)).gpu_bytes
             for name in ("smollm2", "gemma3")}
    free = max(alone.values()) + 2**20

    async def scenario():
        pool, driver = _pool_on_driver(settings, free, lag=3)
        try:
            await pool.get("smollm2")
            before = driver.answers
            second = await pool.get("gemma3")
            assert [m.name for m in pool.loaded()] == ["gemma3:270m"]
            assert second.options.n_gpu_layers == second.info.n_layer + 1
            assert driver.answers - before >= 3 + 2  # the plan, the room check, then polled
            assert not driver._leaving  # smollm2's memory had come back before the load
        finally:
            await pool.close()
    asyncio.run(scenario())


def test_a_larger_context_loaded_serves_a_smaller_one_unless_the_gpu_would_hold_more(settings):
    """What a request's context needs is a floor: a model loaded with more serves it as it
    is (no load) while a smaller context would put no more of it on the GPU; where the
    smaller one would (the larger left layers in RAM), it is loaded again with it."""
    from localinfer.service import prepare

    def alone(n_ctx: int):
        return prepare("smollm2", LoadOptions(n_ctx=n_ctx), settings,
                       hardware=lambda: _machine(24 * 2**30))

    small, large = alone(256), alone(8192)
    layers = small.info.n_layer + 1
    assert small.options.n_gpu_layers == large.options.n_gpu_layers == layers

    async def scenario(free: int) -> tuple[list[str], list]:
        factory = CountingFactory()
        pool = ModelPool(settings, LoadOptions(n_ctx=256), backend_factory=factory,
                         hardware=_machine(free))
        try:
            first = await pool.get("smollm2", n_ctx=8192)
            then = await pool.get("smollm2")  # the server's 256
            return factory.loads, [(m.options.n_ctx, m.options.n_gpu_layers, m is first)
                                   for m in (first, then)]
        finally:
            await pool.close()

    loads, models = asyncio.run(scenario(large.gpu_bytes + 2**20))  # all of it fits at 8,192
    assert loads == ["smollm2:135m"] and models[1] == (8192, layers, True)
    between = (small.gpu_bytes + large.gpu_bytes) // 2  # at 8,192 some layers stay in RAM
    loads, models = asyncio.run(scenario(between))
    assert models[0][0] == 8192 and models[0][1] < layers
    assert len(loads) == 2 and models[1] == (256, layers, False)


def test_a_smaller_context_that_cannot_be_planned_leaves_the_loaded_model_serving(settings):
    """The model is loaded at 8,192 with some layers in RAM; planning the request's smaller
    context fails (a model file gone, say): the loaded model serves it as it is, and the
    answer is kept, not planned again for the next request."""
    from localinfer.service import prepare

    def alone(n_ctx: int):
        return prepare("smollm2", LoadOptions(n_ctx=n_ctx), settings,
                       hardware=lambda: _machine(24 * 2**30))

    between = (alone(256).gpu_bytes + alone(8192).gpu_bytes) // 2

    async def scenario():
        factory = CountingFactory()
        pool = ModelPool(settings, LoadOptions(n_ctx=256), backend_factory=factory,
                         hardware=_machine(between))
        real, refused = pool.plan, []

        async def failing(ref, n_ctx=None):
            if n_ctx == 256:
                refused.append(n_ctx)
                raise LocalinferError("the model file cannot be read")
            return await real(ref, n_ctx)

        try:
            first = await pool.get("smollm2", n_ctx=8192)
            assert first.options.n_gpu_layers <= first.info.n_layer  # (partly offloaded)
            pool.plan = failing
            served = [await pool.get("smollm2") for _ in range(2)]
            return factory.loads, all(m is first for m in served), refused
        finally:
            await pool.close()

    assert asyncio.run(scenario()) == (["smollm2:135m"], True, [256])


def test_a_context_grown_for_a_client_takes_room_only_where_it_places_as_much(settings):
    """A client's num_ctx past what is loaded: the next power of two where that keeps every
    layer on the GPU, else what was asked (as the planner rounds it)."""
    from localinfer.service import prepare

    def alone(n_ctx: int):
        return prepare("smollm2", LoadOptions(n_ctx=n_ctx), settings,
                       hardware=lambda: _machine(24 * 2**30))

    asked, roomy = alone(1100), alone(2048)
    layers = asked.info.n_layer + 1
    assert asked.options.n_ctx < 2048

    async def scenario(free: int) -> tuple[int, int]:
        pool = ModelPool(settings, LoadOptions(n_ctx=256), backend_factory=llama_cpp_backend,
                         hardware=_machine(free))
        try:
            model = await pool.get("smollm2", n_ctx=1100)
            return model.options.n_ctx, model.options.n_gpu_layers
        finally:
            await pool.close()

    assert asyncio.run(scenario(roomy.gpu_bytes + 2**20)) == (2048, layers)
    tight = (asked.gpu_bytes + roomy.gpu_bytes) // 2
    assert asyncio.run(scenario(tight)) == (asked.options.n_ctx, layers)


def test_room_to_grow_is_never_made_by_unloading_another_model(settings):
    """The power of two is taken from what is free beside the loaded models: where only
    unloading an idle one would make room for it, the context asked for is loaded, and the
    idle model stays."""
    from localinfer.service import prepare

    def alone(name: str, n_ctx: int):
        return prepare(name, LoadOptions(n_ctx=n_ctx), settings,
                       hardware=lambda: _machine(24 * 2**30))

    other, asked, roomy = alone("gemma3", 256), alone("smollm2", 1100), alone("smollm2", 2048)
    free = other.gpu_bytes + (asked.gpu_bytes + roomy.gpu_bytes) // 2

    async def scenario():
        pool = ModelPool(settings, LoadOptions(n_ctx=256), backend_factory=llama_cpp_backend,
                         hardware=_machine(free))
        try:
            await pool.get("gemma3")
            model = await pool.get("smollm2", n_ctx=1100)
            return model.options.n_ctx, {m.name for m in pool.loaded()}
        finally:
            await pool.close()

    assert asyncio.run(scenario()) == (asked.options.n_ctx, {"gemma3:270m", "smollm2:135m"})


def test_a_grown_context_that_no_longer_fits_at_load_falls_back_to_the_one_asked(settings):
    """Re-planned at load (other models came or went since), the room to grow no longer
    fits: the model loads with the context the client asked for, not a refusal; a context
    that was asked for exactly is refused as before."""
    from localinfer.errors import ContextTooLarge

    async def scenario(asked: int | None):
        pool = ModelPool(settings, LoadOptions(n_ctx=256), backend_factory=llama_cpp_backend)
        grown = await pool.plan("smollm2", 2048)
        real = pool.plan

        async def tighter(ref, n_ctx=None):
            if n_ctx == 2048:
                raise ContextTooLarge("2,048 tokens do not fit now")
            return await real(ref, n_ctx)

        pool.plan = tighter
        try:  # (planned_at -1: as if models were loaded since it was planned)
            model = await pool._load("smollm2", grown, -1, asked)
            return model.options.n_ctx
        finally:
            await pool.close()

    assert asyncio.run(scenario(1100)) == 1100
    with pytest.raises(ContextTooLarge):
        asyncio.run(scenario(None))
