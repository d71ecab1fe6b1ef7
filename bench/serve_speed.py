"""Solo decode and 8 clients: `localinfer serve` against llama-server, round by round.

The model is SmolLM2-135M's shape with random Q8_0 weights (bench/random_gguf.py's
"smollm2-135m", smollm2's tokenizer): the real model's costs, and replies that run to their
length. Both servers run side by side with the same slots and context (llama-server's other
settings its defaults; localinfer's its defaults), and take the load in turns, round after
round, so the machine's noise hits both. The load is bench/serve_load.py's raw-socket client
in a process of its own (greedy, --tokens a reply, --requests per client). Reported per
level: each round's localinfer ÷ llama-server streamed tokens/s (their median and the lowest
round), and TTFT p50 of both; each --variant (localinfer with other flags) beside them, and
--baseline REV: localinfer at another git revision (a temporary worktree laid out as it
installs, run with PYTHONPATH).
Each round also times llama.cpp's own ceiling at each level (localinfer.bench.ceiling: a bare
loop decoding as many sequences, a prompt's length in, every core and the GPU layers the
planner gives the server, no server; --no-ceiling: none), and each
server's tok/s is given as a share of it: a server streams less than the loop decodes (it
reads the prompts too), so the shares say how far a ratio between the servers can still go.
The loop and each server run at moments of their own: where the machine's speed drifts
between them (a memory-bound model on a shared host), a share can pass 1.

Build llama-server once (see bench/serve_fast_steps.py's docstring).

    python3 bench/serve_speed.py --llama-server PATH [--reps 5] [--levels 1,8]
                                 [--tokens 128] [--requests 2] [--no-ceiling]
                                 [--shape llama3.2-1b --tokenizer TOKENIZER.gguf]
                                 [--variant=--flash-attn]... [--baseline REV]
                                 [--out NAME]

--shape takes another of random_gguf.py's llama shapes (a GPU's: llama3.2-1b, llama3.1-8b),
--tokenizer a GGUF to take the vocabulary from where the embedded smollm2 is not installed
(random_gguf.py --tokenizer-only writes one).

Writes bench/results/serve_speed.{json,md,png} (--out: another name).
"""

from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path

import harness
from clients import level_in_subprocess
from random_gguf import SHAPES, embedded_smollm2, read_tokenizer, write_model

from localinfer.bench import ceiling, planned_device

CTX = 1024  # per slot
PROMPT = 40  # tokens a request's prompt takes (the chat template's and the question's)


def main() -> None:
    parser = harness.arguments(__doc__, tokens=128, reps=5)
    parser.add_argument("--llama-server", type=Path, required=True)
    parser.add_argument("--levels", default="1,8", help="concurrent clients")
    parser.add_argument("--requests", type=int, default=2, help="per client")
    parser.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
    parser.add_argument("--tokenizer", type=Path, help="a GGUF whose vocabulary to use "
                                                       "[the embedded smollm2's]")
    parser.add_argument("--variant", action="append", default=[],
                        help="also localinfer with these flags (repeatable)")
    parser.add_argument("--no-ceiling", dest="ceiling", action="store_false",
                        help="time no bare loop (it loads the model again each round)")
    parser.add_argument("--baseline", help="also localinfer at this git revision")
    parser.add_argument("--out", default="serve_speed", help="file names under --results")
    args = parser.parse_args()
    baseline = [f"localinfer at {args.baseline}"] if args.baseline else []
    servers_named = ("llama-server", "localinfer", *(f"localinfer {v}" for v in args.variant),
                     *baseline)
    name = f"{args.shape}-random"  # the file's stem: localinfer's name for it
    levels = [int(x) for x in args.levels.split(",")]
    slots = max(levels)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as home, \
            harness.baseline_tree(args.baseline, Path(home)) as tree:
        model = Path(home) / f"{name}.gguf"
        write_model(SHAPES[args.shape], model,
                    read_tokenizer(args.tokenizer or embedded_smollm2()),
                    f"random {args.shape} Q8_0")
        servers = harness.start_servers({
            "llama-server": lambda: harness.start_server(
                [str(args.llama_server)],
                ["-m", str(model), "-np", str(slots), "-c", str(CTX * slots)]),
            "localinfer": lambda: harness.start_serve(harness.SERVE, str(model), slots, CTX, home),
            **{f"localinfer {v}": lambda v=v: harness.start_serve(
                [*harness.SERVE, *v.split()], str(model), slots, CTX, home)
               for v in args.variant},
            **{at: lambda: harness.start_serve(harness.SERVE, str(model), slots, CTX, home,
                                               {"PYTHONPATH": str(tree)}) for at in baseline}})
        layers, device = planned_device(model, CTX, slots) if args.ceiling else (0, None)
        if device:
            print(f"the ceiling's device: {device}", flush=True)
        try:
            for rep in range(args.reps):
                for clients in levels:
                    if args.ceiling:  # (on the layers the planner gives the server)
                        bare = ceiling(model, clients, args.tokens, os.cpu_count() or 1, PROMPT,
                                       gpu_layers=layers)
                        rows.append({"server": "ceiling", "rep": rep, "clients": clients,
                                     "output_tps": bare})
                        print(f"{rep} {'ceiling':24s} {clients:2d} streams: {bare:6.1f} tok/s",
                              flush=True)
                    order = servers_named if rep % 2 == 0 else servers_named[::-1]
                    for server in order:
                        row = level_in_subprocess(servers[server][1], name, clients,
                                                  args.requests, args.tokens)
                        rows.append({"server": server, "rep": rep, **row})
                        print(f"{rep} {server:24s} {clients:2d} clients: "
                              f"{row['output_tps']:6.1f} tok/s, TTFT p50 "
                              f"{row['ttft_p50_s']:.3f} s", flush=True)
        finally:
            harness.stop_servers(servers)
    report(args, levels, rows, servers_named[1:], device)


