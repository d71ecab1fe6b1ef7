"""Two models answering at once on one CPU: how their runners share its cores.

One `localinfer serve` per setting, each with both embedded models loaded (smollm2:135m and
gemma3:270m, a runner each); per round, --streams greedy streams of each model start at once
(--tokens tokens each, end of text banned, a fresh prompt per round) and are timed at the
clients: each stream's TTFT, and the time until the last stream's last token. Settings, in
turns so that machine noise hits each: localinfer's default (each step claims its threads in
the machine's core share, and waits for a core that another runner's running step holds),
`--no-core-share` (each runner counts the cores alone: the thread tuner sees the other runner
only after some slow steps), and fixed counts: `--threads 1`, and one per physical core
(what llama.cpp and Ollama do).

With --embed, gemma3:270m embeds instead: while smollm2's streams run, one client sends it
requests of 8 documents of ~140 words back to back (/v1/embeddings), and its tokens a second
are timed beside the streams' (an editor indexing a project while its user chats).

    python3 bench/two_models.py [--reps 3] [--streams 2] [--tokens 128] [--embed]
                                [--results FOLDER]

Writes bench/results/two_models.{json,md,png} (two_models_embed.* with --embed).
"""

from __future__ import annotations

import random
import statistics
import tempfile
import threading
import time

import httpx

import harness
from clients import shuffled_prompt, stream_times
from localinfer.backends.engine.threads import physical_cores

MODELS = {  # each model's end-of-generation tokens, banned: a reply runs to its limit
    "smollm2:135m": {"0": -100, "2": -100, "4": -100},
    "gemma3:270m": {"1": -100, "106": -100},
}


def settings() -> dict[str, list[str]]:
    cores = physical_cores()
    return {"shared cores (default)": [], "--no-core-share": ["--no-core-share"],
            "--threads 1": ["--threads", "1"], f"--threads {cores}": ["--threads", str(cores)]}


def start(flags: list[str], home: str) -> tuple:
    process, url = harness.start_server(
        harness.SERVE, ["--model", "smollm2:135m", "--parallel", "2", "--ctx", "1024", *flags],
        path="/api/ps", ready=lambda r: bool(r.json().get("models")),
        env={"LOCALINFER_HOME": home})
    loaded = httpx.post(url + "/api/generate", json={"model": "gemma3:270m"}, timeout=300)
    if loaded.status_code != 200:
        raise SystemExit(f"gemma3:270m did not load: HTTP {loaded.status_code}")
    return process, url


def stream(url: str, model: str, prompt: str, tokens: int, row: dict) -> None:
    row["times"] = []
    stream_times(url, model, prompt, tokens, row["times"], logit_bias=MODELS[model])


EMBEDDER = "gemma3:270m"
_WORDS = ("harbour lantern keeper tide rope gull stone window evening storm ledger candle "
          "island signal ferry north bell copper mill river orchard winter letter bridge").split()


def embed_until(url: str, seed: int, done: threading.Event, out: dict) -> None:
    """Requests of 8 documents of 140 words to EMBEDDER, one after another until `done`:
    the prompt tokens they read and the seconds they took."""
    rng = random.Random(seed)
    out["tokens"], began = 0, time.perf_counter()
    try:
        with httpx.Client(timeout=600) as client:
            while not done.is_set():
                texts = [" ".join(rng.choice(_WORDS) for _ in range(140)) for _ in range(8)]
                reply = client.post(url + "/v1/embeddings",
                                    json={"model": EMBEDDER, "input": texts})
                if reply.status_code != 200:
                    out["error"] = f"{url}: HTTP {reply.status_code}: {reply.text[:300]}"
                    return
                out["tokens"] += reply.json()["usage"]["prompt_tokens"]
    except httpx.HTTPError as err:
        out["error"] = f"{url}: {err!r}"
    finally:
        out["seconds"] = time.perf_counter() - began


def one_round(url: str, seed: int, streams: int, tokens: int, embed: bool = False) -> dict:
    chatting = [m for m in MODELS if not (embed and m == EMBEDDER)]
    rows = [{"model": model} for model in chatting for _ in range(streams)]
    threads = [threading.Thread(target=stream, args=(
        url, row["model"], shuffled_prompt(seed + i, 40), tokens, row))
        for i, row in enumerate(rows)]
    done, embedded = threading.Event(), {}
    embedder = threading.Thread(target=embed_until, args=(url, seed, done, embedded))
    sent = time.perf_counter()
    for t in threads:
        t.start()
    if embed:
        embedder.start()
    for t in threads:
        t.join()
    done.set()
    if embed:
        embedder.join()
        if "error" in embedded:
            raise SystemExit(embedded["error"])
    ttft = {model: [r["times"][0] - sent for r in rows if r["model"] == model]
            for model in chatting}
    last = max(r["times"][-1] for r in rows) - sent
    generated = sum(len(r["times"]) for r in rows)
    row = {"ttft_s": ttft, "max_ttft_s": max(max(v) for v in ttft.values()),
           "wall_s": last, "tokens": generated, "tok_s": generated / last}
    if embed:
        row["embed_tok_s"] = embedded["tokens"] / embedded["seconds"]
    return row


