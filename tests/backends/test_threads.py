"""The thread tuner on step times shaped like the measured ones (smollm2, 2 cores): idle, 2
threads 8 ms a step and 1 thread 11 ms; beside one busy process, 2 threads 25 ms, 1 thread 13."""

from __future__ import annotations

import collections
import os
import types

import pytest

from localinfer.backends.engine import threads
from localinfer.backends.engine.threads import OthersLoad, ThreadTuner, free_cores

IDLE = {2: 0.008, 1: 0.011}
BUSY = {2: 0.025, 1: 0.013}


def _run(tuner: ThreadTuner, speeds: dict[int, float], steps: int, streams: int = 1) -> list[int]:
    """Feed `steps` decode-only steps of `streams` at the speed of the count the tuner gives
    them, as the engine does."""
    counts = []
    for _ in range(steps):
        count = tuner.for_step(0, streams)
        tuner.observe(speeds[count], streams, 0)
        counts.append(count)
    return counts


def test_a_busy_neighbour_moves_decoding_to_fewer_threads_and_back_when_it_stops():
    tuner = ThreadTuner(start=2, max_threads=2, period=200)
    assert set(_run(tuner, IDLE, 300)[-50:]) == {2}  # idle: the periodic probe keeps 2
    busy = _run(tuner, BUSY, 100)
    assert busy[-1] == 1 and busy.index(1) < 15  # the slowdown is seen within a few steps
    assert _run(tuner, BUSY, 400).count(2) < 20  # probes of 2 threads under load stay short
    back = _run(tuner, IDLE, 400)
    assert back[-1] == 2  # the periodic probe finds the machine idle again


def test_each_number_of_streams_keeps_a_count_of_its_own():
    """On 2 cores one stream decodes faster with 1 thread (the other core runs what comes
    between steps), 8 streams with 2: a burst of 8 clients after a solo chat runs at 2 threads
    once its first probe is over, and the next solo reply at 1 from its first step."""
    solo, eight = {1: 0.0065, 2: 0.0075}, {1: 0.040, 2: 0.025}
    tuner = ThreadTuner(start=2, max_threads=2, period=10_000)
    assert _run(tuner, solo, 50)[-1] == 1
    burst = _run(tuner, eight, 100, streams=8)
    assert burst.count(1) == threads._PROBE_STEPS and burst[-1] == 2  # (a probe of 1 thread)
    assert set(_run(tuner, solo, 20)) == {1}
    assert set(_run(tuner, eight, 20, streams=9)) == {2}  # 8-15 streams share a count


def test_prompt_steps_and_steady_speed_change_nothing():
    tuner = ThreadTuner(start=2, max_threads=2, period=10_000)
    for _ in range(50):
        assert tuner.observe(0.5, 1, 512) is None  # a prompt chunk is not a slowdown
    counts = _run(tuner, IDLE, 500)
    # the first probe of one stream tries one thread for a few steps, and keeps two
    assert counts.count(1) == threads._PROBE_STEPS and set(counts[20:]) == {2}
    assert tuner.switches == 0


def test_a_probe_abandoned_when_the_streams_change_goes_back():
    tuner = ThreadTuner(start=2, max_threads=2, period=5)
    _run(tuner, IDLE, 5)
    assert tuner.current == 1  # the periodic probe has begun
    changes = []
    for _ in range(20):
        # every step now has 3 streams: they run with their own count, not the probe's
        assert tuner.for_step(0, 3) == 2
        changes.append(tuner.observe(IDLE[2], 3, 0))
    # and the probe's count never fills: it gives up
    assert changes == [None] * 19 + [2] and tuner.current == 2


def test_a_probe_whose_second_half_never_fills_gives_up_at_the_count_it_left():
    tuner = ThreadTuner(start=2, max_threads=2, period=5)
    _run(tuner, IDLE, 5)
    assert _run(tuner, IDLE, threads._PROBE_STEPS) == [1] * threads._PROBE_STEPS  # the trial
    assert tuner.current == 2  # back at 2 for as many steps
    changes = [tuner.observe(IDLE[2], 3, 0) for _ in range(20)]  # other streams only
    assert changes == [None] * 19 + [2] and tuner.current == 2 and tuner._probe is None


