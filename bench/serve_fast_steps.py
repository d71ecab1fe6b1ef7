"""`localinfer serve` against llama.cpp's own server at a GPU's step rates, on a CPU.

The model is bench/random_gguf.py's fast-step shape (one thin layer over smollm2's
vocabulary): a CPU decodes it in a few ms a step, as a GPU decodes a 1B model, so what each
server does around llama_decode decides the result. The two servers run side by side and
take the load in turns, so machine noise hits both: llama-server, built from the llama.cpp
source llama-cpp-python ships (its defaults, -np N), and `localinfer serve`. (localinfer
against its own earlier self: bench/stream_cost.py.) Scenarios: greedy, sampled (temperature 0.8, each server's default chain), and a shared
system prompt of 300 words. The load is bench/serve_load.py's raw-socket client.

Build llama-server once (CPU; ~15 min on 2 cores):
    pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36 -d /tmp/sdist
    tar xzf /tmp/sdist/llama_cpp_python-0.3.36.tar.gz -C /tmp
    cd /tmp/llama_cpp_python-0.3.36/vendor/llama.cpp
    sed -i 's/bufts.push_back(ggml_backend_amx_buffer_type());//' \\
        ggml/src/ggml-cpu/ggml-cpu.cpp  # (AMX off, as localinfer has it: see below)
    cmake -B build -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \\
          -DLLAMA_BUILD_EXAMPLES=OFF && cmake --build build --target llama-server -j

On a Xeon with AMX (Sapphire Rapids or later) a build for the machine's own CPU has
llama.cpp's AMX kernels, whose matrix product crashes on the first decode (llama.cpp
#20824): llama-server dies as it loads. localinfer takes them out of the CPU's buffer types
(backends/native/ggml.py), and the sed above does the same to llama-server, so the two run
the same kernels. Elsewhere it changes nothing.

    python3 bench/serve_fast_steps.py --llama-server PATH [--levels 8,32] [--reps 3]
                                      [--tokens 256] [--requests 3] [--results FOLDER]
                                      [--vocab GGUF --out NAME]

`--vocab`: the fast-step shape over that GGUF's vocabulary instead of smollm2's 49k (the
models people run have larger ones: llama.cpp's models/ggml-vocab-qwen2.gguf holds Qwen's
151,936 tokens), where what choosing a token costs shows.

Writes bench/results/serve_fast_steps.{json,md,png} (`--out`: another name).
"""

from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path

import harness
from clients import level
from random_gguf import fast_step_model  # bench/, the script's own folder

CTX = 1024  # per request: the 300-word prefix (~400 tokens) and the reply fit
SCENARIOS = {  # name: (temperature, shared prefix words, at every level or only the lowest)
    "greedy": (0.0, 0, True),
    "sampled, temperature 0.8": (0.8, 0, True),
    "greedy, 300-word shared prefix": (0.0, 300, False),
}
SERVERS = ("llama-server", "localinfer")


def main() -> None:
    parser = harness.arguments(__doc__, tokens=256, reps=3)
    parser.add_argument("--llama-server", type=Path, required=True)
    parser.add_argument("--levels", default="8,32", help="concurrent clients")
    parser.add_argument("--requests", type=int, default=3, help="per client")
    parser.add_argument("--vocab", type=Path, help="a GGUF whose vocabulary the model takes")
    parser.add_argument("--out", default="serve_fast_steps", help="file names")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    with tempfile.TemporaryDirectory() as home:
        model = fast_step_model(Path(home), args.vocab)
        slots = max(levels)
        servers = harness.start_servers({  # llama-server with its defaults; localinfer as a user runs it
            "llama-server": lambda: harness.start_server(
                [str(args.llama_server)],
                ["-m", str(model), "-np", str(slots), "-c", str(CTX * slots)]),
            "localinfer": lambda: harness.start_serve(harness.SERVE, str(model), slots, CTX, home)})
        rows = []
        try:
            for _ in range(args.reps):
                for scenario, (temperature, prefix, every_level) in SCENARIOS.items():
                    for clients in levels if every_level else levels[:1]:
                        for name, (_, url) in servers.items():
                            row = level(url, model.stem, clients, args.requests, args.tokens,
                                        prefix, client="raw", temperature=temperature)
                            rows.append({"server": name, "scenario": scenario, **row})
                            print(f"{name:18s} {scenario:31s} {clients:3d} clients: "
                                  f"{row['output_tps']:6.0f} tok/s, TTFT p50 "
                                  f"{row['ttft_p50_s'] or 0:.3f} s, errors {row['errors']}",
                                  flush=True)
        finally:
            harness.stop_servers(servers)
    meta = harness.run_facts(llama_server=args.llama_server.name, levels=levels,
                             tokens=args.tokens, requests=args.requests, reps=args.reps,
                             vocab=args.vocab and args.vocab.name)
    write_report(meta, rows, args, levels)



