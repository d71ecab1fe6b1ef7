"""The attention probe: llama.cpp's two CPU attention kernels timed on a proxy of a model's
attention shape, in a process of its own, once per machine and shape."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from localinfer.backends.native import attention_probe
from localinfer.backends.native.attention_probe import (CHUNK, REPLY, AttentionShape, Verdict,
                                                        measure, verdict, write_proxy)
from localinfer.model_store.gguf_info import read_gguf_info

TINY = AttentionShape(n_head=4, n_head_kv=2, head_dim=32)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user cache folder of the test's own (platformdirs follows XDG_CACHE_HOME), and no
    verdicts to retry from other tests."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(attention_probe, "_recent", {})
    return tmp_path / "cache" / "localinfer" / "attention.json"


@pytest.mark.parametrize("shape", [AttentionShape(9, 3, 64),
                                   # rows of 504 and 168: no whole blocks of 32 (Q8_0's)
                                   AttentionShape(9, 3, 56)])
def test_the_proxy_has_the_shape_it_stands_for_and_llama_cpp_runs_it(tmp_path: Path, shape):
    path = tmp_path / "proxy.gguf"
    write_proxy(path, shape, layers=3)
    info = read_gguf_info(path)
    assert (info.n_head, info.n_head_kv, info.head_dim_k, info.head_dim_v, info.n_layer) == (
        shape.n_head, shape.n_head_kv, shape.head_dim, shape.head_dim, 3)
    found = measure(shape, threads=1, depth=2 * CHUNK, reps=1, layers=1)
    assert isinstance(found.flash, bool), found


def test_both_kernels_are_timed_a_turn_deep_and_the_faster_wins():
    """Real llama.cpp, both kernels: a chunk read and decode steps at each of two depths;
    a turn is the chunk and REPLY steps, per layer."""
    found = measure(TINY, threads=1, depth=2 * CHUNK, reps=3, layers=2)
    assert found.error == "" and isinstance(found.flash, bool), found
    for kernel in ("on", "off"):
        assert len(found.reads[kernel]) == 2 and len(found.steps[kernel]) == 2
        assert all(t > 0 for t in found.reads[kernel] + found.steps[kernel])
        turn = (sum(found.reads[kernel]) + REPLY * sum(found.steps[kernel])) / 2
        assert getattr(found, f"{kernel}_ms") == pytest.approx(turn, rel=1e-3)
    assert found.flash == (found.on_ms <= attention_probe.MARGIN * found.off_ms)
    assert ("flash attention on" if found.flash else "flash attention off") in found.says()


def test_a_verdict_is_measured_once_in_a_process_of_its_own_and_kept(cache: Path,
                                                                      monkeypatch, tmp_path):
    found = verdict(TINY, 1)
    assert isinstance(found.flash, bool) and found.on_ms > 0 and found.off_ms > 0, found
    kept = json.loads(cache.read_text())
    assert [Verdict(**v) for v in kept.values()] == [found]
    # asked again, it is not measured again: a probe that would now fail is never run
    ran = tmp_path / "ran"
    monkeypatch.setattr(attention_probe, "probe_command",
                        lambda: [sys.executable, "-c", f"open({str(ran)!r}, 'w'); exit(3)"])
    assert verdict(TINY, 1) == found and not ran.exists()
    # another thread count, or another shape, is another question
    assert verdict(TINY, 2).flash is None and ran.exists()


def test_a_probe_that_fails_decides_nothing_says_why_and_is_not_run_again(cache: Path,
                                                                          monkeypatch, tmp_path):
    runs = tmp_path / "runs"
    crash = ("import sys; open(sys.argv[1], 'a').write('x'); "
             "sys.stderr.write('GGML_ASSERT(kq) failed\\n'); sys.exit(134)")
    monkeypatch.setattr(attention_probe, "probe_command",
                        lambda: [sys.executable, "-c", crash, str(runs)])
    found = verdict(TINY, 1)
    assert found.flash is None and "exit status 134: GGML_ASSERT(kq) failed" in found.error
    assert found.says().startswith("flash attention off (not measured: the probe ended with")
    assert verdict(TINY, 1) == found and runs.read_text() == "x"


def test_a_probe_that_hangs_is_ended(cache: Path, monkeypatch):
    monkeypatch.setattr(attention_probe, "TIMEOUT_S", 0.5)
    monkeypatch.setattr(attention_probe, "probe_command",
                        lambda: [sys.executable, "-c", "import time; time.sleep(30)"])
    found = verdict(TINY, 1)
    assert found.flash is None and found.error == "the probe took over 0 s"


def test_a_cache_of_another_layout_is_measured_again(cache: Path, monkeypatch):
    cache.parent.mkdir(parents=True)
    key = attention_probe._key(TINY, 1)
    cache.write_text(json.dumps({key: {"flash": True, "faster": 2}}))
    monkeypatch.setattr(attention_probe, "probe_command",
                        lambda: [sys.executable, "-c", "exit(1)"])
    assert attention_probe.cached(TINY, 1) is None
    assert verdict(TINY, 1).flash is None
    assert json.loads(cache.read_text())[key]["flash"] is None


def test_the_bundles_entry_point_runs_the_probe(cache: Path, tmp_path: Path, monkeypatch):
    """In the bundled app sys.executable is localinfer itself, and `__attention_probe__`
    makes it the probe (packaging/localinfer_main.py); a script stands in for it here."""
    import stat

    main = Path(__file__).resolve().parents[2] / "packaging" / "localinfer_main.py"
    bundle = tmp_path / "localinfer"
    bundle.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{main}" "$@"\n')
    bundle.chmod(bundle.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", str(bundle))
    assert attention_probe.probe_command() == [str(bundle), "__attention_probe__"]
    found = verdict(TINY, 1)
    assert isinstance(found.flash, bool) and found.on_ms > 0, found


def test_a_cache_folder_that_cannot_be_made_still_gets_a_verdict(tmp_path: Path, monkeypatch):
    """A file where the cache folder should be: the load is measured all the same (and
    nothing is kept), never failed for it."""
    (tmp_path / "cache").write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    found = verdict(TINY, 1)
    assert isinstance(found.flash, bool) and found.on_ms > 0, found


def test_two_loads_at_once_run_one_probe(cache: Path, tmp_path: Path, monkeypatch):
    """Two probes at once would time each other: the second load waits for the first's
    verdict and takes it."""
    from concurrent.futures import ThreadPoolExecutor

    runs = tmp_path / "runs"
    said = json.dumps({"flash": True, "on_ms": 1.0, "off_ms": 2.0})
    slow = (f"import sys, time; open(sys.argv[1], 'a').write('x'); time.sleep(0.5); "
            f"print({said!r})")
    monkeypatch.setattr(attention_probe, "probe_command",
                        lambda: [sys.executable, "-c", slow, str(runs)])
    with ThreadPoolExecutor(2) as pool:
        both = list(pool.map(lambda _: verdict(TINY, 1), range(2)))
    assert both == [Verdict(True, 1.0, 2.0)] * 2 and runs.read_text() == "x"


def test_a_busy_cpu_gives_no_verdict_and_the_next_load_measures_again(cache: Path, monkeypatch,
                                                                      tmp_path):
    """Timing both kernels past the budget (other work holds the CPU) says nothing of this
    machine: the load goes on without flash attention's verdict, and none is kept."""
    busy = measure(TINY, threads=1, depth=2 * CHUNK, reps=3, layers=2, budget_s=0.001)
    assert busy.flash is None and busy.retry, busy
    assert busy.says() == ("flash attention off (not measured: the CPU was too busy to time "
                           "both kernels within 0.001 s; measured again at the next load)")
    runs = tmp_path / "runs"
    said = json.dumps(asdict(busy))
    monkeypatch.setattr(attention_probe, "probe_command", lambda: [
        sys.executable, "-c", f"import sys; open(sys.argv[1], 'a').write('x'); print({said!r})",
        str(runs)])
    assert verdict(TINY, 1) == busy and verdict(TINY, 1) == busy
    assert runs.read_text() == "x" and not cache.exists()  # not again at once
    monkeypatch.setattr(attention_probe, "RETRY_AFTER_S", 0.0)
    assert verdict(TINY, 1) == busy and runs.read_text() == "xx" and not cache.exists()