def test_cores_that_come_free_after_a_busy_load_are_taken_at_the_next_probe():
    """16 cores, 2 free at load (a neighbour was busy then): when the neighbour stops, the
    periodic probe tries all the cores other processes leave, not one more."""
    speeds = {n: 0.08 / n for n in range(1, 17)}
    free = [2]
    tuner = ThreadTuner(start=2, max_threads=16, period=100, free=lambda: free[0])
    assert set(_run(tuner, speeds, 150)) <= {1, 2}  # still busy: only one fewer is tried
    free[0] = 16
    assert _run(tuner, speeds, 150)[-1] == 16 and tuner.for_step(300) == 16
    free[0] = 12  # a neighbour takes 4 cores, and its load slows the 16 threads' steps
    busy = {n: 0.08 / min(n, 12) * (3 if n > 12 else 1) for n in range(1, 17)}
    assert _run(tuner, busy, 300)[-1] < 16


def test_prompt_steps_take_cores_that_came_free_without_any_decode_step(monkeypatch):
    """A runner that only embeds, loaded while 14 of 16 cores were busy: its pooled decodes
    (prompt-like steps) take the freed cores within _RECHECK_S, never fewer than at load."""
    from localinfer.backends.engine import threads

    clock, free = [0.0], [2]
    monkeypatch.setattr(threads.time, "monotonic", lambda: clock[0])
    tuner = ThreadTuner(start=2, max_threads=16, free=lambda: free[0])
    assert tuner.for_step(300) == 2
    free[0] = 16
    clock[0] = 1.0
    assert tuner.for_step(300) == 2  # looked again only after _RECHECK_S
    clock[0] = threads._RECHECK_S + 0.1
    assert tuner.for_step(300) == 16 and tuner.for_step(0) == 2  # decoding is the tuner's
    free[0] = 3
    clock[0] += threads._RECHECK_S + 0.1
    assert tuner.for_step(300) == 3  # a neighbour came back: the cores it leaves
    free[0] = 1
    clock[0] += threads._RECHECK_S + 0.1
    assert tuner.for_step(300) == 2  # never fewer than at load


def test_one_core_never_changes():
    tuner = ThreadTuner(start=1, max_threads=1)
    assert all(tuner.observe(0.1, 1, 0) is None for _ in range(1000))


class _Machine:
    """psutil's shapes over a clock: the machine's CPU times over all its logical CPUs, and
    each process's own; `sleep` lets `seconds` pass with `busy` logical CPUs in use, `by`
    each process's share of them."""

    Times = collections.namedtuple("scputimes", "user nice system idle iowait irq softirq "
                                   "steal guest guest_nice")

    def __init__(self, monkeypatch, cores: int, logical: int):
        import psutil

        self.t, self.busy, self.own, self.denied = 100.0, 0.0, {}, set()
        machine = self

        class Process:
            def __init__(self, pid: int | None = None):
                self.pid = os.getpid() if pid is None else pid
                if self.pid not in machine.own:
                    raise psutil.NoSuchProcess(self.pid)

            def cpu_times(self):
                if self.pid not in machine.own:
                    raise psutil.NoSuchProcess(self.pid)
                if self.pid in machine.denied:
                    raise psutil.AccessDenied(self.pid)
                return types.SimpleNamespace(user=machine.own[self.pid], system=0.0)

        self.own[os.getpid()] = 0.0
        monkeypatch.setattr(psutil, "Process", Process)
        monkeypatch.setattr(psutil, "cpu_times", lambda: self.Times(  # (Linux counts a
            **{**dict.fromkeys(self.Times._fields, 0.0), "user": self.busy,  # guest's time in
               "guest": self.busy / 2, "idle": 1e6}))  # user too)
        logical_count = logical
        monkeypatch.setattr(psutil, "cpu_count",
                            lambda logical=True: logical_count if logical else cores)
        monkeypatch.setattr("time.monotonic", lambda: self.t)
        self.load: tuple[float, dict[int, float]] = (0.0, {})
        monkeypatch.setattr("time.sleep", self.sleep)

    def sleep(self, seconds: float) -> None:
        busy, by = self.load
        self.t += seconds
        self.busy += busy * seconds
        for pid, cpus in by.items():
            if pid in self.own:
                self.own[pid] += cpus * seconds


