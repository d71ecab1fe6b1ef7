"""A hybrid model's growing chat, turn by turn: `localinfer serve` against llama-server.

The model is a Qwen3.5-0.8B shape with random Q8_0 weights (bench/random_gguf.py's
"qwen3.5-0.8b": 18 Gated DeltaNet layers and 6 of gated attention, Qwen's tokenizer and
Qwen3.5's chat template from llama.cpp's source). A hybrid's recurrent state cannot be cut
back, so a server keeps the prefix of a conversation only through checkpoints of that state
(localinfer's engine/checkpoints.py; llama-server's --ctx-checkpoints, its defaults here).

One round: a 6-turn chat, each turn the whole history plus a new question of ~120 tokens,
the reply (greedy, --tokens) sent back as the client got it; then the last turn's prompt
once more with a new first word, which nothing cached matches (the full re-read). TTFT is
timed outside the servers (first streamed token). Two variants: thinking off
(enable_thinking false: the template's empty think block is dropped from old turns) and
thinking on (the reply's reasoning is not sent back, as OpenAI's clients do, and the
template writes old turns without it). Rounds alternate between the servers; medians.

Build llama-server once from the llama.cpp source llama-cpp-python ships (see
bench/serve_fast_steps.py's docstring); its source tree gives the tokenizer and template.

    python3 bench/hybrid_turns.py --llama-server PATH [--reps 3] [--tokens 24]

Writes bench/results/hybrid_turns.{json,md,png}.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import harness
from clients import growing_chat
from random_gguf import qwen35_chat_model

CTX = 8192
MODEL = "qwen3.5-0.8b-random"  # the file's stem: localinfer's name for it
TURNS = 6
SERVERS = ("llama-server", "localinfer")
VARIANTS = {"thinking off": False, "thinking on": True}


def main() -> None:
    parser = harness.arguments(__doc__, tokens=24, reps=3)
    parser.add_argument("--llama-server", type=Path, required=True)
    parser.add_argument("--source", type=Path,
                        help="llama.cpp's source tree [the one llama-server was built in]")
    args = parser.parse_args()
    source = args.source or args.llama_server.resolve().parents[2]
    with tempfile.TemporaryDirectory() as home:
        model = qwen35_chat_model(source, Path(home) / f"{MODEL}.gguf")
        servers = harness.start_servers({
            "llama-server": lambda: harness.start_server(
                [str(args.llama_server)], ["-m", str(model), "-np", "1", "-c", str(CTX),
                                           "--jinja"]),
            "localinfer": lambda: harness.start_serve(harness.SERVE, str(model), 1, CTX, home)})
        runs: dict[str, dict[str, list]] = {v: {s: [] for s in SERVERS} for v in VARIANTS}
        try:
            for rep in range(args.reps):
                for variant, thinking in VARIANTS.items():
                    order = SERVERS if rep % 2 == 0 else SERVERS[::-1]
                    for name in order:
                        seed = rep * 10 + list(VARIANTS).index(variant)
                        result = growing_chat(servers[name][1], MODEL, seed, thinking,
                                              args.tokens, TURNS)
                        runs[variant][name].append(result)
                        print(variant, name, rep, [round(t["ttft_s"], 3)
                                                   for t in result["turns"]],
                              "cold", round(result["cold"]["ttft_s"], 3),
                              "cached", [t["cached"] for t in result["turns"]], flush=True)
        finally:
            harness.stop_servers(servers)
    report(args, runs)


def report(args, runs: dict) -> None:
    med = statistics.median
    summary, lines = {}, [
        "# A hybrid model's growing chat: localinfer against llama-server", "",
        f"Qwen3.5-0.8B shape, random Q8_0 weights, one slot of {CTX} tokens, {TURNS} turns "
        f"(a 300-word system prompt, ~90-word questions, {args.tokens}-token greedy replies "
        f"sent back), medians of {args.reps} alternating rounds. TTFT in ms, timed at the "
        "client; \"re-read\" is the last turn's prompt with nothing cached.", ""]
    fig, axes = harness.figure(len(VARIANTS))
    for column, variant in enumerate(VARIANTS):
        rows = []
        summary[variant] = {}
        for name in SERVERS:
            rounds = runs[variant][name]
            per_turn = [med(r["turns"][t]["ttft_s"] for r in rounds) for t in range(TURNS)]
            cold = med(r["cold"]["ttft_s"] for r in rounds)
            cached = [rounds[0]["turns"][t]["cached"] for t in range(TURNS)]
            prompt = [rounds[0]["turns"][t]["prompt_tokens"] for t in range(TURNS)]
            summary[variant][name] = {"ttft_s": per_turn, "reread_s": cold,
                                      "cached": cached, "prompt_tokens": prompt,
                                      "rounds": [[t["ttft_s"] for t in r["turns"]]
                                                 for r in rounds]}
            rows.append([name, *(f"{1000 * t:.0f}" for t in per_turn), f"{1000 * cold:.0f}",
                         f"{per_turn[-1] / cold:.2f}",
                         " / ".join("?" if c is None else str(c) for c in cached)])
            axes[0][column].plot(range(1, TURNS + 1), [1000 * t for t in per_turn], "o-",
                                 label=name)
        ours, theirs = (summary[variant][s]["ttft_s"][-1] for s in ("localinfer",
                                                                   "llama-server"))
        lines += [f"## {variant}", "",
                  *harness.markdown_table(
                      ["server", *(f"turn {t + 1}" for t in range(TURNS)), "re-read",
                       "turn 6 ÷ re-read", "cached tokens per turn"], rows),
                  "", f"Turn 6: localinfer ÷ llama-server = **{ours / theirs:.2f}**; "
                  f"prompt tokens per turn: {summary[variant]['localinfer']['prompt_tokens']}.",
                  ""]
        axes[0][column].set(title=variant, xlabel="turn", ylabel="TTFT (ms)")
        axes[0][column].legend()
    meta = harness.run_facts(reps=args.reps, tokens=args.tokens, ctx=CTX,
                             llama_server=str(args.llama_server))
    harness.write("hybrid_turns", meta, summary, lines, fig, args.results)


if __name__ == "__main__":
    main()
