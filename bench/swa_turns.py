"""A sliding-window model at 32K context, 4 slots, 4 growing chats at once: `localinfer serve`
against llama-server.

The model is Gemma 3 270M itself (the embedded `gemma3:270m`, Q4_K_M: five layers in six
attend to a window of 512, the sixth to the whole context). Both servers run it at their
defaults with 4 slots of 32,768 tokens: llama-server keeps a windowed layer's cache at its
window (no --swa-full) and context checkpoints for the prompts it cannot continue; so does
localinfer. Measured: the KV cache each allocates (llama.cpp's load log: its "KV buffer
size" lines), each server's memory (RSS, with its runner) after the chats, and TTFT per turn,
timed at the clients: four chats at once, each 6 turns (a 300-word system prompt, ~90-word
questions, greedy replies of --tokens sent back as the client got them), then each chat's
last prompt once more with a new first word (the full re-read). Rounds alternate between the
servers; medians over the chats and rounds.

    python3 bench/swa_turns.py --llama-server PATH [--reps 3] [--tokens 24]

Writes bench/results/swa_turns.{json,md,png}.
"""

from __future__ import annotations

import re
import statistics
import tempfile
import threading
from pathlib import Path

import harness
import psutil
from clients import growing_chat

from localinfer.model_store.sources import resolve

MODEL = "gemma3:270m"
TURNS = 6
CTX = 32768  # per slot
SLOTS = 4
SERVERS = ("llama-server", "localinfer")
_KV = re.compile(r"KV buffer size =\s*([\d.]+) MiB")


def chat(url: str, name: str, seed: int, tokens: int, out: dict) -> None:
    """One growing chat and the re-read of its last prompt, into `out`."""
    out.update(growing_chat(url, name, seed, False, tokens, TURNS))


def chats(url: str, name: str, seed: int, tokens: int) -> list[dict]:
    """SLOTS chats at once (`name`: the model, as the server calls it)."""
    outs: list[dict] = [{} for _ in range(SLOTS)]
    threads = [threading.Thread(target=chat, args=(url, name, seed * 100 + i, tokens, outs[i]))
               for i in range(SLOTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if any("turns" not in o for o in outs):
        raise SystemExit(f"{url}: a chat did not finish")
    return outs


def load_logs(llama_server: Path, model: Path, home: str) -> dict[str, str]:
    """Each server's load log at the verbosity that shows llama.cpp's buffers (llama-server
    -lv 4, localinfer --verbose), from a load of its own: the measured servers run at their
    default verbosity."""
    file = Path(home) / "llama-server-load.log"
    servers = harness.start_servers({
        "llama-server": lambda: harness.start_server(
            [str(llama_server)], ["-m", str(model), "-np", str(SLOTS), "-c", str(SLOTS * CTX),
                                  "--jinja", "-lv", "4", "--log-file", str(file)]),
        "localinfer": lambda: harness.start_server(
            harness.SERVE, ["--model", str(model), "--parallel", str(SLOTS), "--ctx", str(CTX),
                            "--verbose"], path="/api/ps",
            ready=lambda r: bool(r.json().get("models")), env={"LOCALINFER_HOME": home})})
    logs = {"localinfer": harness.server_log(servers["localinfer"][0])}
    harness.stop_servers(servers)
    logs["llama-server"] = file.read_text(errors="replace")
    return logs


def _rss(process) -> int:
    """The server's resident memory and its children's (localinfer's runner)."""
    root = psutil.Process(process.pid)
    return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])