def test_the_load_of_others_leaves_out_this_process_own(monkeypatch):
    """psutil's shapes: the machine's times over all logical CPUs, this process's own."""
    machine = _Machine(monkeypatch, cores=8, logical=8)
    load = OthersLoad()
    machine.load = (6.0, {os.getpid(): 4.0})  # 6 CPUs busy, 4 of them ours
    machine.sleep(10)
    assert load() == 6  # 8 cores less the 2 of others
    machine.load = (8.0, {os.getpid(): 8.0})  # only ours busy now
    machine.sleep(10)
    assert load() == 8


def test_a_process_of_ours_that_cannot_be_read_at_first_is_not_counted_later(monkeypatch):
    """Its whole CPU time so far, taken from one sample's difference, would have hidden every
    other process's load."""
    server = 4242
    machine = _Machine(monkeypatch, cores=2, logical=2)
    machine.own[server] = 50.0  # its CPU seconds since it started
    machine.denied.add(server)
    load = OthersLoad([server])
    machine.denied.clear()
    machine.load = (1.0, {})  # a neighbour's
    machine.sleep(0.1)
    assert load() == 1


@pytest.mark.parametrize("busy,free", [(0, 8), (4, 6), (8, 4), (12.8, 2), (16, 1)])
def test_free_cores_are_the_physical_cores_other_processes_leave(monkeypatch, busy, free):
    """8 cores with 2 threads each, as psutil reads a machine: the load is over logical CPUs,
    the answer in whole physical cores, and never none."""
    machine = _Machine(monkeypatch, cores=8, logical=16)
    machine.load = (busy, {})
    assert free_cores(0.1) == free


def test_a_runner_loading_beside_its_starting_server_does_not_count_the_server(monkeypatch):
    """A runner loads while its server still starts (imports its web stack): on 2 cores, one
    busy with the server, the runner takes both (the server named in `ours`); a process of
    anybody else's still counts, and so does a server that has gone."""
    server, neighbour = 4242, 5151
    machine = _Machine(monkeypatch, cores=2, logical=2)
    machine.own.update({server: 0.0, neighbour: 0.0})
    machine.load = (1.0, {server: 1.0})  # one CPU busy: the server's start
    assert free_cores(0.1) == 1  # (as it was: the server looked like a neighbour)
    assert free_cores(0.1, ours=[server]) == 2
    assert free_cores(0.1, ours=[server, os.getpid()]) == 2
    machine.load = (2.0, {server: 1.0, neighbour: 1.0})
    assert free_cores(0.1, ours=[server]) == 1  # another process's load is a neighbour's
    machine.load = (2.0, {os.getpid(): 1.0, neighbour: 1.0})  # this process's own counted once
    assert free_cores(0.1, ours=[server, os.getpid()]) == 1
    del machine.own[server]  # the server has ended: its pid names nobody
    machine.load = (1.0, {})
    assert free_cores(0.1, ours=[server]) == 1