def main() -> None:
    parser = harness.arguments(__doc__, reps=3, tokens=128)
    parser.add_argument("--streams", type=int, default=2, help="streams of each model")
    parser.add_argument("--embed", action="store_true",
                        help=f"{EMBEDDER} embeds beside the other model's streams")
    args = parser.parse_args()
    named = settings()
    runs: dict[str, list[dict]] = {name: [] for name in named}
    with tempfile.TemporaryDirectory() as home:
        servers = harness.start_servers({name: (lambda f=flags: start(f, home))
                                         for name, flags in named.items()})
        try:
            for rep in range(args.reps):
                order = list(named) if rep % 2 == 0 else list(named)[::-1]
                for name in order:
                    row = one_round(servers[name][1], 100 * rep, args.streams, args.tokens,
                                    args.embed)
                    runs[name].append(row)
                    embedded = (f", embedding {row['embed_tok_s']:6.1f} tok/s" if args.embed
                                else "")
                    print(f"{name:24s} round {rep}: max TTFT {row['max_ttft_s']:5.2f} s, "
                          f"all done {row['wall_s']:5.2f} s, {row['tok_s']:5.1f} tok/s"
                          f"{embedded}", flush=True)
        finally:
            harness.stop_servers(servers)
    report(args, runs)


def report(args, runs: dict[str, list[dict]]) -> None:
    med = statistics.median
    base = "shared cores (default)"
    summary, rows = {}, []
    for name, rounds in runs.items():
        ratio = [r["wall_s"] / b["wall_s"] for r, b in zip(rounds, runs[base])]
        summary[name] = {"max_ttft_s": med(r["max_ttft_s"] for r in rounds),
                         "wall_s": med(r["wall_s"] for r in rounds),
                         "tok_s": med(r["tok_s"] for r in rounds), "wall_vs_default": ratio}
        ttfts = " ".join(f"{r['max_ttft_s']:.2f}" for r in rounds)
        walls = " ".join(f"{r['wall_s']:.1f}" for r in rounds)
        rows.append([name, f"**{summary[name]['max_ttft_s']:.2f}** ({ttfts})",
                     f"**{summary[name]['wall_s']:.1f}** ({walls})",
                     f"{summary[name]['tok_s']:.1f}", f"{med(ratio):.2f}"])
        if args.embed:
            summary[name]["embed_tok_s"] = med(r["embed_tok_s"] for r in rounds)
            rows[-1].append(f"**{summary[name]['embed_tok_s']:.0f}** ("
                            + " ".join(f"{r['embed_tok_s']:.0f}" for r in rounds) + ")")
    fig, axes = harness.figure(2, size=(5.5, 3.6))
    names = list(runs)
    axes[0][0].barh(names, [summary[n]["max_ttft_s"] for n in names], color="#1f4fd1")
    axes[0][0].set(xlabel="seconds", title="longest TTFT of the streams")
    axes[0][1].barh(names, [summary[n]["wall_s"] for n in names], color="#9aa4b2")
    axes[0][1].set(xlabel="seconds", title="until every stream has ended")
    for ax in axes[0]:
        ax.invert_yaxis()
    what = (f"{args.streams} greedy streams of smollm2:135m started at once, {args.tokens} "
            f"tokens each (end of text banned), while one client sends {EMBEDDER} requests "
            f"of 8 documents of ~140 words back to back (/v1/embeddings)" if args.embed else
            f"{args.streams} greedy streams of each model started at once, {args.tokens} "
            f"tokens each (end of text banned)")
    header = ["setting", "longest TTFT (s)", "all streams done (s)", "tokens/s, all streams",
              "done ÷ default's"] + (["embedding tokens/s"] if args.embed else [])
    title = ("A chat and an embedding model at once on one CPU" if args.embed
             else "Two models answering at once on one CPU")
    lines = [f"# {title}", "",
             f"`localinfer serve` with smollm2:135m and gemma3:270m loaded, a runner each; "
             f"{what}, timed at the clients. Medians of {args.reps} "
             "rounds with the settings in turns (each round in brackets).", "",
             *harness.markdown_table(header, rows)]
    meta = harness.run_facts(streams=args.streams, tokens=args.tokens, reps=args.reps,
                             embed=args.embed)
    harness.write("two_models_embed" if args.embed else "two_models", meta,
                  {"summary": summary, "runs": runs}, lines, fig, folder=args.results)


if __name__ == "__main__":
    main()
