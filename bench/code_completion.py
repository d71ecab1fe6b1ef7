"""Code completion as an editor asks for it: a 16-token fill-in-the-middle completion on a
2,000-token file, cold and a keystroke later, and what abandoned completions cost a chat
stream beside them.

    python3 bench/random_gguf.py llama3.2-1b /tmp/coder.gguf --tokenizer ggml-vocab-starcoder.gguf
    python3 bench/code_completion.py --model /tmp/coder.gguf [--reps 3] [--results FOLDER]

(`ggml-vocab-starcoder.gguf` is in the llama-cpp-python source release, under
vendor/llama.cpp/models/: StarCoder's vocabulary, with its FIM tokens.) Through
`localinfer serve` and llama-server's `/infill`, as the llama.vscode plugin sends it:
1. cold: a file the server has not seen (each round's file begins with a comment of its
   own); after an edit: the same file with a few characters typed at the cursor; a line
   down: the editor's window over the file moved down (its first three lines gone, the
   finished line added at the cursor), where only --cache-reuse keeps the rest of the file
   cached. Client wall time to the 16-token completion, and the cached tokens the server
   reports — with the server's defaults and with `--cache-reuse 0`.
2. a chat stream (200 tokens) alone, and again while 10 completions in a row are asked for
   and abandoned 100 ms later (the client hangs up, as an editor does on the next key):
   the stream's inter-token latency, median and p99 — with the server's defaults, and with
   `--step-budget 2` (a prompt chunk beside running streams held to 2x a decode step).

Writes bench/results/code_completion.{json,md,png}.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import harness
import httpx

CASES = {"cold": "cold (a file not seen)", "after an edit": "a keystroke later (3 characters "
         "typed)", "a line down": "a line down (the window moved: 3 lines gone, 1 added)"}
SUFFIX = "".join(f"    result_{i} = compute({i})\n" for i in range(20)) + "    return result_0\n"


def source_lines(rep: int) -> list[str]:
    lines = [f"# round {rep}: a file the server has not seen\n"]
    for i in range(90):
        lines += [f"def helper_{i}(value):\n", f"    return value * {i} + {i % 7}\n", "\n"]
    return lines + ["def main():\n"]


def source_file(rep: int) -> str:
    return "".join(source_lines(rep)) + "    total = "


def moved_down(rep: int) -> str:
    """The window a line down: its first three lines gone, the finished line above the
    cursor."""
    return "".join(source_lines(rep)[3:]) + "    total = helper_1(2)\n    count = "


def infill(url: str, prefix: str) -> dict:
    started = time.perf_counter()
    reply = httpx.post(url + "/infill", timeout=600, json={
        "input_prefix": prefix, "input_suffix": SUFFIX, "n_predict": 16, "temperature": 0,
        "logit_bias": [[0, False]]})  # (StarCoder's end token: all 16 are written)
    data = reply.json()
    return {"wall_s": time.perf_counter() - started, "evaluated": data["tokens_evaluated"],
            "cached": data["tokens_cached"], "predicted": data["tokens_predicted"]}


def chat_itls(url: str, model: str, abandon: bool) -> list[float]:
    """A streamed chat's gaps between tokens; meanwhile, maybe, 10 abandoned completions."""
    times: list[float] = []
    stop = threading.Event()

    def abandon_ten() -> None:
        time.sleep(0.3)
        for i in range(10):
            if stop.is_set():
                return
            try:
                httpx.post(url + "/infill", json={"input_prefix": source_file(1000 + i),
                                                  "input_suffix": SUFFIX, "n_predict": 16},
                           timeout=httpx.Timeout(60, read=0.1))
            except httpx.ReadTimeout:
                pass  # hung up, as an editor does on the next keystroke

    helper = threading.Thread(target=abandon_ten) if abandon else None
    if helper:
        helper.start()
    body = {"model": model, "stream": True, "max_tokens": 200, "temperature": 0.7,
            "messages": [{"role": "user", "content": "Write about lighthouses."}],
            "logit_bias": {"0": -100}}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: {") and '"content":' in line:
                times.append(time.perf_counter())
    stop.set()
    if helper:
        helper.join()
    return [b - a for a, b in zip(times, times[1:])]


def main() -> None:
    parser = harness.arguments(__doc__, reps=3)
    parser.add_argument("--model", required=True, help="a GGUF with FIM tokens")
    args = parser.parse_args()
    model = Path(args.model).stem
    rows, itl_rows = [], []
    variants = {"defaults": [], "--cache-reuse 0": ["--cache-reuse", "0"],
                "--step-budget 2": ["--step-budget", "2"]}
    completion_variants = ["defaults", "--cache-reuse 0"]
    itl_variants = ["defaults", "--step-budget 2"]
    with tempfile.TemporaryDirectory() as home:
        servers = harness.start_servers({name: (lambda name=name, extra=extra: harness.start_server(
            [sys.executable, "-m", "localinfer", "serve"],
            ["--model", args.model, "--parallel", "2", "--ctx", "4096", *extra],
            path="/api/ps", ready=lambda r: bool(r.json().get("models")),
            env={"LOCALINFER_HOME": str(Path(home) / name.replace(" ", "_"))}))
            for name, extra in variants.items()})
        try:
            for rep in range(args.reps):
                for name in completion_variants:
                    url = servers[name][1]
                    prefix = source_file(rep)
                    for case, text in (("cold", prefix),
                                       ("after an edit", prefix + "helper_1("),
                                       ("a line down", moved_down(rep))):
                        rows.append({"rep": rep, "server": name, "case": case,
                                     **infill(url, text)})
                        print(rows[-1], flush=True)
            for rep in range(args.reps):
                for name in itl_variants:
                    variant_url = servers[name][1]
                    for abandon in ((False, True) if rep % 2 == 0 else (True, False)):
                        gaps = chat_itls(variant_url, model, abandon)
                        itl_rows.append({"rep": rep, "server": name, "abandoned": abandon,
                                         "itls": gaps})
                        print(rep, name, abandon, f"p50 {statistics.median(gaps) * 1e3:.1f} ms "
                              f"p99 {sorted(gaps)[int(0.99 * len(gaps))] * 1e3:.0f} ms",
                              flush=True)
        finally:
            harness.stop_servers(servers)

    def med(case: str, key: str, server: str = "defaults") -> float:
        return statistics.median(r[key] for r in rows
                                 if r["case"] == case and r["server"] == server)

    def itl(server: str, abandoned: bool, q: float) -> float:
        gaps = sorted(g for r in itl_rows if r["abandoned"] == abandoned
                      and r["server"] == server for g in r["itls"])
        return gaps[min(len(gaps) - 1, int(q * len(gaps)))] * 1e3

    summary = {
        "cold_s": med("cold", "wall_s"), "edit_s": med("after an edit", "wall_s"),
        "file_tokens": med("cold", "evaluated"), "edit_cached": med("after an edit", "cached"),
        "completions": {server: {case: {"wall_s": med(case, "wall_s", server),
                                        "cached": med(case, "cached", server)}
                                 for case in CASES} for server in completion_variants},
        "itl_ms": {server: {"alone": [itl(server, False, 0.5), itl(server, False, 0.99)],
                            "abandoned": [itl(server, True, 0.5), itl(server, True, 0.99)]}
                   for server in itl_variants},
    }
    line_down = summary["completions"]
    lines = ["# Code completion", "",
             f"`{model}`, {args.reps} rounds, through `localinfer serve` and `/infill`.", "",
             "## A 16-token completion on a file of "
             f"{summary['file_tokens']:.0f} tokens (client wall time, median)", ""]
    lines += harness.markdown_table(
        ["server", "request", "time", "prompt tokens from the cache"],
        [[server, CASES[case], f"{figures['wall_s'] * 1e3:.0f} ms", f"{figures['cached']:.0f}"]
         for server, cases in summary["completions"].items()
         for case, figures in cases.items()])
    lines += ["", f"After the edit: {summary['cold_s'] / summary['edit_s']:.1f}× faster than "
              "cold. A line down: "
              f"{line_down['--cache-reuse 0']['a line down']['wall_s'] / line_down['defaults']['a line down']['wall_s']:.1f}× "
              "faster with the cached runs moved into place (the default) than read again.", "",
              "## A chat stream's inter-token latency, with 10 completions abandoned beside it",
              ""]
    lines += harness.markdown_table(
        ["server", "stream", "p50", "p99"],
        [[server, "alone" if case == "alone" else "10 completions abandoned 100 ms after "
          "they were sent", f"{values[0]:.1f} ms", f"{values[1]:.1f} ms"]
         for server, cases in summary["itl_ms"].items() for case, values in cases.items()])
    fig, axes = harness.figure(2, 1, size=(5.5, 4))
    left, right = axes[0]
    width = 0.4
    for offset, (server, colour) in enumerate(zip(completion_variants, ["tab:green", "tab:grey"])):
        left.bar([i + offset * width for i in range(len(CASES))],
                 [summary["completions"][server][case]["wall_s"] * 1e3 for case in CASES],
                 width, color=colour, label=server)
    left.set_xticks([i + width / 2 for i in range(len(CASES))], list(CASES), fontsize=8)
    left.legend(fontsize=8)
    left.set_ylabel("ms to a 16-token completion")
    left.set_title(f"a {summary['file_tokens']:.0f}-token file")
    for (server, abandoned), colour in zip(
            [(s, a) for s in itl_variants for a in (False, True)],
            ["tab:blue", "tab:orange", "tab:cyan", "tab:red"]):
        gaps = sorted(g * 1e3 for r in itl_rows if r["abandoned"] == abandoned
                      and r["server"] == server for g in r["itls"])
        right.plot(gaps, [i / len(gaps) for i in range(len(gaps))], color=colour,
                   label=f"{server}, {'10 abandoned beside it' if abandoned else 'alone'}")
    right.set_xscale("log")
    right.set_xlabel("chat stream's inter-token latency (ms)")
    right.set_ylabel("fraction of gaps")
    right.legend(fontsize=8)
    meta = harness.run_facts(model=model, reps=args.reps)
    harness.write("code_completion", meta, {"summary": summary, "completions": rows,
                                            "itl": itl_rows}, lines, fig, args.results)


if __name__ == "__main__":
    main()