def main() -> None:
    parser = harness.arguments(__doc__, tokens=24, reps=3)
    parser.add_argument("--llama-server", type=Path, required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        model = resolve(MODEL, Path(home) / "store").path
        logs = load_logs(args.llama_server, model, home)
        servers = harness.start_servers({
            "llama-server": lambda: harness.start_server(
                [str(args.llama_server)], ["-m", str(model), "-np", str(SLOTS), "-c",
                                           str(SLOTS * CTX), "--jinja"]),
            "localinfer": lambda: harness.start_serve(harness.SERVE, str(model), SLOTS, CTX,
                                                      home)})
        runs: dict[str, list] = {s: [] for s in SERVERS}
        memory: dict[str, dict] = {}
        try:
            for rep in range(args.reps):
                for name in (SERVERS if rep % 2 == 0 else SERVERS[::-1]):
                    result = chats(servers[name][1], model.stem, rep * 10, args.tokens)
                    runs[name].append(result)
                    print(name, rep, [[round(t["ttft_s"], 2) for t in c["turns"]]
                                      for c in result], flush=True)
            for name in SERVERS:
                process = servers[name][0]
                kv = [float(x) for x in _KV.findall(logs[name])]
                memory[name] = {"kv_mib": sum(kv), "kv_buffers_mib": kv,
                                "rss_mib": _rss(process) / 2**20}
                print(name, memory[name], flush=True)
        finally:
            harness.stop_servers(servers)
    report(args, runs, memory)


def report(args, runs: dict, memory: dict) -> None:
    med = statistics.median
    summary, rows = {}, []
    fig, axes = harness.figure(1)
    for name in SERVERS:
        every = [c for r in runs[name] for c in r]  # each chat of each round
        per_turn = [med(c["turns"][t]["ttft_s"] for c in every) for t in range(TURNS)]
        cold = med(c["cold"]["ttft_s"] for c in every)
        cached = [med(c["turns"][t]["cached"] or 0 for c in every) for t in range(TURNS)]
        summary[name] = {"ttft_s": per_turn, "reread_s": cold, "cached": cached,
                         "prompt_tokens": [every[0]["turns"][t]["prompt_tokens"]
                                           for t in range(TURNS)], **memory.get(name, {})}
        later = med(t for t in per_turn[1:])
        summary[name]["later_turns_s"] = later
        rows.append([name, f"{memory[name]['kv_mib']:.0f}", f"{memory[name]['rss_mib']:.0f}",
                     *(f"{1000 * t:.0f}" for t in per_turn), f"{1000 * cold:.0f}",
                     " / ".join(f"{c:.0f}" for c in cached)])
        axes[0][0].plot(range(1, TURNS + 1), [1000 * t for t in per_turn], "o-", label=name)
    axes[0][0].set(title="4 chats at once, Gemma 3 270M, 4 x 32K", xlabel="turn",
                   ylabel="TTFT (ms)")
    axes[0][0].legend()
    ratio = summary["localinfer"]["later_turns_s"] / summary["llama-server"]["later_turns_s"]
    kv = summary["localinfer"]["kv_mib"] / summary["llama-server"]["kv_mib"]
    lines = ["# A sliding-window model's growing chats at 32K: localinfer against llama-server",
             "", f"Gemma 3 270M (Q4_K_M), {SLOTS} slots of {CTX} tokens, both servers at "
             f"their defaults; {SLOTS} chats at once, {TURNS} turns each (a 300-word system "
             f"prompt, ~90-word questions, {args.tokens}-token greedy replies sent back), "
             f"{args.reps} alternating rounds. TTFT in ms at the clients, medians over every "
             "chat of every round; \"re-read\" is each chat's last prompt with nothing "
             "cached. KV: llama.cpp's KV buffers at load (from a load of each at a verbose log level); RSS: the server and its runner "
             "after the chats.", "",
             *harness.markdown_table(
                 ["server", "KV MiB", "RSS MiB", *(f"turn {t + 1}" for t in range(TURNS)),
                  "re-read", "cached tokens per turn"], rows), "",
             f"Turns 2-6, median TTFT: localinfer ÷ llama-server = **{ratio:.2f}**; KV "
             f"memory: **{kv:.2f}x** llama-server's; prompt tokens per turn: "
             f"{summary['localinfer']['prompt_tokens']}."]
    meta = harness.run_facts(reps=args.reps, tokens=args.tokens, ctx=CTX, slots=SLOTS,
                             llama_server=str(args.llama_server))
    harness.write("swa_turns", meta, summary, lines, fig, args.results)


if __name__ == "__main__":
    main()
