"""What copying a sequence's state to RAM and back costs: the pause a saved prompt (and a
context checkpoint) puts on every stream, since the engine's one thread does it between steps.

    python3 bench/state_copy.py [--tokens 512 2048 4096] [--reps 7] [--shape llama3.2-1b]
                                [--results FOLDER]

A sequence of each length is read into a one-slot context of bench/random_gguf.py's shape
(random Q8_0 weights, smollm2's tokenizer), then its whole state is written out and read
back, in alternating rounds: into a ctypes array, as `NativeModel.save_sequence` did before,
and through `save_sequence` as it is (numpy's memory, which Linux backs with huge pages where
it is large, so filling it faults 512x fewer pages). Reported: MiB of state, medians of the
rounds in ms, and each round's ratio. Writes bench/results/state_copy.{json,md,png}.
"""

from __future__ import annotations

import ctypes
import statistics
import tempfile
import time
from pathlib import Path

import harness
import llama_cpp
from localinfer.backends.native.model import NativeModel
from random_gguf import SHAPES, embedded_smollm2, read_tokenizer, write_model

FLAGS = llama_cpp.LLAMA_STATE_SEQ_FLAGS_NONE


def ctypes_copy(native: NativeModel) -> ctypes.Array:
    """The state written as before: into a ctypes array (its pages faulted one by one)."""
    size = llama_cpp.llama_state_seq_get_size_ext(native.ctx, 0, FLAGS)
    data = (ctypes.c_uint8 * size)()
    if llama_cpp.llama_state_seq_get_data_ext(native.ctx, data, size, 0, FLAGS) != size:
        raise SystemExit("llama.cpp wrote less than it said it would")
    return data


def read(native: NativeModel, n: int) -> None:
    batch = native.batch(native.n_batch())
    done = 0
    while done < n:
        k = min(native.n_batch(), n - done)
        batch.n_tokens = k
        for i in range(k):
            batch.token[i], batch.pos[i] = 1000 + (done + i) % 5000, done + i
            batch.n_seq_id[i], batch.seq_id[i][0], batch.logits[i] = 1, 0, i == k - 1
        if native.decode(batch) != 0:
            raise SystemExit("llama_decode failed")
        done += k
    native.free_batch(batch)


def timed(copy, native: NativeModel) -> tuple[float, float, int]:
    """Seconds to write the state out (`copy`), and to read it back; its bytes."""
    started = time.perf_counter()
    data = copy()
    saved = time.perf_counter() - started
    if data is None:
        raise SystemExit("the state was not written")
    started = time.perf_counter()
    if not native.restore_sequence(0, data):
        raise SystemExit("llama.cpp would not take the state back")
    return saved, time.perf_counter() - started, len(data)


def main() -> None:
    parser = harness.arguments(__doc__, reps=7)
    parser.add_argument("--tokens", type=int, nargs="+", default=[512, 2048, 4096])
    parser.add_argument("--shape", default="llama3.2-1b", choices=sorted(SHAPES))
    args = parser.parse_args()
    threads = harness.threads_or_default(None)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"{args.shape}.gguf"
        write_model(SHAPES[args.shape], path, read_tokenizer(embedded_smollm2()),
                    f"random {args.shape} Q8_0")
        native = NativeModel(str(path), max(args.tokens) + 64, 1, 512, threads)
        try:
            for n in args.tokens:
                native.forget(0)
                read(native, n)
                ways = {"ctypes array (before)": lambda: ctypes_copy(native),
                        "save_sequence": lambda: native.save_sequence(0)}
                times: dict[str, list[tuple[float, float]]] = {w: [] for w in ways}
                for rep in range(args.reps):
                    for way in (list(ways) if rep % 2 == 0 else list(ways)[::-1]):
                        saved, restored, size = timed(ways[way], native)
                        times[way].append((saved, restored))
                before, now = (times[w] for w in ways)
                rows.append({"tokens": n, "mib": size / 2**20,
                             "save_ms_before": 1e3 * statistics.median(t[0] for t in before),
                             "save_ms_now": 1e3 * statistics.median(t[0] for t in now),
                             "restore_ms_before": 1e3 * statistics.median(t[1] for t in before),
                             "restore_ms_now": 1e3 * statistics.median(t[1] for t in now),
                             "save_ratios": [a[0] / b[0] for a, b in zip(before, now)],
                             "rounds": times})
                r = rows[-1]
                print(f"{n} tokens, {r['mib']:.1f} MiB: save {r['save_ms_before']:.1f} → "
                      f"{r['save_ms_now']:.1f} ms, restore {r['restore_ms_before']:.1f} / "
                      f"{r['restore_ms_now']:.1f} ms", flush=True)
        finally:
            native.close()
    meta = harness.run_facts(shape=args.shape, tokens=args.tokens, reps=args.reps,
                             threads=threads)
    lines = ["# A sequence's state copied to RAM and back",
             "",
             f"{args.shape}'s shape (random Q8_0 weights), one slot; the whole state of a "
             f"sequence of each length written out (`llama_state_seq_get_data_ext`) and read "
             f"back, in {args.reps} alternating rounds: into a ctypes array, as before, and "
             "through `NativeModel.save_sequence` (numpy's memory, in huge pages where Linux "
             "gives them). Medians in ms; the engine's thread, which every stream waits on, "
             "does both between steps.",
             "",
             *harness.markdown_table(
                 ["tokens", "state MiB", "save, ctypes array (ms)", "save, save_sequence (ms)",
                  "save × faster (each round)", "restore from each (ms)"],
                 [[r["tokens"], f"{r['mib']:.1f}", f"{r['save_ms_before']:.1f}",
                   f"**{r['save_ms_now']:.1f}**",
                   " ".join(f"{x:.1f}" for x in r["save_ratios"]),
                   f"{r['restore_ms_before']:.1f} / {r['restore_ms_now']:.1f}"]
                  for r in rows])]
    fig, axes = harness.figure(1, 1, size=(6, 3.8))
    ax = axes[0][0]
    mib = [r["mib"] for r in rows]
    ax.plot(mib, [r["save_ms_before"] for r in rows], "o-", label="save: ctypes array (before)")
    ax.plot(mib, [r["save_ms_now"] for r in rows], "o-", label="save: save_sequence")
    ax.plot(mib, [r["restore_ms_now"] for r in rows], "o--", label="restore")
    ax.set_xlabel("state (MiB)")
    ax.set_ylabel("ms (median)")
    ax.legend()
    harness.write("state_copy", meta, rows, lines, fig, folder=args.results)


if __name__ == "__main__":
    main()
