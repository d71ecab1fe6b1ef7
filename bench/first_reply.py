"""The first reply after a model loads: what it waited for that the next ones did not.

Before, the first request after a load paid twice for what only a first time costs:
llama.cpp's first decode (the weights of a mapped file read in, buffers and kernels made
ready; llama-server decodes once at load for it) and two facts asked of every token of the
vocabulary (whether a message holds control tokens; a long prompt's least count of tokens),
a ctypes call or two a token, and asked by each of several first requests at once. Now the
load decodes once (`NativeModel.warm_up`) and asks about the vocabulary
(`NativeModel.learn_vocabulary`).

Per round and model, each server is started afresh and, as soon as it says the model is
loaded, sent N requests at once (a 300-word system prompt and a question, 8 tokens each):
their TTFT, then the same again, warm. Servers: `localinfer serve` with the model in its own
process (as shipped, and "before": both first costs left to the first request, patched in
the same way), and llama-server (--llama-server) beside them. --baseline REV: `localinfer
serve` as shipped (its model in a runner process) and at another revision (a temporary
worktree laid out as it installs, run with PYTHONPATH), in place of those two. --cold
empties the page cache before each start (root only), so the first decode reads the weights
from the disk.

    python3 bench/first_reply.py [--llama-server PATH] [--vocab GGUF] [--shape llama3.2-1b]
                                 [--clients 1 8] [--reps 3] [--cold] [--only MODEL]
                                 [--baseline REV] [--out NAME]

Models: fast-step (bench/random_gguf.py: a CPU steps it at a GPU's rate) over smollm2's
49k vocabulary, and over --vocab's (llama.cpp's models/ggml-vocab-qwen2.gguf: Qwen's 152k);
the embedded smollm2; --shape: one of random_gguf.py's llama shapes, random Q8_0 weights.
Writes bench/results/first_reply.{json,md,png} (--out: another name).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import harness
from clients import level
from random_gguf import SHAPES, embedded_smollm2, fast_step_model, read_tokenizer, write_model

CTX = 1024  # per slot
SLOTS = 8
PROMPT_WORDS = 300
# "before": what the first request paid, put back in the server's own process
_BEFORE = (
    "import sys\n"
    "from localinfer.backends.native.model import NativeModel\n"
    "NativeModel.warm_up = lambda self: None\n"
    "learn = NativeModel.learn_vocabulary\n"
    "def on_first_use(self):  # (not the load's call: the first request's)\n"
    "    if sys._getframe(1).f_code.co_name != '__init__':\n"
    "        learn(self)\n"
    "NativeModel.learn_vocabulary = on_first_use\n")
LOCALINFER = {"localinfer": harness.IN_PROCESS, "localinfer before": harness.IN_PROCESS + _BEFORE}


def main() -> None:
    parser = harness.arguments(__doc__, reps=3, clients=[1, 8])
    parser.add_argument("--llama-server", type=Path)
    parser.add_argument("--vocab", type=Path, help="also fast-step over this GGUF's vocabulary")
    parser.add_argument("--shape", choices=sorted(SHAPES), help="also this llama shape")
    parser.add_argument("--cold", action="store_true",
                        help="empty the page cache before each start (root only)")
    parser.add_argument("--only", help="only this model (fast-step, smollm2, the --shape)")
    parser.add_argument("--baseline", help="localinfer as shipped against this git revision")
    parser.add_argument("--out", default="first_reply", help="file names under --results")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as home, \
            harness.baseline_tree(args.baseline, Path(home)) as tree:
        args.variants = {"localinfer": {}, f"localinfer at {args.baseline}": {
            "PYTHONPATH": str(tree)}} if tree is not None else None
        models = {"fast-step": fast_step_model(Path(home))}
        if args.vocab:
            fast = fast_step_model(Path(home), args.vocab)
            models[f"fast-step, {args.vocab.stem.removeprefix('ggml-vocab-')} vocabulary"] = fast
        models["smollm2"] = embedded_smollm2()
        if args.shape:
            path = Path(home) / f"{args.shape}.gguf"
            write_model(SHAPES[args.shape], path, read_tokenizer(embedded_smollm2()),
                        f"random {args.shape} Q8_0")
            models[args.shape] = path
        if args.only:
            models = {args.only: models[args.only]}
        for rep in range(args.reps):
            for label, model in models.items():
                for clients in args.clients:
                    for server in _servers(args):  # in turns, each started afresh
                        row = {"model": label, "server": server, "clients": clients,
                               "rep": rep, **_first(server, model, clients, home, args)}
                        rows.append(row)
                        print(f"{label:30s} {server:18s} {clients} clients: load "
                              f"{row['load_s']:.2f} s, first TTFT {row['first_ttft_s']:.3f} "
                              f"s (max {row['first_ttft_max_s']:.3f}), then "
                              f"{row['warm_ttft_s']:.3f} s", flush=True)
    meta = harness.run_facts(reps=args.reps, clients=args.clients, cold=args.cold,
                             vocab=args.vocab and args.vocab.name, shape=args.shape,
                             slots=SLOTS, ctx=CTX, prompt_words=PROMPT_WORDS,
                             baseline=args.baseline)
    write_report(meta, rows, args, list(models))


def _servers(args) -> list[str]:
    return [*(args.variants or LOCALINFER), *(["llama-server"] if args.llama_server else [])]


def _first(server: str, model: Path, clients: int, home: str, args) -> dict:
    if args.cold:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    began = time.perf_counter()
    if server == "llama-server":
        process, url = harness.start_server(
            [str(args.llama_server)], ["-m", str(model), "-np", str(SLOTS),
                                       "-c", str(CTX * SLOTS)])
    elif args.variants:  # as shipped, here or at the baseline revision
        process, url = harness.start_serve(harness.SERVE, str(model), SLOTS, CTX, home,
                                           args.variants[server])
    else:
        process, url = harness.start_serve([sys.executable, "-c", LOCALINFER[server]
                                            + harness.MAIN, "serve"], str(model), SLOTS, CTX,
                                           home)
    load = time.perf_counter() - began
    try:
        first = level(url, model.stem, clients, 1, 8, PROMPT_WORDS, client="raw")
        warm = level(url, model.stem, clients, 1, 8, PROMPT_WORDS, client="raw")
    finally:
        harness.stop_servers({server: (process, url)})
    if first["errors"] or warm["errors"]:
        raise SystemExit(f"{server}: the requests had errors: {first} {warm}")
    return {"load_s": load, "first_ttft_s": first["ttft_p50_s"],
            "first_ttft_max_s": first["ttft_p99_s"], "warm_ttft_s": warm["ttft_p50_s"]}


def write_report(meta: dict, rows: list[dict], args, models: list[str]) -> None:
    servers = _servers(args)

    def median(key: str, model: str, server: str, clients: int) -> float:
        return harness.median_of(rows, key, model=model, server=server, clients=clients)

    lines = [
        "# The first reply after a model loads",
        "",
        f"`python3 bench/first_reply.py{''.join(' ' + a for a in sys.argv[1:])}`: each server "
        f"started afresh ({SLOTS} slots of {CTX} tokens) and, once it says the model is "
        f"loaded, sent N requests at once ({PROMPT_WORDS}-word system prompt and a question, "
        "8 tokens each, bench/serve_load.py's raw-socket client), then the same again; "
        f"medians of {args.reps} rounds with the servers in turns"
        f"{', the page cache emptied before each start' if args.cold else ''}. "
        + (f"`localinfer` is `localinfer serve` as shipped (the model in a runner process), "
           f"`at {args.baseline}` the same at that revision. " if args.variants else
           "`localinfer` runs the model in its own process; `before` is the same server with "
           "the first decode and the vocabulary's facts left to the first request, as they "
           "were. ")
        + "Load: from the command to the model listed as loaded.",
        "",
        "| model | requests at once | server | load (s) | first TTFT p50 / max (s) | "
        "then (s) | first ÷ then |",
        "|---|---|---|---|---|---|---|",
    ]
    for model in models:
        for n in args.clients:
            for server in servers:
                m = {key: median(key, model, server, n) for key in
                     ("load_s", "first_ttft_s", "first_ttft_max_s", "warm_ttft_s")}
                lines.append(f"| {model} | {n} | {server} | {m['load_s']:.2f} | "
                             f"**{m['first_ttft_s']:.3f}** / {m['first_ttft_max_s']:.3f} | "
                             f"{m['warm_ttft_s']:.3f} | "
                             f"{m['first_ttft_s'] / m['warm_ttft_s']:.1f} |")
    cases = [(m, n) for m in models for n in args.clients]
    fig, axes = harness.figure(1, 1, size=(10, 4))
    ax = axes[0][0]
    width = 0.8 / len(servers)
    for i, server in enumerate(servers):
        xs = [x + i * width for x in range(len(cases))]
        ax.bar(xs, [median("first_ttft_s", m, server, n) for m, n in cases], width,
               label=server)
    ax.set_xticks([x + width * (len(servers) - 1) / 2 for x in range(len(cases))],
                  [f"{m}\n{n} at once" for m, n in cases], fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("first request's TTFT p50 (s)")
    ax.legend()
    ax.set_title("The first reply after a model loads")
    harness.write(args.out, meta, {"runs": rows}, lines, fig, folder=args.results)


if __name__ == "__main__":
    main()
