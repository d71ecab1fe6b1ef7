"""More chats than slots: each turn's slot held another chat. `localinfer serve` (prompts
saved to RAM when a slot takes another chat, --cache-ram) against llama-server (its own
--cache-ram, on by default) and against localinfer --cache-ram 0.

An agent's main chat and its subagents, or several users, on a server with fewer slots:
--chats growing chats (a 300-word system prompt, ~90-word questions, each reply sent back)
take turns one after another, so every chat's next turn arrives after the others have used
the slots. Per turn: TTFT at the client and the cached tokens the server reported. Reported:
the median TTFT of the turns after each chat's first (which nothing can have cached), each
server's share of those turns' prompt tokens found cached, and each round's figures.
Rounds alternate the servers' order; each round's chats are new to every server.

The random weights' replies begin with a space, which localinfer drops from a reply's text (as
it drops any reply's leading whitespace) and llama-server keeps: a reply sent back is then
other tokens than the ones generated, so localinfer finds the next turn cached up to the
reply, and llama-server through it (16 tokens a turn more here).

    python3 bench/more_chats_than_slots.py --llama-server PATH [--reps 3] [--slots 2]
                                           [--chats 4] [--turns 4] [--tokens 16]

Writes bench/results/more_chats_than_slots.{json,md,png}.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import harness
import httpx
from clients import chat_text, chat_turn
from random_gguf import SHAPES, embedded_smollm2, read_tokenizer, write_model

CTX = 4096  # per slot


def conversation(url: str, model: str, seeds: list[int], turns: int, tokens: int
                 ) -> list[dict]:
    """The chats' turns, one chat after another each turn: every turn's figures."""
    chats = [[{"role": "system", "content": f"Session {s}. " + chat_text(s, 300)}]
             for s in seeds]
    done = []
    with httpx.Client(timeout=900) as client:
        for turn in range(turns):
            for i, messages in enumerate(chats):
                messages.append({"role": "user", "content": f"Question {turn}: " +
                                 chat_text(seeds[i] + turn, 90)})
                result = chat_turn(client, url, model, messages, False, tokens)
                messages.append({"role": "assistant", "content": result["reply"]})
                done.append({"chat": i, "turn": turn, "ttft_s": result["ttft_s"],
                             "cached": result["cached"] or 0,
                             "prompt_tokens": result["prompt_tokens"] or 0})
    return done


def main() -> None:
    parser = harness.arguments(__doc__, tokens=16, reps=3)
    parser.add_argument("--llama-server", type=Path, required=True)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--chats", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    args = parser.parse_args()
    shape = "smollm2-135m"
    name = f"{shape}-random"
    named = ("llama-server", "localinfer", "localinfer --cache-ram 0")
    rows = []
    with tempfile.TemporaryDirectory() as home:
        model = Path(home) / f"{name}.gguf"
        write_model(SHAPES[shape], model, read_tokenizer(embedded_smollm2()),
                    f"random {shape} Q8_0")
        servers = harness.start_servers({
            "llama-server": lambda: harness.start_server(
                [str(args.llama_server)],
                ["-m", str(model), "-np", str(args.slots), "-c", str(CTX * args.slots)]),
            "localinfer": lambda: harness.start_serve(harness.SERVE, str(model), args.slots,
                                                      CTX, home),
            "localinfer --cache-ram 0": lambda: harness.start_serve(
                [*harness.SERVE, "--cache-ram", "0"], str(model), args.slots, CTX, home)})
        try:
            for rep in range(args.reps):
                for server in (named if rep % 2 == 0 else named[::-1]):
                    seeds = [1000 * (rep + 1) + 17 * i for i in range(args.chats)]
                    turns = conversation(servers[server][1], name, seeds, args.turns,
                                         args.tokens)
                    later = [t for t in turns if t["turn"] > 0]
                    row = {"server": server, "rep": rep, "turns": turns,
                           "ttft_p50_s": statistics.median(t["ttft_s"] for t in later),
                           "cached_share": sum(t["cached"] for t in later)
                           / sum(t["prompt_tokens"] for t in later)}
                    rows.append(row)
                    print(f"{rep} {server:24s} later turns: TTFT p50 {row['ttft_p50_s']:.3f} s,"
                          f" {row['cached_share']:.0%} of their prompt cached", flush=True)
        finally:
            harness.stop_servers(servers)
    report(args, named, rows)


def report(args, named: tuple[str, ...], rows: list[dict]) -> None:
    med = statistics.median
    fig, axes = harness.figure()
    ax = axes[0][0]
    table, summary = [], {}
    theirs = [r for r in rows if r["server"] == "llama-server"]
    for server in named:
        mine = [r for r in rows if r["server"] == server]
        ratios = [a["ttft_p50_s"] / b["ttft_p50_s"] for a, b in zip(mine, theirs)]
        summary[server] = {"ttft_p50_s": med(r["ttft_p50_s"] for r in mine),
                           "cached_share": med(r["cached_share"] for r in mine),
                           "ttft_ratio": med(ratios)}
        table.append([server, f"{summary[server]['ttft_p50_s']:.3f}",
                      " ".join(f"{r['ttft_p50_s']:.3f}" for r in mine),
                      f"{summary[server]['ttft_ratio']:.2f}",
                      f"{summary[server]['cached_share']:.0%}"])
        first = [t for t in mine[-1]["turns"]]
        ax.plot(range(len(first)), [t["ttft_s"] for t in first], "o-", ms=3, label=server)
    ax.set(title=f"the last round's turns ({args.chats} chats, {args.slots} slots)",
           xlabel="turn, chats in turn", ylabel="TTFT, s")
    ax.legend(fontsize=7)
    lines = ["# More chats than slots: localinfer against llama-server", "",
             f"{args.chats} growing chats take turns on a server of {args.slots} slots of {CTX} "
             f"tokens ({args.turns} turns each: a 300-word system prompt, ~90-word questions, "
             f"{args.tokens}-token replies sent back), SmolLM2-135M's shape with random Q8_0 "
             f"weights; {args.reps} rounds with the servers in turns, new chats each round. "
             f"Figures are of the turns after each chat's first.", "",
             *harness.markdown_table(["server", "TTFT p50, s (median of rounds)", "each round",
                                      "÷ llama-server's", "prompt tokens cached"], table)]
    meta = harness.run_facts(reps=args.reps, slots=args.slots, chats=args.chats,
                             turns=args.turns, tokens=args.tokens, ctx=CTX,
                             llama_server=str(args.llama_server))
    harness.write("more_chats_than_slots", meta, {"summary": summary, "runs": rows}, lines,
                  fig, args.results)


if __name__ == "__main__":
    main()
