"""Decoding deep in a conversation: tokens/s once a prompt of D tokens has been read, and that
prompt's TTFT, `localinfer serve` against llama-server.

A chat's replies are decoded after its whole history; an agent's after its system prompt and
files. Each decode step's attention reads every token before it, and llama.cpp's CPU flash
attention reads them one query row at a time (its tiles are for 64 rows of a prompt), so how a
server sets flash attention decides its speed deep in a context. Per depth: a fresh prompt of
D words (a token each, in an order of its own: nothing cached), then --tokens greedy tokens
streamed; decode tok/s from the first token to the last at the client, and the TTFT. Servers
side by side, in turns: llama-server (its defaults: flash attention auto, on a CPU on),
`localinfer serve` (its defaults), and `localinfer serve` with each --variant's flags. The
model is SmolLM2-135M's shape with random Q8_0 weights (bench/random_gguf.py), or --shape's.

Build llama-server once (see bench/serve_fast_steps.py's docstring).

    python3 bench/deep_decode.py --llama-server PATH [--reps 3] [--depths 128,1024,4096]
                                 [--tokens 64] [--shape llama3.2-1b]
                                 [--variant "--flash-attn"]...

Writes bench/results/deep_decode.{json,md,png}.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import harness
from clients import shuffled_prompt, stream_times
from random_gguf import SHAPES, embedded_smollm2, read_tokenizer, write_model

SLOTS = 2


def once(url: str, model: str, seed: int, words: int, tokens: int) -> dict:
    times: list[float] = []
    sent = stream_times(url, model, shuffled_prompt(seed, words), tokens, times)
    if len(times) < tokens // 2:
        raise SystemExit(f"{url}: {len(times)} tokens streamed, {tokens} asked")
    return {"ttft_s": times[0] - sent,
            "decode_tps": (len(times) - 1) / (times[-1] - times[0])}


def main() -> None:
    parser = harness.arguments(__doc__, reps=3, tokens=64)
    parser.add_argument("--llama-server", type=Path, required=True)
    parser.add_argument("--depths", default="128,1024,2048,4096",
                        help="prompt lengths in words (a token each)")
    parser.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
    parser.add_argument("--variant", action="append", default=[],
                        help="also localinfer with these flags (repeatable)")
    args = parser.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    ctx = max(depths) + args.tokens + 64
    names = ("llama-server", "localinfer", *(f"localinfer {v}" for v in args.variant))
    runs: dict[str, list] = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as home:
        stem = f"{args.shape}-random"
        model = Path(home) / f"{stem}.gguf"
        write_model(SHAPES[args.shape], model, read_tokenizer(embedded_smollm2()),
                    f"random {args.shape} Q8_0")
        li = ["--model", str(model), "--parallel", str(SLOTS), "--ctx", str(ctx)]
        ready = {"path": "/api/ps", "ready": lambda r: bool(r.json().get("models")),
                 "env": {"LOCALINFER_HOME": home}}
        servers = harness.start_servers({
            "llama-server": lambda: harness.start_server(
                [str(args.llama_server)],
                ["-m", str(model), "-np", str(SLOTS), "-c", str(SLOTS * ctx)]),
            "localinfer": lambda: harness.start_server(harness.SERVE, li, **ready),
            **{f"localinfer {v}": lambda v=v: harness.start_server(
                harness.SERVE, [*li, *v.split()], **ready) for v in args.variant}})
        try:
            for rep in range(args.reps):
                order = names if rep % 2 == 0 else names[::-1]
                for depth in depths:
                    for name in order:
                        row = once(servers[name][1], stem, 1000 * rep + depth, depth,
                                   args.tokens)
                        runs[name].append({"rep": rep, "depth": depth, **row})
                        print(f"{name:28s} depth {depth:5d}: {row['decode_tps']:6.1f} tok/s "
                              f"TTFT {row['ttft_s']:6.2f} s", flush=True)
        finally:
            harness.stop_servers(servers)
    report(args, depths, runs)


def report(args, depths: list[int], runs: dict) -> None:
    med = statistics.median

    def at(name: str, depth: int, key: str) -> float:
        return med(r[key] for r in runs[name] if r["depth"] == depth)

    def ratios(name: str, depth: int, key: str) -> list[float]:
        base = {r["rep"]: r[key] for r in runs["llama-server"] if r["depth"] == depth}
        return [r[key] / base[r["rep"]] for r in runs[name] if r["depth"] == depth]

    rows, summary = [], {}
    for depth in depths:
        for name in runs:
            tps = ratios(name, depth, "decode_tps")
            ttft = ratios(name, depth, "ttft_s")
            summary.setdefault(name, {})[depth] = {
                "decode_tps": at(name, depth, "decode_tps"), "ttft_s": at(name, depth, "ttft_s"),
                "decode_vs_llama_server": med(tps), "decode_rounds": tps,
                "ttft_vs_llama_server": med(ttft)}
            rows.append([depth, name, f"{at(name, depth, 'decode_tps'):.1f}",
                         f"**{med(tps):.2f}** ({' '.join(f'{x:.2f}' for x in tps)})",
                         f"{at(name, depth, 'ttft_s'):.2f}", f"{med(ttft):.2f}"])
    fig, axes = harness.figure(2)
    for name in runs:
        axes[0][0].plot(depths, [at(name, d, "decode_tps") for d in depths], "o-", label=name)
        axes[0][1].plot(depths, [at(name, d, "ttft_s") for d in depths], "o-", label=name)
    axes[0][0].set(xlabel="tokens before the reply", ylabel="decode tokens/s",
                   title="decode speed deep in a context")
    axes[0][1].set(xlabel="prompt tokens", ylabel="TTFT (s)", title="reading the prompt")
    axes[0][0].legend(fontsize=7)
    lines = ["# Decoding deep in a conversation", "",
             f"{args.shape}'s shape, random Q8_0 weights; {SLOTS} slots; per depth a fresh "
             f"prompt of that many tokens, then {args.tokens} greedy tokens streamed. Decode "
             "tok/s from the first token to the last at the client; ratios to llama-server "
             f"round by round, their median in bold (each round in brackets); {args.reps} "
             "alternating rounds. llama-server runs with its defaults (flash attention auto: "
             "on, on a CPU).", "",
             *harness.markdown_table(
                 ["depth", "server", "decode tok/s", "÷ llama-server", "TTFT (s)",
                  "TTFT ÷ llama-server"], rows)]
    meta = harness.run_facts(reps=args.reps, depths=depths, tokens=args.tokens,
                             shape=args.shape, llama_server=str(args.llama_server))
    harness.write("deep_decode", meta, summary, lines, fig, args.results)


if __name__ == "__main__":
    main()
