"""Requests arriving together with one long system prompt none has read yet: read it once.

Clients that start at the same moment with the same system prompt (an agent's parallel
tasks with its tools, users behind one front end after a restart) each bring a prompt that
starts alike and that no slot holds yet. Now the slot furthest along reads the shared start,
those behind it wait and take its KV once it is there, then read their own rest
(`Engine._share_reads`); before, every slot read all of it side by side. Each round sends N
requests at once whose system prompt (--words words) is new to every server, 8 tokens a
reply: their TTFT (median and longest) and how many prompt tokens each server read (its
/metrics, where it has them). Servers: `localinfer serve` as shipped, "before" (the same,
`_share_reads` turned off in the runner's place: the model in the server's own process for
both), and llama-server (--llama-server) beside them.

    python3 bench/shared_start.py [--llama-server PATH] [--models smollm2 fast-step]
                                  [--clients 8] [--words 600] [--reps 3]

Writes bench/results/shared_start.{json,md,png}.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

import harness
import httpx
from clients import level, shuffled_prompt
from random_gguf import embedded_smollm2, fast_step_model

CTX = 2048  # per slot: the system prompt, a question and the reply
_BEFORE = (  # every slot reads its whole prompt, as before
    "from localinfer.backends.engine.scheduler import Engine\n"
    "Engine._share_reads = lambda self: []\n")
LOCALINFER = {"localinfer": harness.IN_PROCESS, "localinfer before": harness.IN_PROCESS + _BEFORE}


def main() -> None:
    parser = harness.arguments(__doc__, reps=3, models=["smollm2", "fast-step"], clients=[8])
    parser.add_argument("--llama-server", type=Path)
    parser.add_argument("--words", type=int, default=600, help="the system prompt's words")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as home:
        makers = {"smollm2": embedded_smollm2, "fast-step": lambda: fast_step_model(Path(home))}
        for label in args.models:
            model = makers[label]()
            slots = max(args.clients)
            starts = {name: (lambda code=code: harness.start_serve(
                [sys.executable, "-c", code + harness.MAIN, "serve"], str(model), slots, CTX,
                home)) for name, code in LOCALINFER.items()}
            if args.llama_server:
                starts["llama-server"] = lambda: harness.start_server(
                    [str(args.llama_server)], ["-m", str(model), "-np", str(slots),
                                               "-c", str(CTX * slots)])
            servers = harness.start_servers(starts)
            try:
                for rep in range(args.reps):
                    for clients in args.clients:
                        for name, (_, url) in servers.items():  # a system prompt new to each
                            system = shuffled_prompt(1000 * rep + 100 * clients
                                                     + list(servers).index(name), args.words)
                            read = _read_tokens(url)
                            row = level(url, model.stem, clients, 1, 8, 0, client="raw",
                                        system=system)
                            row.update(model=label, server=name, rep=rep,
                                       prompt_tokens_read=_read_tokens(url) - read
                                       if read is not None else None)
                            rows.append(row)
                            print(f"{label:10s} {name:18s} {clients} at once: TTFT p50 "
                                  f"{row['ttft_p50_s']:.3f} s, longest "
                                  f"{row['ttft_p99_s']:.3f} s, prompt tokens read "
                                  f"{row['prompt_tokens_read']}", flush=True)
                            if row["errors"]:
                                raise SystemExit(f"{name}: the requests had errors")
            finally:
                harness.stop_servers(servers)
    meta = harness.run_facts(reps=args.reps, clients=args.clients, words=args.words,
                             ctx=CTX, models=args.models)
    write_report(meta, rows, args)


def _read_tokens(url: str) -> float | None:
    """Prompt tokens a server has read so far (not found cached), from its /metrics:
    localinfer's received less cached; llama-server's only with --metrics (None)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    found = {name: sum(float(v) for v in re.findall(rf"^{name}(?:_total)?{{[^}}]*}} (\S+)",
                                                     text, re.M))
             for name in ("localinfer_prompt_tokens", "localinfer_cached_prompt_tokens")}
    if "localinfer_prompt_tokens" not in text:
        return None
    return found["localinfer_prompt_tokens"] - found["localinfer_cached_prompt_tokens"]


def write_report(meta: dict, rows: list[dict], args) -> None:
    servers = list(dict.fromkeys(r["server"] for r in rows))
    cases = [(m, n) for m in args.models for n in args.clients]

    def median(key: str, model: str, server: str, clients: int) -> float | None:
        return harness.median_of(rows, key, model=model, server=server, clients=clients)

    def each(model: str, server: str, clients: int) -> str:
        return " ".join(f"{r['ttft_p50_s']:.2f}" for r in rows if r["model"] == model
                        and r["server"] == server and r["clients"] == clients)

    lines = [
        "# Requests arriving together with one long system prompt",
        "",
        f"`python3 bench/shared_start.py{''.join(' ' + a for a in sys.argv[1:])}`: each round "
        f"sends N requests at once whose system prompt ({args.words} words, new to every "
        f"server each round) is the same, with a question of their own; 8 tokens a reply; "
        f"{max(args.clients)} slots of {CTX} tokens; bench/serve_load.py's raw-socket "
        f"client; medians of {args.reps} rounds with the servers in turns. `localinfer` "
        "runs the model in its own process; `before` is the same server with every slot "
        "reading its whole prompt, as it did. Prompt tokens read: what the server read, "
        "less what it found cached (localinfer's /metrics).",
        "",
        "| model | requests at once | server | TTFT p50 (s) | each round | longest (s) | "
        "prompt tokens read |",
        "|---|---|---|---|---|---|---|",
    ]
    for model, n in cases:
        for server in servers:
            read = median("prompt_tokens_read", model, server, n)
            lines.append(f"| {model} | {n} | {server} | "
                         f"**{median('ttft_p50_s', model, server, n):.3f}** | "
                         f"{each(model, server, n)} | "
                         f"{median('ttft_p99_s', model, server, n):.3f} | "
                         f"{'' if read is None else f'{read:.0f}'} |")
    fig, axes = harness.figure(1, 1, size=(8, 4))
    ax = axes[0][0]
    width = 0.8 / len(servers)
    for i, server in enumerate(servers):
        xs = [x + i * width for x in range(len(cases))]
        ax.bar(xs, [median("ttft_p50_s", m, server, n) for m, n in cases], width, label=server)
    ax.set_xticks([x + width * (len(servers) - 1) / 2 for x in range(len(cases))],
                  [f"{m}\n{n} at once" for m, n in cases])
    ax.set_ylabel("TTFT p50 (s)")
    ax.legend()
    ax.set_title(f"{max(args.clients)} requests at once, one {args.words}-word system prompt")
    harness.write("shared_start", meta, {"runs": rows}, lines, fig, folder=args.results)


if __name__ == "__main__":
    main()
