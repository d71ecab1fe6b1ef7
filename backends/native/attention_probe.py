"""Whether llama.cpp's flash attention is the faster kernel on this CPU for a model's
attention shape: measured once by llama.cpp itself, in a process of its own, and kept.

llama.cpp turns flash attention on wherever a device has it, a CPU included. On a CPU it is
not the faster kernel everywhere: on a 2-core Xeon, SmolLM2's shape decoded 2,048 tokens
deep at half the speed with it (bench/results/deep_decode.md); on a 2-core EPYC the same
build was as fast or faster with it at every depth, and read prompts 1.3x as fast
(bench/results/epyc_2core/deep_decode.md). A rule cannot serve both, so it is measured.

The probe runs a proxy of the model: a few llama layers with its query heads, KV heads and
head size, and nothing else of weight (a 64-wide residual stream, a 32-wide FFN, a vocabulary
of 256), so that what the two kernels do differently is nearly all that its step time holds.
With each kernel, alternately, it reads a 512-token chunk ending 512 and `DEPTH` tokens deep
and decodes one token there `REPS` times: a chat turn at each depth is the chunk and
`REPLY` decode steps. Flash attention wins unless its turns take `MARGIN` times as long.
It takes 1-5 s on 2 cores, once per CPU model, llama.cpp build, thread count and attention
shape (the cache is a JSON file in the user's cache folder). A probe that fails says so and
decides nothing; one that a busy CPU slows past `BUDGET_S` decides nothing for now.

How far the proxy stands for the model (llama-bench, 2-core EPYC, SmolLM2's shape, 2,048
deep): it reads prompts as the model does (flash attention 1.48x as fast in a 30-layer
proxy, 1.23x in the model) but overstates what the kernel costs a decode step, since its KV
stays in the CPU's cache where the model's weights would push it out between layers (proxy
0.88x as fast with it, model 1.05x). Where the kernels are near a tie the verdict may fall
either way, at little cost; a Xeon's 2x slower deep decode would dominate any turn.

    python -m localinfer.backends.native.attention_probe HEADS KV_HEADS HEAD_DIM THREADS
"""

from __future__ import annotations

import functools
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import platformdirs
from filelock import FileLock, Timeout

from localinfer.files import write_atomically
from localinfer.model_store.hardware import cpu_model

__all__ = ["AttentionShape", "Verdict", "cached", "measure", "probe_command", "verdict"]

log = logging.getLogger(__name__)

DEPTH = 2048  # the deep turn's depth: a chat some turns in
CHUNK = 512  # a prompt's micro-batch
REPLY = 128  # a turn's reply, in decode steps
REPS = 9  # decode steps timed per kernel and depth (their median counts)
LAYERS = 8
# the two kernels' timing may take this long; past it the CPU is busy with other work (two
# threads a kernel on 2 cores shared with a test suite took 30 s): the load goes on without
# a verdict, and the next one measures again
BUDGET_S = 10.0
TIMEOUT_S = 60.0
RETRY_AFTER_S = 600.0  # a verdict to retry stands this long in the process that got it
# flash attention (llama.cpp's own choice) stays unless its turn is this much slower: the
# proxy overstates what it costs a decode step (see above). Measured here: SmolLM2's shape
# 0.93-0.96x, Llama-3.2-1B's 1.01-1.20x (the model itself decoded and read faster with it
# in localinfer serve), Gemma-3-270M's 1.23-1.25x, Llama-3.1-8B's 1.30x; a Xeon's deep decode
# at half the speed puts a turn well past 2x
MARGIN = 1.25
_VERSION = 3  # of the measurement and its rule: a cache written by another is measured again


@dataclass(frozen=True)
class AttentionShape:
    n_head: int
    n_head_kv: int
    head_dim: int

    def key(self) -> str:
        return f"{self.n_head}/{self.n_head_kv}x{self.head_dim}"


@dataclass(frozen=True)
class Verdict:
    """flash: whether flash attention won (None: the probe failed, `error` says why);
    on_ms, off_ms: a turn at each depth (a chunk read, REPLY decode steps) with each kernel,
    per proxy layer; reads and steps: each kernel's chunk and decode-step times, ms, per depth;
    retry: it says nothing of this machine (its CPU was busy): not kept."""
    flash: bool | None
    on_ms: float = 0.0
    off_ms: float = 0.0
    reads: dict[str, list[float]] | None = None
    steps: dict[str, list[float]] | None = None
    error: str = ""
    retry: bool = False

    def says(self) -> str:
        """The verdict in words, for the log and `show`."""
        if self.flash is None:
            again = "; measured again at the next load" if self.retry else ""
            return f"flash attention off (not measured: {self.error}{again})"
        ratio = self.on_ms / self.off_ms if self.off_ms else 0.0
        return (f"flash attention {'on' if self.flash else 'off'} (measured on this CPU: a "
                f"turn's attention takes {ratio:.2f}x as long with it as without)")