def report(args, levels: list[int], rows: list[dict], ours_named: tuple[str, ...],
           device: str | None) -> None:
    med = statistics.median

    def pick(server: str, clients: int) -> list[dict]:
        return sorted((r for r in rows if r["server"] == server and r["clients"] == clients),
                      key=lambda r: r["rep"])

    summary, table = {}, []
    fig, axes = harness.figure(len(levels))
    for column, clients in enumerate(levels):
        theirs = pick("llama-server", clients)
        bare = pick("ceiling", clients)

        def share(runs: list[dict]) -> float | None:  # of the ceiling timed in the same round
            return (med(a["output_tps"] / b["output_tps"] for a, b in zip(runs, bare))
                    if bare else None)

        ax = axes[0][column]
        for name in ours_named:
            ours = pick(name, clients)
            ratios = [a["output_tps"] / b["output_tps"] for a, b in zip(ours, theirs)]
            ttft = [a["ttft_p50_s"] / b["ttft_p50_s"] for a, b in zip(ours, theirs)]
            facts = {"ratio_median": med(ratios), "ratio_min": min(ratios), "ratios": ratios,
                     "ttft_ratio_median": med(ttft),
                     "localinfer_tps": med(r["output_tps"] for r in ours),
                     "llama_server_tps": med(r["output_tps"] for r in theirs),
                     "ceiling_tps": med(r["output_tps"] for r in bare) if bare else None,
                     "localinfer_of_ceiling": share(ours),
                     "llama_server_of_ceiling": share(theirs)}
            if name == "localinfer":
                summary[clients] = facts
            else:
                summary.setdefault("variants", {}).setdefault(name, {})[clients] = facts
            table.append([clients, name, f"{facts['llama_server_tps']:.1f}",
                          f"{facts['localinfer_tps']:.1f}",
                          f"**{med(ratios):.2f}** (lowest {min(ratios):.2f})",
                          " ".join(f"{x:.2f}" for x in ratios),
                          f"{med(r['ttft_p50_s'] for r in theirs):.3f} / "
                          f"{med(r['ttft_p50_s'] for r in ours):.3f} ({med(ttft):.2f})",
                          *([f"{facts['ceiling_tps']:.1f}",
                             f"{facts['llama_server_of_ceiling']:.2f} / "
                             f"{facts['localinfer_of_ceiling']:.2f}"] if bare else [])])
            ax.plot(range(1, len(ratios) + 1), ratios, "o-", label=name)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set(title=f"{clients} client(s)", xlabel="round",
               ylabel="localinfer ÷ llama-server tok/s")
        if len(ours_named) > 1:
            ax.legend(fontsize=7)
    lines = ["# Solo decode and 8 clients: localinfer against llama-server", "",
             f"The {args.shape} shape, random Q8_0 weights; both servers with {max(levels)} "
             f"slots of {CTX} tokens; greedy, {args.tokens} tokens a reply, {args.requests} "
             f"requests per client, the raw-socket client in a process of its own; "
             f"{args.reps} rounds with the servers in turns." + (
                 f" llama.cpp's ceiling: a bare loop decoding as many sequences {PROMPT} tokens "
                 f"in, on every core, timed in each round; a server's share of it is its "
                 f"streamed tok/s (prompts read, replies sent) over the loop's (each timed at a "
                 f"moment of its own: where the machine's speed drifts, a share can pass 1)."
                 if args.ceiling else ""), "",
             *harness.markdown_table(
                 ["clients", "server", "llama-server tok/s (median)", "its tok/s (median)",
                  "÷ llama-server", "each round", "TTFT p50 llama-server / it, s (ratio)",
                  *(["llama.cpp's ceiling tok/s (median)", "÷ ceiling, llama-server / it"]
                    if args.ceiling else [])], table)]
    meta = harness.run_facts(reps=args.reps, levels=levels, tokens=args.tokens, shape=args.shape,
                             requests=args.requests, ctx=CTX, variants=args.variant,
                             baseline=args.baseline,
                             llama_server=str(args.llama_server),
                             ceiling_device=device)
    harness.write(args.out, meta, {"summary": summary, "runs": rows}, lines, fig,
                  args.results)


if __name__ == "__main__":
    main()