def test_a_runner_counts_the_server_that_started_it_as_its_own(monkeypatch):
    """The load's count leaves out the process named by the environment a runner is started
    with (runner/spawn.py) where it is the runner's parent; a process started otherwise
    leaves out only itself."""
    from localinfer.backends import llamacpp
    from localinfer.backends.runner.spawn import _environment
    from localinfer.model_store.hardware import SERVER_PID

    asked = []
    monkeypatch.setattr(llamacpp, "free_cores", lambda ours=(): asked.append(list(ours)) or 1)
    monkeypatch.setattr(os, "getppid", os.getpid)  # this process as a runner's server
    monkeypatch.setenv(SERVER_PID, _environment()[SERVER_PID])
    llamacpp.default_threads()
    monkeypatch.setenv(SERVER_PID, str(os.getpid() + 1))  # inherited: not this one's parent
    llamacpp.default_threads()
    monkeypatch.delenv(SERVER_PID)
    llamacpp.default_threads()
    assert asked == [[os.getpid()], [], []]


def test_engine_reports_its_thread_count(smollm2):
    assert smollm2.stats().threads >= 1


def test_a_probe_weighs_its_count_against_steps_taken_beside_it_not_an_old_average():
    """One slow step (the server reading the next requests beside a lone stream) raises 2
    threads' average and starts a probe; by then the load has passed: 1 thread steps in
    15 ms, 2 in 10, and 2 stay. (Against the average, 15 ms looked faster than 17.5.)"""
    idle = {2: 0.010, 1: 0.015}
    tuner = ThreadTuner(start=2, max_threads=2, period=10_000, free=lambda: 2)
    assert _run(tuner, idle, 40)[-20:] == [2] * 20  # the first probe has kept 2
    assert _run(tuner, {2: 0.040, 1: 0.040}, 1) == [2]
    after = _run(tuner, idle, 60)
    assert after[:threads._PROBE_STEPS] == [1] * threads._PROBE_STEPS  # a probe began at once
    assert after[-40:] == [2] * 40 and tuner.current == 2


def test_a_slowdown_is_measured_against_the_last_probe_not_a_lucky_low():
    """After a probe measured 2 threads at 10 ms, a run of lucky 6-ms steps does not become
    the reference: steps of 12 ms then are no slowdown (1.35x), and no probe runs."""
    idle = {2: 0.010, 1: 0.015}
    tuner = ThreadTuner(start=2, max_threads=2, period=10_000, free=lambda: 2)
    assert _run(tuner, idle, 40)[-20:] == [2] * 20  # the first probe has measured 2
    _run(tuner, {2: 0.006, 1: 0.006}, 20)
    assert _run(tuner, {2: 0.012, 1: 0.015}, 40) == [2] * 40


def test_prompt_steps_keep_the_count_at_load_while_decoding_is_tuned_down():
    tuner = ThreadTuner(start=2, max_threads=2, period=200)  # (no periodic probe under way)
    _run(tuner, BUSY, 100)
    assert tuner.current == 1  # a neighbour moved decoding to one thread
    assert tuner.for_step(n_prompt=0) == 1
    assert tuner.for_step(n_prompt=300) == 2  # a prompt chunk keeps both cores
    one = ThreadTuner(start=1, max_threads=2)  # a core was busy at load: 1, unless tuned up
    assert one.for_step(300) == 1
    one.current = 2
    assert one.for_step(300) == 2


def test_the_engine_switches_counts_between_prompt_and_decode_steps(smollm2_path):
    from localinfer.backends.base import LoadOptions, SamplingParams
    from localinfer.backends.llamacpp import LlamaCppBackend

    backend = LlamaCppBackend(smollm2_path, LoadOptions(n_ctx=512), name="smollm2:135m")
    try:
        tuner = backend.engine.threads
        assert tuner is not None  # no --threads: the tuner chooses
        tuner.prompt, tuner.period = 2, 10_000
        tuner._chosen[threads._bucket(1)] = 1  # one stream: as a busy neighbour leaves it
        tuner.at_load, tuner._free = 2, lambda: 1  # (and keeps it, however long this takes)
        seen = []
        backend.engine.on_step = lambda s, d, p: seen.append((p > 0, backend.native.threads()))
        backend.generate(backend.tokenize("The lighthouse keeper " * 20),
                         SamplingParams(temperature=0, max_tokens=4)).text()
        assert (True, 2) in seen and (False, 1) in seen, seen
        assert all(n == (2 if prompt else 1) for prompt, n in seen), seen
    finally:
        backend.close()