def write_report(meta: dict, rows: list[dict], args, levels: list[int]) -> None:
    cases = [(s, n) for s, (_, _, every) in SCENARIOS.items()
             for n in (levels if every else levels[:1])]

    def median(key: str, server: str, scenario: str, clients: int) -> float:
        return statistics.median(r[key] or 0 for r in rows if r["server"] == server
                                 and r["scenario"] == scenario and r["clients"] == clients)

    vocab = f"the vocabulary of {args.vocab.name}" if args.vocab else "smollm2's 49k vocabulary"
    flags = f" --vocab {args.vocab} --out {args.out}" if args.vocab else ""
    lines = [
        "# `localinfer serve` against llama-server at a GPU's step rates (on a CPU)",
        "",
        f"`python3 bench/serve_fast_steps.py --llama-server PATH{flags}`: the fast-step random "
        f"model (one thin layer over {vocab}; a CPU steps it in a few ms, as a GPU "
        f"steps a 1B model), {max(levels)} slots of {CTX} tokens, {args.tokens} tokens a "
        f"request, {args.requests} requests per client, bench/serve_load.py's raw-socket "
        f"client; medians of {args.reps} runs with the servers in turns. {os.cpu_count()} "
        "CPUs, shared by server and client, so single runs vary by ±20%. llama-server is built "
        "from the llama.cpp source llama-cpp-python 0.3.36 ships, and runs with its defaults.",
        "",
        "| scenario | clients | " + " | ".join(f"{s} tok/s" for s in SERVERS)
        + " | localinfer ÷ llama-server | TTFT p50 localinfer / llama-server (s) |",
        "|---|---|" + "---|" * (len(SERVERS) + 2),
    ]
    for scenario, n in cases:
        tps = {s: median("output_tps", s, scenario, n) for s in SERVERS}
        lines.append(
            f"| {scenario} | {n} | " + " | ".join(f"{tps[s]:.0f}" for s in SERVERS)
            + f" | {tps['localinfer'] / tps['llama-server']:.2f}"
            + f" | {median('ttft_p50_s', 'localinfer', scenario, n):.3f} / "
            + f"{median('ttft_p50_s', 'llama-server', scenario, n):.3f} |")
    fig, axes = harness.figure(1, 1, size=(9, 3.8))
    ax = axes[0][0]
    width = 0.8 / len(SERVERS)
    for i, server in enumerate(SERVERS):
        xs = [x + i * width for x in range(len(cases))]
        ax.bar(xs, [median("output_tps", server, s, n) for s, n in cases], width, label=server)
    ax.set_xticks([x + width * (len(SERVERS) - 1) / 2 for x in range(len(cases))],
                  ["\n".join([*s.split(", "), f"{n} clients"]) for s, n in cases], fontsize=8)
    ax.set_ylabel("streamed tokens/s")
    ax.legend()
    ax.set_title("localinfer serve vs llama-server, fast-step model on a CPU")
    harness.write(args.out, meta, {"runs": rows}, lines, fig, folder=args.results)


if __name__ == "__main__":
    main()