def _cache_path() -> Path:
    return platformdirs.user_cache_path("localinfer") / "attention.json"


@functools.cache
def _machine() -> str:
    """The CPU model, llama.cpp's version and a digest of what its build says it uses (SIMD,
    OpenMP, repacking: another build of the same version has other kernels); asked once a
    process (each load looks its verdict up)."""
    import hashlib
    from importlib.metadata import version

    import llama_cpp

    from localinfer.backends.native.ggml import ensure_loaded

    ensure_loaded()
    said = llama_cpp.llama_print_system_info()
    return (f"{cpu_model()}|llama.cpp {version('llama_cpp_python')} "
            f"({hashlib.sha1(said).hexdigest()[:10]})")


def _key(shape: AttentionShape, threads: int) -> str:
    return f"v{_VERSION}|{_machine()}|{threads} threads|{shape.key()}"


def _read_cache() -> dict:
    try:
        data = json.loads(_cache_path().read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def cached(shape: AttentionShape, threads: int) -> Verdict | None:
    """The verdict measured before on this machine, None if none was."""
    found = _read_cache().get(_key(shape, threads))
    try:
        return Verdict(**found) if isinstance(found, dict) else None
    except TypeError:  # another layout: measured again
        return None


_recent: dict[str, tuple[float, Verdict]] = {}  # verdicts to retry, and when they came


def verdict(shape: AttentionShape, threads: int) -> Verdict:
    """The cached verdict, else one measured now in a process of its own and cached (one to
    retry is measured again only RETRY_AFTER_S later: a busy CPU costs a load's time once)."""
    found = cached(shape, threads)
    if found is not None:
        return found
    key = _key(shape, threads)
    if key in _recent and time.monotonic() - _recent[key][0] < RETRY_AFTER_S:
        return _recent[key][1]
    found = _locked(shape, threads)
    if found.retry:
        _recent[key] = time.monotonic(), found
    return found


def _locked(shape: AttentionShape, threads: int) -> Verdict:
    path = _cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # one probe at a time on this machine: two at once would time each other
        with FileLock(str(path) + ".lock", timeout=TIMEOUT_S * 2):
            found = cached(shape, threads)  # (measured meanwhile by another load)
            return found if found is not None else _measured(shape, threads, path)
    except Timeout:
        return Verdict(None, error="another load's probe did not end", retry=True)
    except OSError as exc:  # no cache folder to keep it in: measured all the same
        log.warning("the attention probe's cache folder %s: %s", path.parent, exc)
        return _measured(shape, threads, path)


def _measured(shape: AttentionShape, threads: int, path: Path) -> Verdict:
    command = probe_command() + [str(shape.n_head), str(shape.n_head_kv), str(shape.head_dim),
                                 str(threads)]
    env = {**os.environ, "GGML_NO_BACKTRACE": "1"}
    try:
        done = subprocess.run(command, capture_output=True, timeout=TIMEOUT_S, env=env,
                              stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            last = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
            from localinfer.backends.runner.spawn import how

            result = Verdict(None, error=f"the probe ended with {how(done.returncode)}: "
                                         f"{last[0][:200]}")
        else:
            result = Verdict(**json.loads(done.stdout))
    except subprocess.TimeoutExpired:
        result = Verdict(None, error=f"the probe took over {TIMEOUT_S:.0f} s")
    except (OSError, ValueError, TypeError) as exc:
        result = Verdict(None, error=f"the probe could not run: {exc}")
    log.info("attention kernel for %s heads at %d threads: %s", shape.key(), threads,
             result.says())
    if result.retry:
        return result
    try:  # a failure is kept too: it would fail, and cost its time, at every load
        data = _read_cache()
        data[_key(shape, threads)] = asdict(result)
        write_atomically(path, json.dumps(data, indent=1))
    except OSError as exc:
        log.warning("could not keep the attention probe's result in %s: %s", path, exc)
    return result


def probe_command() -> list[str]:
    """The probe's command: the bundled app's own executable, or this module."""
    if getattr(sys, "frozen", False):
        return [sys.executable, "__attention_probe__"]
    return [sys.executable, "-m", "localinfer.backends.native.attention_probe"]


def write_proxy(path: Path, shape: AttentionShape, layers: int = LAYERS) -> None:
    """A GGUF of `layers` llama layers with `shape`'s attention and little else, random F16
    weights (what they say does not change what a step costs; F16 takes rows of any length,
    as 9 heads of 56 make)."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(0)
    n_embd, n_ff, n_vocab = 64, 32, 256
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("attention probe")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_block_count(layers)
    writer.add_context_length(1 << 17)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(500000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_tokenizer_model("llama")
    # (a byte token for "\n": llama.cpp's SPM vocabulary looks for one)
    writer.add_token_list([b"<unk>", b"<s>", b"</s>", b"<0x0A>"]
                          + [b"t%d" % i for i in range(n_vocab - 4)])
    writer.add_token_scores([0.0] * n_vocab)
    writer.add_token_types([2, 3, 3, 6] + [1] * (n_vocab - 4))

    def matrix(name: str, rows: int, cols: int) -> None:
        writer.add_tensor(name, (rng.standard_normal((rows, cols)) * 0.02).astype(np.float16))

    def norm(name: str) -> None:
        writer.add_tensor(name, np.ones(n_embd, dtype=np.float32))

    q, kv = shape.n_head * shape.head_dim, shape.n_head_kv * shape.head_dim
    matrix("token_embd.weight", n_vocab, n_embd)
    for i in range(layers):
        norm(f"blk.{i}.attn_norm.weight")
        matrix(f"blk.{i}.attn_q.weight", q, n_embd)
        matrix(f"blk.{i}.attn_k.weight", kv, n_embd)
        matrix(f"blk.{i}.attn_v.weight", kv, n_embd)
        matrix(f"blk.{i}.attn_output.weight", n_embd, q)
        norm(f"blk.{i}.ffn_norm.weight")
        matrix(f"blk.{i}.ffn_gate.weight", n_ff, n_embd)
        matrix(f"blk.{i}.ffn_up.weight", n_ff, n_embd)
        matrix(f"blk.{i}.ffn_down.weight", n_embd, n_ff)
    norm("output_norm.weight")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def measure(shape: AttentionShape, threads: int, depth: int = DEPTH, reps: int = REPS,
            layers: int = LAYERS, budget_s: float = BUDGET_S) -> Verdict:
    """Both kernels measured here, alternately, on a proxy of `shape` (see the module),
    within `budget_s` seconds of timing (past them: a verdict to `retry`)."""
    from localinfer.backends.native.model import ModelLoadFailed, NativeModel

    if depth % CHUNK or depth < 2 * CHUNK:
        raise ValueError(f"depth must be a multiple of {CHUNK}, at least {2 * CHUNK}")
    with tempfile.TemporaryDirectory(prefix="localinfer-probe-") as folder:
        path = Path(folder) / "proxy.gguf"
        write_proxy(path, shape, layers)
        models = {}
        try:
            for name, flash in (("on", True), ("off", False)):
                models[name] = NativeModel(str(path), depth + 64, 1, CHUNK, threads,
                                           flash_attn=flash)
            return _timed(models, depth, reps, layers, budget_s)
        except ModelLoadFailed as exc:
            return Verdict(None, error=str(exc))
        finally:
            for model in models.values():
                model.close()


class _Busy(Exception):
    pass


def _timed(models: dict, depth: int, reps: int, layers: int, budget_s: float) -> Verdict:
    batch = models["on"].batch(CHUNK)
    timing = time.perf_counter()  # (the budget is for all of it, not one decode)
    reads: dict[str, list[float]] = {name: [] for name in models}
    steps: dict[str, list[float]] = {name: [] for name in models}
    try:
        def run(model, start: int, n: int) -> float:
            batch.n_tokens = n
            for i in range(n):
                batch.token[i] = 4 + (start + i) % 250
                batch.pos[i] = start + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = i == n - 1
            began = time.perf_counter()
            rc = model.decode(batch)
            took = (time.perf_counter() - began) * 1000
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
            if time.perf_counter() - timing > budget_s:
                raise _Busy
            return took

        for end in range(CHUNK, depth + 1, CHUNK):
            for name, model in models.items():
                took = run(model, end - CHUNK, CHUNK)
                if end in (CHUNK, depth):
                    reads[name].append(took)
            if end not in (CHUNK, depth):
                continue
            times: dict[str, list[float]] = {name: [] for name in models}
            for _ in range(reps):
                for name, model in models.items():
                    times[name].append(run(model, end, 1))
                    if not model.forget(0, end, -1):
                        raise RuntimeError("llama.cpp kept a decoded token it was asked to drop")
            for name in models:
                steps[name].append(statistics.median(times[name]))
    except _Busy:
        return Verdict(None, error=f"the CPU was too busy to time both kernels within "
                                  f"{budget_s:g} s", retry=True)
    finally:
        models["on"].free_batch(batch)
    turn = {name: (sum(reads[name]) + REPLY * sum(steps[name])) / layers for name in models}
    return Verdict(turn["on"] <= MARGIN * turn["off"], round(turn["on"], 3),
                   round(turn["off"], 3),
                   {k: [round(t, 3) for t in v] for k, v in reads.items()},
                   {k: [round(t, 4) for t in v] for k, v in steps.items()})


def main(argv: list[str] | None = None) -> int:
    """The probe's process: the verdict as JSON on stdout."""
    args = sys.argv[1:] if argv is None else argv
    try:
        n_head, n_head_kv, head_dim, threads = (int(a) for a in args)
    except ValueError:
        print("usage: attention_probe HEADS KV_HEADS HEAD_DIM THREADS", file=sys.stderr)
        return 2
    try:
        result = measure(AttentionShape(n_head, n_head_kv, head_dim), threads)
    except RuntimeError as exc:
        result = Verdict(None, error=str(exc))
    print(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
