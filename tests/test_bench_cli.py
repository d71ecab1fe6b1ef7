"""`localinfer bench` runs end to end on a tiny workload and writes its figures (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_bench_writes_ceiling_baseline_and_levels(tmp_path):
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, "-m", "localinfer", "bench", "--levels", "1,2", "--requests-per-client",
         "1", "--max-prompt", "48", "--max-output", "8", "--no-scenarios", "--threads", "2",
         "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert data["device"] == "CPU" and data["gpu_layers"] == 0  # no GPU here
    assert "device: CPU" in result.stdout
    assert set(data["ceiling"]) == {"1", "2"} and all(v > 0 for v in data["ceiling"].values())
    assert data["baseline"]["requests"] >= 2 and data["baseline"]["output_tokens"] > 0
    assert [lv["clients"] for lv in data["levels"]] == [1, 2]
    for level in data["levels"]:
        assert level["requests"] == level["clients"]
        assert 0 < level["output_tokens"] <= 8 * level["requests"]
        assert level["ttft_p50_s"] <= level["ttft_p99_s"]
        assert [p for p, _ in level["prompts"]] and level["bare_vs_wall"] > 0
        shares = level["llama_decode_share"], level["engine_share"], level["idle_share"]
        assert all(0 < x < 1 for x in shares) and sum(shares) == pytest.approx(1, abs=0.01)
    assert "localinfer N=2" in result.stdout and "the bare loop would need" in result.stdout
    assert "inside llama_decode" in result.stdout
    a, b = data["prefill_cost"]
    assert a * 512 + b * 512 ** 2 > 0  # reading a prompt takes time


def test_bench_rejects_bad_levels():
    result = subprocess.run([sys.executable, "-m", "localinfer", "bench", "--levels", "1,x"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "--levels" in result.stderr
