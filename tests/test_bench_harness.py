"""bench/harness.py's server handling, run for real: a benchmark whose second server fails to
start leaves no first one running (a llama-server left behind keeps its memory and port)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "bench_harness", Path(__file__).resolve().parent.parent / "bench" / "harness.py")
harness = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(harness)


def test_a_server_that_fails_to_start_stops_those_started_before():
    first = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])

    def failing():
        raise RuntimeError("the server exited")

    try:
        with pytest.raises(RuntimeError, match="exited"):
            harness.start_servers({"first": lambda: (first, "http://127.0.0.1:1"),
                                   "second": failing})
        assert first.wait(timeout=30) is not None  # stopped, not left running
    finally:
        first.kill()


def test_a_benchmark_without_matplotlib_stops_before_it_measures(monkeypatch):
    """Its figures need matplotlib: missing, the parser is never made (nothing measured,
    nothing lost), and the one line says what to install."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with pytest.raises(SystemExit, match=r"pip install -e \"\.\[bench\]\""):
        harness.arguments("A benchmark.", reps=3)
    assert harness.arguments("A tool.", writes=False).parse_args([]) is not None