def test_the_tuner_times_a_step_to_the_next_one_never_across_a_wait(smollm2_path):
    """What runs between steps is part of what the thread count costs: each step is timed
    from its start to the next step's start; a request's last step, which the engine follows
    by waiting for work, is not timed."""
    import time

    from localinfer.backends.base import LoadOptions, SamplingParams
    from localinfer.backends.llamacpp import LlamaCppBackend

    backend = LlamaCppBackend(smollm2_path, LoadOptions(n_ctx=512), name="smollm2:135m")
    try:
        tuner = backend.engine.threads
        assert tuner is not None
        events: list[tuple[str, float]] = []
        observe = tuner.observe

        def timed(seconds: float, n_decode: int, n_prompt: int) -> int | None:
            events.append(("timed", seconds))
            return observe(seconds, n_decode, n_prompt)

        tuner.observe = timed
        backend.engine.on_step = lambda seconds, d, p: events.append(("step", seconds))
        for _ in range(2):  # (ignore_eos: every reply runs to its limit on any CPU)
            backend.generate(backend.tokenize("The lighthouse keeper"),
                             SamplingParams(temperature=0, max_tokens=6,
                                            ignore_eos=True)).text()
            time.sleep(1.0)
        kinds = [kind for kind, _ in events]
        assert kinds.count("step") >= 4 and kinds.count("timed") == kinds.count("step") - 2
        for (before, step_s), (kind, cycle_s) in zip(events, events[1:]):
            if kind == "timed":  # right after the step it times, and no shorter
                assert before == "step" and step_s <= cycle_s < 1.0
    finally:
        backend.close()


def test_embeddings_run_with_the_count_prompt_steps_have_now(smollm2_path):
    """A pooled context is made once; its decodes follow the tuner, as prompt steps do."""
    import llama_cpp

    from localinfer.backends.base import LoadOptions
    from localinfer.backends.llamacpp import LlamaCppBackend

    backend = LlamaCppBackend(smollm2_path, LoadOptions(n_ctx=512), name="smollm2:135m")
    try:
        tuner = backend.engine.threads
        tuner.prompt = tuner.current = tuner.at_load = 1  # as a neighbour busy at load leaves it
        tuner._free = lambda: 1  # (and keeps it)
        backend.embed_many(["The lighthouse keeper"])
        ctx = backend.embedder._ctx
        assert llama_cpp.llama_n_threads(ctx) == 1
        tuner.current = 2  # a probe found both cores free
        backend.embed_many(["The lighthouse keeper"])
        assert backend.embedder._ctx is ctx and llama_cpp.llama_n_threads(ctx) == 2
    finally:
        backend.close()


# ---- the cores shared between localinfer's processes (CoreShare), through a real shared file

_HOLDER = """
import sys, time
from pathlib import Path
from localinfer.backends.engine.threads import CoreShare
share = CoreShare(2, Path(sys.argv[1]))
print(share.begin(int(sys.argv[2])), flush=True)  # a step that runs until killed
time.sleep(600)
"""


@pytest.fixture
def share_file(tmp_path):
    return tmp_path / "cores"


def _holder(share_file, threads: int):
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-c", _HOLDER, str(share_file), str(threads)],
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == str(threads)  # its step is running
    return process


