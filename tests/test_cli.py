"""`localinfer run` as a user runs it: a real process, real model, real exit codes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from localinfer.service import usable_cpus

RUN = [sys.executable, "-m", "localinfer", "run"]


def _run(*args: str, stdin: str | None = None, timeout: float = 120,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*RUN, *args], input=stdin if stdin is not None else "",
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_console_script_answers_with_a_stats_line():
    # the script pip installed beside this interpreter (PATH shims may not be refreshed yet)
    exe = Path(sys.executable).with_name("localinfer")
    assert exe.is_file(), "the console script is not installed"
    result = subprocess.run([str(exe), "run", "--prompt", "What is the capital of France?",
                             "--max-tokens", "16", "--temperature", "0"],
                            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert "TTFT" in result.stderr and "tok/s" in result.stderr
    assert "llama_model_loader" not in result.stderr  # llama.cpp's log is hidden by default


def test_piped_stdin_is_the_prompt():
    result = _run("--max-tokens", "8", "--seed", "3", stdin="Say hi.")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() and "generated 8 tok" in result.stderr


def test_gemma3_by_name():
    result = _run("gemma3:270m", "-p", "The capital of France is", "--max-tokens", "6",
                  "--temperature", "0")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()


def test_a_reply_without_a_limit_stops_at_the_default_cap():
    """A base model writes until the context is full: minutes of it, without a cap."""
    result = _run("gemma3:270m", "-p", "Once upon a time", "--temperature", "0",
                  env={"LOCALINFER_MAX_TOKENS": "6"})
    assert result.returncode == 0, result.stderr
    assert "generated 6 tok" in result.stderr and "finish: length" in result.stderr
    result = _run("gemma3:270m", "-p", "Once upon a time", "--temperature", "0",
                  "--max-tokens", "9", env={"LOCALINFER_MAX_TOKENS": "6"})
    assert "generated 9 tok" in result.stderr  # the option wins
    result = _run("-p", "Hi", env={"LOCALINFER_MAX_TOKENS": "lots"})
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1
    assert "LOCALINFER_MAX_TOKENS" in result.stderr


def test_verbose_shows_llama_cpp_log():
    result = _run("-p", "hi", "--max-tokens", "2", "--verbose")
    assert result.returncode == 0
    assert "llama_model_loader" in result.stderr


@pytest.mark.parametrize("args, message", [
    (["lama3"], "model 'lama3' not found — did you mean 'llama3'"),  # catalog names count
    (["./missing/model.gguf"], "no model file at './missing/model.gguf'"),
    (["--ctx", "100000"], "more than the 8192 'smollm2:135m' was trained for"),
    (["--draft-model", "nope"], "model 'nope' not found"),
    (["--draft-model", "gemma3:270m"], "the draft model's vocabulary is not the model's"),
    # (1,000 threads on 2 cores answered at 0.3 tokens/s, with no word of why)
    (["--threads", str(usable_cpus() + 1)],
     f"is more than the {usable_cpus()} CPUs this machine runs at once"),
])
def test_bad_input_is_one_line_and_exit_1(args, message):
    result = _run(*args, "-p", "hi")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ")
    assert message in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("which", ["reranker", "embedding"])
def test_a_model_that_writes_no_text_is_refused_before_it_loads(which):
    """A reranker's runner was aborted by llama.cpp when asked to chat, and an embedding
    model wrote noise: `run` now says in one line where such a model's requests go."""
    from .families import embedding_model, reranker_model

    path = reranker_model("bert") if which == "reranker" else embedding_model()
    result = _run(str(path), "-p", "hi", "--max-tokens", "2", "-v")
    assert result.returncode == 1
    route = "/v1/rerank" if which == "reranker" else "/v1/embeddings"
    assert f"does not chat — serve it (localinfer serve) and send its requests to {route}" in (
        result.stderr.strip().splitlines()[-1])
    assert "llama_model_load" not in result.stderr  # (refused before llama.cpp read it)


