"""The engine under a mixed workload for both embedded models: `localinfer bench`, recorded.

    python3 bench/engine_mixed.py [--levels 1,2,4,8,16] [--requests-per-client 2]
                                  [--results FOLDER]

Writes bench/results/engine_mixed.{json,png,md}. See app/bench.py for
what is measured and how.
"""

from __future__ import annotations

import logging

import harness
from localinfer.bench import Workload, prefill_label, run_bench
from localinfer.model_store.sources import resolve

MODELS = ("smollm2:135m", "gemma3:270m")


def main() -> None:
    parser = harness.arguments(__doc__)
    parser.add_argument("--levels", default="1,2,4,8,16")
    parser.add_argument("--requests-per-client", type=int, default=2)
    args = parser.parse_args()
    logging.getLogger("localinfer.llama_cpp").setLevel(logging.ERROR)  # llama.cpp's chatter
    levels = [int(x) for x in args.levels.split(",")]
    work = Workload(requests_per_client=args.requests_per_client)
    results = {}
    for name in MODELS:
        print(f"== {name}", flush=True)
        results[name] = run_bench(resolve(name, harness.STORE).path, levels, work,
                                  log=lambda line: print(line, flush=True))
    meta = harness.run_facts(models=list(MODELS), levels=levels,
                             requests_per_client=args.requests_per_client)
    harness.write("engine_mixed", meta, results, _markdown(results, work),
                  _plot(results, levels), folder=args.results)


def _f(v, fmt=".2f"):
    return "—" if v is None else format(v, fmt)


def _markdown(results: dict, work: Workload) -> list[str]:
    lines = ["# The engine under a mixed workload", "",
             f"Prompts {work.min_prompt}–{work.max_prompt} tokens (log-uniform), replies "
             f"{work.min_output}–{work.max_output} tokens, greedy; N slots and N clients with "
             f"Poisson gaps (mean {work.mean_gap_s} s), {work.requests_per_client} requests each. "
             "Ceiling: a bare loop decoding N sequences per step, each already holding the "
             "workload's typical context (median prompt + half a mean reply). Baseline: "
             "llama-cpp-python's "
             "`Llama`, one request after another. Bare loop ÷ wall: the time the bare loop needs "
             "for the same work (each request's uncached prompt tokens read in 512-token "
             "batches, from a fitted a·L + b·L² cost, plus the output tokens at the ceiling of "
             "N) over the level's wall time; 1.0 would mean nothing lost to scheduling, "
             "sampling or idle time. It is a lower bound on the bare loop's time: steps with "
             "fewer streams than N, or at longer contexts, decode slower than the ceiling. "
             "Wall time split: inside `llama_decode` / in the engine around it (filling "
             "batches, sampling, streaming text) / idle (no request in the engine), as the "
             "engine counts it (`EngineStats.decode_seconds`, `step_seconds`).", ""]
    for name, r in results.items():
        lines += [f"## {name} ({r['threads']} threads)", "",
                  f"Baseline: {r['baseline']['output_tps']:.1f} output tok/s, TTFT p50 "
                  f"{_f(r['baseline']['ttft_p50_s'])} s / p99 {_f(r['baseline']['ttft_p99_s'])} s.", "",
                  "| N | ceiling tok/s | output tok/s | × baseline | decode ÷ ceiling | bare loop ÷ "
                  "wall | wall: llama_decode / engine / idle | TTFT p50 / p99 (s) | "
                  "TPOT p50 / p99 (ms) | ITL p99 (ms) | goodput req/s |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for lv in r["levels"]:
            lines.append(
                f"| {lv['clients']} | {lv['ceiling_tps']:.1f} | {lv['output_tps']:.1f} | "
                f"{lv['output_vs_baseline']:.2f} | {lv['decode_vs_ceiling']:.2f} | "
                f"{lv['bare_vs_wall']:.2f} | {lv['llama_decode_share']:.1%} / "
                f"{lv['engine_share']:.1%} / {lv['idle_share']:.1%} | "
                f"{_f(lv['ttft_p50_s'])} / {_f(lv['ttft_p99_s'])} | "
                f"{_f(lv['tpot_p50_s'] and lv['tpot_p50_s'] * 1000, '.1f')} / "
                f"{_f(lv['tpot_p99_s'] and lv['tpot_p99_s'] * 1000, '.1f')} | "
                f"{_f(lv['itl_p99_s'] and lv['itl_p99_s'] * 1000, '.0f')} | "
                f"{lv['goodput_requests_per_s']:.2f} |")
        lines.append("")
        for lp in r.get("long_prefill", []):
            lines.append(f"- 2000-token prompt read with {prefill_label(lp)}: running "
                         f"streams' P99 ITL {lp['p99_itl_during_prefill_s'] * 1000:.0f} ms = "
                         f"{lp['ratio']:.1f}× their median before it "
                         f"({lp['median_itl_s'] * 1000:.1f} ms); the long prompt's TTFT "
                         f"{lp['long_prompt_ttft_s']:.1f} s.")
        for short in r.get("short_prompts", []):
            lines.append(f"- 8 clients, prompts 32–256 tokens, {short['label']}: TTFT p50 "
                         f"{_f(short['ttft_p50_s'])} s, p99 {_f(short['ttft_p99_s'])} s; TPOT p99 "
                         f"{_f(short['tpot_p99_s'] and short['tpot_p99_s'] * 1000, '.0f')} ms; "
                         f"{short['output_tps']:.1f} output tok/s.")
        c = r.get("cached_system")
        if c:
            lines.append(f"- 1500-token system prompt cached: TTFT {c['warm_ttft_s'] * 1000:.0f} ms "
                         f"vs {c['cold_ttft_s'] * 1000:.0f} ms cold ({c['ratio']:.1%}).")
        lines.append("")
    return lines[:-1]


def _plot(results: dict, levels: list[int]):
    fig, axes = harness.figure(len(results), 1, size=(6, 4))
    for ax, (name, r) in zip(axes[0], results.items()):
        ax.plot(levels, [r["ceiling"][n] for n in levels], marker="o", label="ceiling (decode only)")
        ax.plot(levels, [lv["output_tps"] for lv in r["levels"]], marker="o",
                label="localinfer, mixed workload")
        ax.axhline(r["baseline"]["output_tps"], color="gray", linestyle="--",
                   label="Llama, sequential")
        ax.set(title=name, xlabel="concurrent requests (slots)", ylabel="output tok/s")
        ax.legend()
    return fig


if __name__ == "__main__":
    main()