def test_a_step_waits_for_a_core_and_both_processes_then_take_one_thread_each(share_file,
                                                                             monkeypatch):
    import threading
    import time

    from localinfer.backends.engine import threads as module

    monkeypatch.setattr(module, "_LINGER_S", 1.0)  # (however late a busy machine wakes it)
    first, second = module.CoreShare(2, share_file), module.CoreShare(2, share_file)
    assert first.begin(2) == 2  # alone: every core
    ended = threading.Timer(0.3, first.end)
    ended.start()
    assert second.begin(2) == 1  # waited for the running step, then kept one core for it
    assert second.waited_s >= 0.25 and second.waits == 1
    assert first.begin(2) == 1  # its next step sees the other's claim: no wait, one thread
    assert first.waited_s < 0.25
    first.end()
    second.end()
    time.sleep(1.1)  # the claims linger a moment after their steps, then count for nothing
    assert first.begin(2) == 2
    first.close()
    second.close()


def test_the_first_to_wait_for_a_core_is_the_first_to_run(share_file):
    import threading
    import time

    from localinfer.backends.engine.threads import CoreShare

    holder = _holder(share_file, 2)  # another process's step holds both cores
    early, late = CoreShare(2, share_file), CoreShare(2, share_file)
    ran: list[tuple[str, float, int]] = []

    def step(name: str, share: CoreShare) -> None:
        count = share.begin(2)
        ran.append((name, time.monotonic(), count))
        time.sleep(0.3)  # its step
        share.end()

    first = threading.Thread(target=step, args=("early", early))
    first.start()
    time.sleep(0.2)
    second = threading.Thread(target=step, args=("late", late))
    second.start()
    time.sleep(0.2)
    assert not ran  # both wait for the held cores
    holder.kill()
    holder.wait()
    first.join()
    second.join()
    assert [name for name, _, _ in ran] == ["early", "late"]
    assert [count for _, _, count in ran] == [1, 1]  # each left the other a core
    assert ran[1][1] - ran[0][1] < 0.25  # the later did not wait for the earlier's step


def test_a_step_that_never_ends_is_waited_for_once(share_file, monkeypatch):
    from localinfer.backends.engine import threads as module

    monkeypatch.setattr(module, "_WAIT_S", 0.3)
    holder = _holder(share_file, 2)  # a process stopped in its step, say
    try:
        share = module.CoreShare(2, share_file)
        assert share.begin(2) == 1 and share.waited_s >= 0.3
        share.end()
        assert share.begin(2) == 1 and share.waited_s < 0.1 and share.waits == 1
    finally:
        holder.kill()
        holder.wait()


def test_a_claim_whose_step_failed_to_begin_is_dropped(share_file, monkeypatch):
    from localinfer.backends.engine import threads as module

    share, other = module.CoreShare(2, share_file), module.CoreShare(2, share_file)

    def broken(*args):
        raise OSError("no /proc")

    monkeypatch.setattr(share, "others", broken)
    with pytest.raises(OSError):
        share.begin(2)
    assert other.others() == (0, 0)


def test_two_steps_claimed_at_once_take_one_core_each(share_file):
    import time

    from localinfer.backends.engine import threads as module

    first, second = module.CoreShare(2, share_file), module.CoreShare(2, share_file)
    # the first has claimed (just after the second) but not yet looked at the others
    offset = first._slot * module._SLOT.size
    module._SLOT.pack_into(first._map, offset, first._pid, first._born, -2,
                           time.monotonic() + 60, 0.0)
    assert second.begin(2) == 1 and second.waits == 0  # the earlier: no wait for the later
    assert first.begin(2) == 1


def test_a_process_killed_in_its_step_holds_no_core(share_file):
    from localinfer.backends.engine.threads import CoreShare

    holder = _holder(share_file, 2)
    share = CoreShare(2, share_file)
    try:
        assert share.others() == (2, 2)  # its step runs: every core held
    finally:
        holder.kill()
        holder.wait()
    assert share.others() == (0, 0)
    assert share.begin(2) == 2 and share.waits == 0
    again = CoreShare(2, share_file)  # and its slot is taken again, not left behind
    assert again._slot == 0 and share._slot == 1


def test_a_slot_whose_pid_now_names_another_process_counts_for_nothing(share_file):
    import os

    from localinfer.backends.engine import threads as module

    share = module.CoreShare(2, share_file)
    other = (share._slot + 1) * module._SLOT.size  # this very pid, but born at another time
    module._SLOT.pack_into(share._map, other, os.getpid(), share._born - 100, 2, 1.0, 0.0)
    assert share.others() == (0, 0)