def test_the_budget_is_for_the_whole_timing_not_one_decode():
    """A budget longer than any one decode of a run but shorter than all of them is past:
    it was checked against each decode alone, so a CPU busy enough to double every step
    still gave a verdict."""
    full = measure(TINY, threads=1, depth=2 * CHUNK, reps=3, layers=2)
    longest = max(t for times in (*full.reads.values(), *full.steps.values()) for t in times)
    busy = measure(TINY, threads=1, depth=2 * CHUNK, reps=3, layers=2,
                   budget_s=1.2 * longest / 1000)
    assert busy.flash is None and busy.retry, (longest, busy)


@pytest.mark.parametrize("failing, said", [
    ("decode", "llama_decode returned 1"),
    ("forget", "llama.cpp kept a decoded token it was asked to drop")])
def test_a_refused_decode_or_removal_decides_nothing(monkeypatch, capsys, failing, said):
    """llama.cpp's answers are checked, never assumed: a decode that fails, or a removal
    refused (the decode-step timings would then be read deeper each time), is the probe's
    error, not a verdict. (Neither fails on a proxy here: their refusals are made up.)"""
    from localinfer.backends.native.model import NativeModel

    if failing == "decode":
        monkeypatch.setattr(NativeModel, "decode", lambda self, batch: 1)
    else:
        monkeypatch.setattr(NativeModel, "forget", lambda self, *a: False)
    assert attention_probe.main(["4", "2", "32", "1"]) == 0
    found = Verdict(**json.loads(capsys.readouterr().out))
    assert found.flash is None and found.error == said and not found.retry
