"""A running stream while a long prompt arrives: its longest pause, and that prompt's TTFT.

One client streams a long reply; once it is under way, a second sends a ~4,000-token
prompt. Measured at the clients: the running stream's longest gap between two tokens while
the long prompt is read (from its send to its first token), the long prompt's TTFT, and its
TTFT read alone (a fresh prompt of the same length, nothing else running). Servers, side by
side and in turns: llama-server (its defaults, -np 2), `localinfer serve` (its defaults: a
step held to ~250 ms while streams run) and `localinfer serve` with each --variant's flags
(by default --step-ms 0, prompts in whole 512-token chunks, and --step-ms 250). The model is
SmolLM2-135M's shape with random Q8_0 weights (bench/random_gguf.py's "smollm2-135m",
smollm2's tokenizer, one token a prompt word): a real small model's costs, and a reply that
does not end early.

Build llama-server once (see bench/serve_fast_steps.py's docstring).

    python3 bench/long_prompt_gap.py --llama-server PATH [--reps 3] [--prompt-words 4000]
                                     [--variant "--step-ms 250"]...

Writes bench/results/long_prompt_gap.{json,md,png}.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from pathlib import Path

import harness
from clients import shuffled_prompt, stream_times
from random_gguf import SHAPES, embedded_smollm2, read_tokenizer, write_model

MODEL = "smollm2-135m-random"  # the file's stem: localinfer's name for it
CTX = 8192  # per slot
SERVERS = ("llama-server", "localinfer")  # and `localinfer --step-ms N` for each --step-ms


def once(url: str, seed: int, words: int) -> dict:
    running: list[float] = []
    streamer = threading.Thread(target=stream_times,
                                 args=(url, MODEL, f"Story {seed}:", 1200, running))
    streamer.start()
    while len(running) < 20:
        time.sleep(0.01)
    long_times: list[float] = []
    sent = stream_times(url, MODEL, shuffled_prompt(seed, words), 1, long_times)
    first = long_times[0] if long_times else time.perf_counter()
    streamer.join()
    if running[-1] < first:
        raise SystemExit(f"{url}: the running stream ended before the long prompt was read")
    during = [b - a for a, b in zip(running, running[1:]) if b > sent and a < first]
    before = [b - a for a, b in zip(running[:20], running[1:20])]
    alone: list[float] = []
    sent_alone = stream_times(url, MODEL, shuffled_prompt(seed + 500, words), 1, alone)
    return {"longest_gap_s": max(during), "gap_median_before_s": statistics.median(before),
            "ttft_s": first - sent, "alone_ttft_s": alone[0] - sent_alone}


def main() -> None:
    parser = harness.arguments(__doc__, reps=3)
    parser.add_argument("--llama-server", type=Path, required=True)
    parser.add_argument("--prompt-words", type=int, default=4000,
                        help="the long prompt's words (a token each)")
    parser.add_argument("--variant", action="append", default=[],
                        help="also localinfer with these flags (repeatable), e.g. "
                             "'--step-ms 250 --no-flash-attn'")
    args = parser.parse_args()
    variants = args.variant or ["--step-ms 0", "--step-ms 250"]
    names = (*SERVERS, *(f"localinfer {flags}" for flags in variants))
    runs: dict[str, list] = {s: [] for s in names}
    with tempfile.TemporaryDirectory() as home:
        model = Path(home) / f"{MODEL}.gguf"
        write_model(SHAPES["smollm2-135m"], model, read_tokenizer(embedded_smollm2()),
                    "random smollm2-135m Q8_0")
        li = ["--model", str(model), "--parallel", "2", "--ctx", str(CTX)]
        ready = {"path": "/api/ps", "ready": lambda r: bool(r.json().get("models")),
                 "env": {"LOCALINFER_HOME": home}}
        servers = harness.start_servers({
            "llama-server": lambda: harness.start_server(
                [str(args.llama_server)], ["-m", str(model), "-np", "2", "-c", str(2 * CTX)]),
            "localinfer": lambda: harness.start_server(harness.SERVE, li, **ready),
            **{f"localinfer {flags}": lambda flags=flags: harness.start_server(
                harness.SERVE, [*li, *flags.split()], **ready) for flags in variants}})
        try:
            for rep in range(args.reps):
                order = names if rep % 2 == 0 else names[::-1]
                for name in order:
                    row = once(servers[name][1], rep * 10 + names.index(name),
                               args.prompt_words)
                    runs[name].append(row)
                    print(name, rep, {k: round(v, 3) for k, v in row.items()}, flush=True)
        finally:
            harness.stop_servers(servers)
    report(args, runs)


def report(args, runs: dict) -> None:
    med = statistics.median
    summary, rows = {}, []
    fig, axes = harness.figure(2)
    for name in runs:
        r = runs[name]
        s = summary[name] = {key: med(x[key] for x in r) for key in r[0]}
        s["ttft_vs_alone"] = med(x["ttft_s"] / x["alone_ttft_s"] for x in r)
        s["longest_gap_rounds_s"] = [x["longest_gap_s"] for x in r]
        rows.append([name, f"{1000 * s['gap_median_before_s']:.0f}",
                     f"**{1000 * s['longest_gap_s']:.0f}** "
                     f"({1000 * min(s['longest_gap_rounds_s']):.0f}–"
                     f"{1000 * max(s['longest_gap_rounds_s']):.0f})",
                     f"{s['ttft_s']:.2f}", f"{s['alone_ttft_s']:.2f}",
                     f"{s['ttft_vs_alone']:.2f}"])
    names = list(runs)
    axes[0][0].bar(names, [1000 * summary[n]["longest_gap_s"] for n in names])
    axes[0][0].set(ylabel="longest gap (ms)", title="a running stream's longest pause")
    axes[0][1].bar(names, [summary[n]["ttft_s"] for n in names], label="beside a stream")
    axes[0][1].bar(names, [summary[n]["alone_ttft_s"] for n in names], alpha=0.5,
                   label="alone")
    axes[0][1].set(ylabel="TTFT (s)", title="the long prompt's TTFT")
    axes[0][1].legend()
    for ax in axes[0]:
        ax.tick_params(axis="x", labelsize=7)
    lines = ["# A running stream while a long prompt arrives", "",
             f"SmolLM2-135M's shape, random Q8_0 weights; 2 slots of {CTX} tokens; a stream "
             f"of 1,200 tokens running, then a prompt of {args.prompt_words} words "
             f"(as many tokens). Medians of {args.reps} "
             "alternating rounds (the range in brackets); gaps in ms, TTFT in s, at the "
             "clients.", "",
             *harness.markdown_table(
                 ["server", "stream's median gap before", "longest gap while the prompt "
                  "is read", "long prompt's TTFT", "its TTFT alone", "TTFT ÷ alone"], rows)]
    meta = harness.run_facts(reps=args.reps, prompt_words=args.prompt_words, ctx=CTX,
                             llama_server=str(args.llama_server))
    harness.write("long_prompt_gap", meta, summary, lines, fig, args.results)


if __name__ == "__main__":
    main()