def test_a_share_holds_steps_of_the_tuner_to_the_cores_left_and_keeps_their_time_out(share_file):
    from localinfer.backends.engine.threads import CoreShare

    holder = _holder(share_file, 1)
    try:
        tuner = ThreadTuner(start=2, max_threads=2, period=10_000,
                            share=CoreShare(2, share_file))
        assert tuner.begin(0) == 1 and tuner.for_pooled() == 1  # one core is held
        for _ in range(50):  # slow steps at the count the share allowed: not the tuner's
            assert tuner.observe(BUSY[1] * 3, 1, 0) is None
        tuner.release()
        assert tuner.current == 2 and not tuner._avg
    finally:
        holder.kill()
        holder.wait()
    assert tuner.begin(0) == 2 and tuner.for_pooled() == 2
    assert tuner.observe(IDLE[2], 1, 0) is None and (2, 1) in tuner._avg


def test_no_share_where_its_file_cannot_be_made(tmp_path, monkeypatch):
    from localinfer.backends.engine import threads as module

    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setattr(module, "share_path", lambda: blocked / "cores")
    assert module.open_share(2) is None


def test_the_engine_runs_its_steps_with_the_cores_another_process_leaves(smollm2_path,
                                                                        share_file):
    from localinfer.backends.base import LoadOptions, SamplingParams
    from localinfer.backends.engine.threads import CoreShare
    from localinfer.backends.llamacpp import LlamaCppBackend

    backend = LlamaCppBackend(smollm2_path, LoadOptions(n_ctx=512), name="smollm2:135m")
    try:
        tuner = backend.engine.threads
        assert tuner.share is not None  # the machine's share, where no --threads is given
        tuner.share.close()
        tuner.share = CoreShare(2, share_file)
        tuner.max_threads = tuner.prompt = tuner.current = tuner.at_load = 2
        tuner._free, tuner.period = (lambda: 2), 10_000  # (however busy this machine is)
        seen: list[tuple[bool, int]] = []
        backend.engine.on_step = lambda s, d, p: seen.append((p > 0, backend.native.threads()))

        def reply() -> None:
            seen.clear()
            backend.generate(backend.tokenize("The lighthouse keeper " * 20),
                             SamplingParams(temperature=0, max_tokens=4)).text()

        holder = _holder(share_file, 1)  # another process's step holds a core
        try:
            reply()
            assert {n for _, n in seen} == {1} and (True, 1) in seen, seen
        finally:
            holder.kill()
            holder.wait()
        reply()
        assert {n for _, n in seen} == {2} and (True, 2) in seen, seen
    finally:
        backend.close()


def _sharing_two_cores(backend, share_file):
    """The backend's tuner on a share of 2 cores in `share_file`, every count 2."""
    from localinfer.backends.engine.threads import CoreShare

    tuner = backend.engine.threads
    tuner.share.close()
    tuner.share = CoreShare(2, share_file)
    tuner.max_threads = tuner.prompt = tuner.current = tuner.at_load = 2
    tuner._free = lambda: 2  # (however busy this machine is)
    return tuner


