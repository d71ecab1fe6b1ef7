"""A chat whose client sends a new num_ctx each turn, as aider does on the Ollama API.

aider sends `options.num_ctx` = its prompt's tokens × 1.25 + 8,192 with every message, so
the number grows each turn. Ollama loads the model again whenever num_ctx changes; localinfer
serves a request in a context loaded with at least what it asks, and grows one with room to
spare (app/pool.py). One `localinfer serve` of gemma3:270m (trained on 32,768 tokens); per
round, a fresh chat of --turns turns, each a user message of ~400 tokens and a greedy reply
of 16, sent through the `ollama` client as aider sends it, and, in turns with it, the same
chat with one fixed num_ctx (32,768: what users set to stop the loads, the floor here). The
model is unloaded before each chat. Per chat: the time of its turns at the client, the
loads (turns whose load_duration is not 0) and the context each turn ran in.

    python3 bench/num_ctx_turns.py [--reps 3] [--turns 8] [--results FOLDER]

Writes bench/results/num_ctx_turns.{json,md,png}.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time

import ollama

import harness

MODEL = "gemma3:270m"
WORDS = ("harbour lantern keeper tide stone river north wind shore rope gull signal night "
         "storm beacon coast cliff ledger bell mast").split()
SETTINGS = ("aider's num_ctx", "fixed num_ctx")


def aider_num_ctx(messages: list[dict]) -> int:
    tokens = sum(len(m["content"]) for m in messages) // 4  # (aider counts with tiktoken)
    return int(tokens * 1.25) + 8192


def chat(client: ollama.Client, setting: str, turns: int, seed: int) -> dict:
    rng = random.Random(seed)
    messages: list[dict] = []
    rows = []
    for _ in range(turns):
        text = " ".join(rng.choice(WORDS) for _ in range(300))
        messages.append({"role": "user", "content": f"Notes: {text}. Summarise."})
        num_ctx = aider_num_ctx(messages) if setting == SETTINGS[0] else 32768
        began = time.perf_counter()
        reply = client.chat(model=MODEL, messages=messages, options={
            "num_ctx": num_ctx, "num_predict": 16, "temperature": 0})
        rows.append({"num_ctx": num_ctx, "seconds": time.perf_counter() - began,
                     "loaded": (reply.load_duration or 0) > 0,
                     "context": [m.context_length for m in client.ps().models][0]})
        messages.append({"role": "assistant", "content": reply.message.content})
    return {"seconds": sum(r["seconds"] for r in rows), "loads": sum(r["loaded"] for r in rows),
            "turns": rows}


def main() -> None:
    parser = harness.arguments(__doc__, reps=3)
    parser.add_argument("--turns", type=int, default=8)
    args = parser.parse_args()
    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as home:
        process, url = harness.start_serve(harness.SERVE, MODEL, 1, 2048, home)
        try:
            client = ollama.Client(host=url, timeout=600)
            for rep in range(args.reps):
                for setting in (SETTINGS if rep % 2 == 0 else SETTINGS[::-1]):
                    client.generate(model=MODEL, keep_alive=0)  # unloaded: each starts alike
                    run = chat(client, setting, args.turns, seed=rep * 2 + SETTINGS.index(setting))
                    runs.append({"setting": setting, "rep": rep, **run})
                    print(f"{rep} {setting:16s} {run['seconds']:6.1f} s, {run['loads']} loads, "
                          f"contexts {[t['context'] for t in run['turns']]}", flush=True)
        finally:
            harness.stop_servers({"localinfer": (process, url)})
    report(args, runs)


def report(args, runs: list[dict]) -> None:
    med = lambda xs: statistics.median(xs)  # noqa: E731
    summary = {}
    for setting in SETTINGS:
        mine = [r for r in runs if r["setting"] == setting]
        summary[setting] = {"seconds": med(r["seconds"] for r in mine),
                            "loads": med(r["loads"] for r in mine),
                            "contexts": sorted({t["context"] for r in mine for t in r["turns"]})}
    ratio = summary[SETTINGS[0]]["seconds"] / summary[SETTINGS[1]]["seconds"]
    rows = [[s, f"{summary[s]['seconds']:.1f}", f"{summary[s]['loads']:.0f}",
             ", ".join(f"{c:,}" for c in summary[s]["contexts"])] for s in SETTINGS]
    fig, axes = harness.figure()
    ax = axes[0][0]
    for setting in SETTINGS:
        mine = [r for r in runs if r["setting"] == setting]
        per_turn = [med(r["turns"][i]["seconds"] for r in mine) for i in range(args.turns)]
        ax.plot(range(1, args.turns + 1), per_turn, marker="o", label=setting)
    ax.set(xlabel="turn", ylabel="seconds (median of rounds)",
           title=f"{MODEL}: a chat sending aider's num_ctx")
    ax.legend()
    lines = ["# A chat whose client sends a new num_ctx each turn (aider on the Ollama API)", "",
             f"{MODEL}; a fresh chat per round of {args.turns} turns (~400-token messages, "
             f"16-token greedy replies) through the `ollama` client, the model unloaded "
             f"before each; {args.reps} rounds, the settings in turns. Medians.", "",
             *harness.markdown_table(["num_ctx sent", "chat s", "loads", "contexts loaded"],
                                     rows), "",
             f"aider's num_ctx ÷ fixed: **{ratio:.2f}x** the time."]
    meta = harness.run_facts(reps=args.reps, turns=args.turns)
    harness.write("num_ctx_turns", meta, {"summary": summary, "runs": runs}, lines, fig,
                  args.results)


if __name__ == "__main__":
    main()