def test_file_that_is_not_gguf(tmp_path):
    fake = tmp_path / "fake.gguf"
    fake.write_text("not a model")
    result = _run(str(fake), "-p", "hi")
    assert result.returncode == 1 and "does not start with the GGUF magic" in result.stderr
    # the draft model's header is read too, while its memory is planned
    result = _run("--draft-model", str(fake), "-p", "hi")
    assert result.returncode == 1 and "does not start with the GGUF magic" in result.stderr
    assert "Traceback" not in result.stderr


def test_truncated_file(tmp_path, smollm2_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(smollm2_path.read_bytes()[:10_000_000])
    result = _run(str(cut), "-p", "hi")
    assert result.returncode == 1 and "truncated" in result.stderr
    assert "Traceback" not in result.stderr


def test_prompt_longer_than_context():
    result = _run("--ctx", "256", stdin="word " * 1000)
    assert result.returncode == 1
    assert "but the context holds 256 — raise --ctx or shorten the prompt" in result.stderr


def test_empty_pipe_and_bad_option_values():
    assert "nothing to answer" in _run(stdin="").stderr
    bad = _run("--temperature", "-1", "-p", "hi")
    assert bad.returncode == 2 and "Invalid value for '--temperature'" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_valid_gguf_that_llama_cpp_cannot_load(tmp_path):
    """Passes our header checks (magic, tensor table, sizes) but names an unknown architecture."""
    import gguf
    import numpy as np

    path = tmp_path / "alien.gguf"
    writer = gguf.GGUFWriter(str(path), "alienformer")
    writer.add_context_length(512)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    result = _run(str(path), "-p", "hi")
    assert result.returncode == 1
    assert "llama.cpp could not load" in result.stderr and "--verbose" in result.stderr
    assert "Traceback" not in result.stderr


def test_show_lists_the_plans_memory_part_by_part():
    import json

    shown = subprocess.run([sys.executable, "-m", "localinfer", "show", "smollm2:135m", "--ctx",
                            "2048", "--json"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    facts = json.loads(shown.stdout)
    plan = facts["plan"]
    assert set(plan["memory"]) == {"weights", "kv_cache", "output_buffer", "compute", "runtime",
                                   "margin"}
    assert sum(plan["memory"].values()) == plan["memory_bytes"]
    assert plan["memory"]["kv_cache"] == facts["kv_bytes_per_token"] * 2048
    assert plan["device"] == "cpu" and plan["gpu_bytes"] == 0 and plan["memory"]["runtime"] == 0
    # the sentence and the figure are one number (it said 0.3 GiB of a 0.55 GiB plan)
    assert f"in {plan['memory_bytes'] / 2**30:.1f} GiB of" in plan["reason"]
    text = subprocess.run([sys.executable, "-m", "localinfer", "show", "smollm2:135m"],
                          capture_output=True, text=True, timeout=60).stdout
    assert "memory: weights" in text and "kv cache" in text
    # each part in the unit that reads best: a small model's output buffer is not "0.00 GiB"
    assert re.search(r"\+ output buffer [1-9][\d.]* [KM]iB \+ .* = [1-9][\d.]* MiB\n", text), text
    # with no --ctx, the plan is for the context `run` gives (it planned 8192 against run's 4096)
    default = json.loads(subprocess.run(
        [sys.executable, "-m", "localinfer", "show", "smollm2:135m", "--json"],
        capture_output=True, text=True, timeout=60).stdout)
    assert default["plan"]["n_ctx"] == 4096 < default["context_length"]
    assert facts["chat_template"] is True and "base model" not in text
    base = subprocess.run([sys.executable, "-m", "localinfer", "show", "gemma3:270m"],
                          capture_output=True, text=True, timeout=60).stdout
    assert "likely a base model" in base  # its file carries no chat template


def test_show_plans_the_context_run_would_load_and_says_it():
    def show(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "localinfer", "show", "smollm2:135m",
                               *args], capture_output=True, text=True, timeout=60)

    text = show("--ctx", "2000", "--parallel", "4").stdout
    assert "context: 2,000 tokens for each of 4 sequences" in text
    # a context beyond the trained one: `run` refuses it, and `show` planned it quietly at 8192
    beyond = show("--ctx", "100000")
    assert beyond.returncode == 0 and "memory:" not in beyond.stdout
    assert ("plan: a context of 100000 tokens is more than the 8192 'smollm2:135m' was trained "
            "for — use --ctx 8192 or less") in beyond.stdout
    # sequences past the server's bound (it planned 100,000 of them and said "no quant fits
    # at 4096 tokens")
    many = show("--parallel", "100000")
    assert many.returncode == 2 and "--parallel" in many.stderr
    squeezed = show("--parallel", "64", "--ram", "1GiB", "--ctx", "8192").stdout
    assert "no quant fits at 8192 tokens for each of 64 sequences" in squeezed
    assert "fewer sequences at once (--parallel)" in squeezed


def test_piped_text_that_is_not_utf8_is_one_clear_line():
    result = subprocess.run([*RUN, "--max-tokens", "2"], input=b"\xff\xfe x",
                            capture_output=True, timeout=120)
    err = result.stderr.decode()
    assert result.returncode == 1 and "not UTF-8" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_home_that_cannot_be_written_is_one_clear_line(tmp_path):
    """gemma3 is assembled into the models folder on first use: a file where the home
    should be makes that fail."""
    import os

    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    result = subprocess.run([*RUN, "gemma3:270m", "--prompt", "hi", "--max-tokens", "1"],
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "LOCALINFER_HOME": str(blocked)})
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "LOCALINFER_HOME" in result.stderr and str(blocked) in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_code_completion_from_the_terminal(tmp_path):
    """`run MODEL --prefix FILE --suffix FILE`: a code model (a random-weight Qwen2.5-Coder,
    tests/families.py) writes what goes between; a model without FIM tokens says so."""
    from .families import QWEN_CODER_ADDED, family_model

    coder = family_model("Qwen-Qwen2.5-7B-Instruct", "qwen2", QWEN_CODER_ADDED, "-coder")
    (tmp_path / "before.py").write_text("def add(a, b):\n    return ")
    (tmp_path / "after.py").write_text("\n\nprint(add(1, 2))\n")
    result = _run(str(coder), "--prefix", str(tmp_path / "before.py"), "--suffix",
                  str(tmp_path / "after.py"), "--max-tokens", "6", "--temperature", "0")
    assert result.returncode == 0, result.stderr
    # (what a random model writes may be control tokens, which show as nothing)
    shown = re.search(r"prompt (\d+) tok .* generated [1-6] tok", result.stderr)
    assert shown and int(shown.group(1)) > 20, result.stderr  # the file around the cursor
    refused = _run("smollm2:135m", "--prefix", str(tmp_path / "before.py"))
    assert refused.returncode == 1 and "fill-in-the-middle" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    missing = _run("smollm2:135m", "--prefix", str(tmp_path / "nope.py"))
    assert missing.returncode == 1 and "cannot read" in missing.stderr
    (tmp_path / "latin1.py").write_bytes(b"caf\xe9 = 1\n")
    binary = _run("smollm2:135m", "--prefix", str(tmp_path / "latin1.py"))
    assert binary.returncode == 1 and "is not UTF-8 text" in binary.stderr


def test_show_says_which_attention_kernel_this_cpu_measured_faster(tmp_path, monkeypatch):
    """A model on the CPU: `show` says what the attention probe measured for its shape at
    its first load, and that it will be measured before one."""
    import json

    from localinfer.backends.base import LoadOptions
    from localinfer.model_store.gguf_info import read_gguf_info
    from localinfer.model_store.sources import resolve
    from localinfer.service import cpu_kernel

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def show() -> str:
        done = subprocess.run([sys.executable, "-m", "localinfer", "show", "smollm2:135m",
                               "--ctx", "2048"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "attention: flash attention on or off: measured at the first load" in show()
    info = read_gguf_info(resolve("smollm2:135m", tmp_path / "store").path)
    found = cpu_kernel(info, LoadOptions())  # as a load measures it, in a probe process
    assert isinstance(found.flash, bool)
    line = next(line for line in show().splitlines() if "attention: " in line)
    assert line == f"  attention: {found.says()}"
    assert f"flash attention {'on' if found.flash else 'off'} (measured on this CPU" in line
    kept = json.loads((tmp_path / "cache" / "localinfer" / "attention.json").read_text())
    assert len(kept) == 1 and "|9/3x64" in next(iter(kept))