def test_an_embedding_read_claims_its_cores_as_a_step_does(smollm2_path, share_file):
    """A pooled read (an embedding's or a ranking's decodes) claims its cores while it runs:
    another process sees them held and takes none beside it; and it waits while another
    process's step holds every core, as a step would."""
    import threading
    import time

    import llama_cpp

    from localinfer.backends.base import LoadOptions
    from localinfer.backends.engine.threads import CoreShare
    from localinfer.backends.llamacpp import LlamaCppBackend

    backend = LlamaCppBackend(smollm2_path, LoadOptions(n_ctx=512), name="smollm2:135m")
    try:
        tuner = _sharing_two_cores(backend, share_file)
        other = CoreShare(2, share_file)  # another process's view of the share
        assert backend.engine.call(other.others) == (2, 2)  # running, claimed: the read's
        assert other.others()[0] == 0  # (its claim ended with it)

        def refused() -> None:
            raise ValueError("a read that fails")

        with pytest.raises(ValueError):
            backend.engine.call(refused)
        assert other.others()[0] == 0  # a failed read's claim ends too

        time.sleep(0.3)  # (past the moment an ended claim lingers)
        holder = _holder(share_file, 2)  # another process's step holds both cores
        done = threading.Event()
        read = threading.Thread(target=lambda: (backend.embed_many(["The lighthouse keeper"]),
                                                done.set()))
        read.start()
        try:
            assert not done.wait(0.5)  # waiting for a core
        finally:
            holder.kill()
            holder.wait()
        assert done.wait(60)
        read.join()
        assert tuner.share.waits >= 1
        assert llama_cpp.llama_n_threads(backend.embedder._ctx) == 2  # both cores, once free
        other.close()
    finally:
        backend.close()


def test_a_draft_models_guesses_claim_the_cores_as_a_step_does(smollm2_path, share_file):
    """A draft model's decodes run on the engine's thread before the step's own: they claim
    the cores while they run, with the thread count the claim leaves them."""
    from localinfer.backends.base import LoadOptions, SamplingParams
    from localinfer.backends.engine.threads import CoreShare
    from localinfer.backends.llamacpp import LlamaCppBackend

    options = LoadOptions(n_ctx=512, draft_model=str(smollm2_path))  # (itself: same vocabulary)
    backend = LlamaCppBackend(smollm2_path, options, name="smollm2:135m")
    try:
        _sharing_two_cores(backend, share_file).period = 10**9  # (no probe of fewer threads)
        other = CoreShare(2, share_file)  # another process's view of the share
        drafter = backend.engine.speculator.drafter
        propose, seen = drafter.propose, []

        def watched(*args):
            running = other.others()[0]
            guesses = propose(*args)
            seen.append((running, drafter.native.threads()))
            return guesses

        drafter.propose = watched

        def run() -> None:
            seen.clear()
            backend.generate(backend.native.tokenize("The lighthouse keeper"),
                             SamplingParams(temperature=0, max_tokens=6)).text()

        run()
        assert seen and set(seen) == {(2, 2)}  # its claim, running, of both cores
        holder = _holder(share_file, 1)  # another process's step runs on one core
        try:
            run()
        finally:
            holder.kill()
            holder.wait()
        assert seen and set(seen) == {(2, 1)}  # the other's and its own: one thread each
        other.close()
    finally:
        backend.close()


def test_a_share_file_of_another_layout_starts_empty(share_file):
    from localinfer.backends.engine import threads as module

    share_file.write_bytes(os.urandom(module._SLOT.size * 3))  # what it was before, say
    share = module.CoreShare(2, share_file)
    assert share.others() == (0, 0) and share._slot == 0
    assert share_file.stat().st_size == module._SLOT.size * module._SLOTS


def test_only_a_model_with_layers_on_the_cpu_shares_the_cores():
    import types

    from localinfer.backends.base import LoadOptions
    from localinfer.backends.llamacpp import LlamaCppBackend

    backend = types.SimpleNamespace(native=types.SimpleNamespace(n_layer=lambda: 30))

    def share(**options):
        made = LlamaCppBackend._core_share(backend, LoadOptions(**options))
        if made is not None:
            made.close()
        return made is not None

    assert share(n_gpu_layers=0) and share(n_gpu_layers=30)  # all, or but the output, on CPU
    assert not share(n_gpu_layers=31) and not share(n_gpu_layers=999)  # every layer on a GPU
    assert share(n_gpu_layers=999, cpu_experts=(3, 4))  # a mixture's experts in RAM
    assert not share(n_gpu_layers=0, core_share=False)  # --no-core-share
