"""A mixture of experts on a GPU too small for it: localinfer's placement against llama-server's
--fit, on the same card held to the same free memory.

The model is Qwen3-30B-A3B's shape (48 layers of 2048, 128 experts of 768, 8 a token; KV
heads 4 of 128) written as a Q4_K_M-like file with random weights, 17 GiB
(bench/random_gguf.py's PLAN_SHAPES, `--quant q4_k_m`), with Qwen's tokenizer and Qwen3's
chat template from llama.cpp's source. For each size in --hold-gib, a second process takes
the rest of the GPU, so both servers read the same free memory a card of that size has;
then each server loads the model alone, at its defaults, one after the other:
llama-server (its --fit: experts to the CPU, then back while they fit) and `localinfer
serve` (its planner). Measured: what each holds on the GPU (nvidia-smi, the card's use less
the holder's), the placement each says it chose (llama-server's load log; localinfer's plan,
`show --json` under the same hold), and one stream's TTFT and decode tokens/s (greedy, end
tokens banned, a 300-word prompt), medians of --reps requests after a warm-up.

Without a GPU (or torch) nothing is held and both run on the CPU: a check of the script,
with --layers to write a few layers only.

    python3 bench/moe_placement.py --llama-server PATH [--hold-gib 8,16,24] [--reps 3]
                                   [--tokens 128] [--model FILE] [--layers N]
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness
import httpx

from random_gguf import PLAN_SHAPES, read_tokenizer, write_arch

SHAPE = "qwen3-30b-a3b"
CTX = 4096
SERVERS = ("llama-server", "localinfer")
END_TOKENS = (151643, 151645)  # <|endoftext|>, <|im_end|>
HOLDER = r"""
import sys, torch
free, _ = torch.cuda.mem_get_info()
keep = int(float(sys.argv[1]) * 2**30)
block = torch.empty(max(free - keep, 0), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print(torch.cuda.mem_get_info()[0], flush=True)
sys.stdin.read()
"""
# llama-server's load log: where its buffers went and what --fit decided
_BUFFER = re.compile(r"(\w+(?:_\w+)?) (model|KV|RS|compute) buffer size\s*=\s*([\d.]+) MiB")


def model_file(source: Path, folder: Path, layers: int | None) -> Path:
    import gguf

    shape = PLAN_SHAPES[SHAPE]
    if layers:
        shape = dataclasses.replace(shape, n_layer=layers)
    tokenizer = read_tokenizer(source / "models" / "ggml-vocab-qwen2.gguf")
    template = (source / "models" / "templates" / "Qwen-Qwen3-0.6B.jinja").read_text()
    tokenizer["tokenizer.chat_template"] = (template, gguf.GGUFValueType.STRING, None)
    path = folder / f"{SHAPE}-{shape.n_layer}l-q4_k_m.gguf"
    start = time.monotonic()
    write_arch(shape, path, tokenizer, f"random {SHAPE} Q4_K_M", quant="q4_k_m")
    print(f"wrote {path} ({path.stat().st_size / 2**30:.1f} GiB) in "
          f"{time.monotonic() - start:.0f} s", flush=True)
    return path


def _nvidia_smi(query: str) -> str | None:
    """nvidia-smi's answer for GPU 0 (`--query-gpu=QUERY`), or None without one."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,"
                              "nounits", "-i", "0"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def gpu_used() -> int | None:
    """The card's memory in use (bytes), or None without nvidia-smi."""
    used = _nvidia_smi("memory.used")
    return int(used) * 2**20 if used else None


def hold(gib: float) -> subprocess.Popen | None:
    """A process that leaves `gib` of the GPU free, or None where there is no GPU."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
    except ImportError:
        return None
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(gib)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    print(f"held: {int(holder.stdout.readline()) / 2**30:.2f} GiB free", flush=True)
    return holder


def release(holder: subprocess.Popen | None) -> None:
    if holder is not None:
        holder.stdin.close()
        holder.wait(timeout=60)


def plan(model: Path, home: str) -> dict:
    """localinfer's plan for this machine as it is now (`show --json`)."""
    out = subprocess.run([*harness.SERVE[:-1], "show", str(model), "--ctx", str(CTX), "--json"],
                         capture_output=True, text=True, env={**os.environ, "LOCALINFER_HOME": home},
                         timeout=300)
    if out.returncode != 0:
        return {"error": out.stderr[-500:]}
    facts = json.loads(out.stdout)["plan"]
    return {key: facts.get(key) for key in ("reason", "placement", "gpu_bytes", "cpu_experts",
                                            "n_gpu_layers", "device")}


def log_facts(process: subprocess.Popen) -> dict:
    """llama-server's buffers by device and its --fit lines, from its load log."""
    if getattr(process, "log", None) is None:
        return {}
    text = harness.server_log(process)
    buffers: dict[str, float] = {}
    for device, kind, mib in _BUFFER.findall(text):
        buffers[f"{device} {kind}"] = buffers.get(f"{device} {kind}", 0) + float(mib)
    fit = [line for line in text.splitlines() if "fit" in line.lower()][:40]
    return {"buffers_mib": buffers, "fit_log": fit}


def threads(url: str) -> float | None:
    """The CPU threads localinfer's engine decodes with now (its /metrics)."""
    match = re.search(r"^localinfer_threads\{[^}]*\} ([\d.]+)", httpx.get(url + "/metrics").text,
                      re.M)
    return float(match.group(1)) if match else None


def stream(client: httpx.Client, url: str, model: str, seed: int, tokens: int) -> dict:
    words = ("harbour lantern keeper tide rope gull stone window evening storm ledger "
             "candle island signal ferry").split()
    text = " ".join(words[(seed * 7 + i * 3) % len(words)] for i in range(300))
    body = {"model": model, "stream": True, "temperature": 0, "max_tokens": tokens,
            "stream_options": {"include_usage": True},
            "logit_bias": {str(t): -100 for t in END_TOKENS},
            "messages": [{"role": "user", "content": f"Request {seed}. Summarise: {text}"}]}
    start = time.perf_counter()
    first = last = None
    chunks, usage = 0, None
    # a connection per request: llama-server's HTTP library drops a kept-alive one at times
    with client.stream("POST", url + "/v1/chat/completions", json=body,
                       headers={"Connection": "close"}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                delta = choice.get("delta") or {}
                if delta.get("content") or delta.get("reasoning_content"):
                    last = time.perf_counter()
                    first = first or last
                    chunks += 1
    generated = (usage or {}).get("completion_tokens") or chunks
    return {"ttft_s": None if first is None else first - start,
            "decode_tok_s": (generated - 1) / (last - first) if last and last > first else None,
            "tokens": generated, "prompt_tokens": (usage or {}).get("prompt_tokens")}


def major_faults(pid: int) -> int:
    """Pages read from disk on a fault, by a process and those it started (its runner)."""
    import psutil

    total = 0
    try:
        root = psutil.Process(pid)
        for process in (root, *root.children(recursive=True)):
            with open(f"/proc/{process.pid}/stat") as stat:
                total += int(stat.read().rpartition(")")[2].split()[9])  # majflt
    except (OSError, psutil.Error):
        pass
    return total


def measure(name: str, model: Path, llama_server: Path, home: str, reps: int, tokens: int
            ) -> dict:
    """One server's load and streams. `name`: llama-server, localinfer, or localinfer-tN
    (localinfer with --threads N: its thread tuner off)."""
    before = gpu_used()
    if name == "llama-server":
        process, url = harness.start_server(
            [str(llama_server)], ["-m", str(model), "-np", "1", "-c", str(CTX), "--jinja",
                                   "-lv", "4"])  # its load log: the buffers and --fit's steps
    else:
        pinned = name.partition("-t")[2]
        process, url = harness.start_serve(
            [*harness.SERVE, *(["--threads", pinned] if pinned else [])], str(model), 1, CTX,
            home)
    served = model.stem  # (localinfer's name for a file; llama-server takes any)
    try:
        loaded = gpu_used()
        with httpx.Client(timeout=900) as client:
            stream(client, url, served, 99, 8)  # warm-up
            runs = []
            for rep in range(reps):
                faults = major_faults(process.pid)
                runs.append(stream(client, url, served, rep, tokens))
                runs[-1]["major_faults"] = major_faults(process.pid) - faults  # pages from disk
                if name != "llama-server":  # the count each request ended with
                    runs[-1]["threads"] = threads(url)
        facts = log_facts(process) if name == "llama-server" else {"threads": threads(url)}
    finally:
        harness.stop_servers({name: (process, url)})
    held = None if before is None or loaded is None else loaded - before
    decode = [r["decode_tok_s"] for r in runs if r["decode_tok_s"]]
    ttft = [r["ttft_s"] for r in runs if r["ttft_s"] is not None]
    result = {"gpu_held_bytes": held, "runs": runs, **facts,
              "decode_tok_s": statistics.median(decode) if decode else None,
              "ttft_s": statistics.median(ttft) if ttft else None}
    print(name, "runs", [(round(r["decode_tok_s"] or 0, 1), r.get("threads"), r["major_faults"])
                         for r in runs],
          f"held {held and held / 2**30:.2f} GiB" if held else "",
          f"threads {facts['threads']}" if facts.get("threads") else "",
          f"decode {result['decode_tok_s']:.1f} tok/s" if decode else "no decode",
          f"ttft {result['ttft_s']:.3f} s" if ttft else "", flush=True)
    return result


def report(args, results: dict, meta: dict) -> None:
    rows = []
    for gib, by_server in results.items():
        for name, r in by_server.items():
            if name == "localinfer":
                where = (r.get("plan") or {}).get("reason", "?")
            elif name.startswith("localinfer"):
                where = f"its plan, --threads {name.partition('-t')[2]}"
            else:
                where = ", ".join(f"{k} {v:,.0f}" for k, v in
                                  sorted((r.get("buffers_mib") or {}).items())) or "?"
            rows.append([f"{gib} GiB", name,
                         f"{r['gpu_held_bytes'] / 2**30:.2f}" if r["gpu_held_bytes"] else "—",
                         f"{r['decode_tok_s']:.1f}" if r["decode_tok_s"] else "—",
                         f"{r['ttft_s']:.3f}" if r["ttft_s"] else "—", where])
    ratios = [f"- {gib} GiB: localinfer ÷ llama-server decode = **"
              f"{s['localinfer']['decode_tok_s'] / s['llama-server']['decode_tok_s']:.2f}**"
              for gib, s in results.items()
              if s["localinfer"]["decode_tok_s"] and s["llama-server"]["decode_tok_s"]]
    lines = ["# A mixture of experts on a GPU too small for it: localinfer against llama-server "
             "--fit", "",
             f"{meta['model_note']}; context {CTX}, one slot, each server at its defaults, "
             f"loaded alone while a second process left the GPU the free memory named. "
             f"Decode and TTFT: medians of {args.reps} greedy streams of {args.tokens} tokens "
             "(a 300-word prompt) after a warm-up.", "",
             *harness.markdown_table(["free GPU", "server", "GPU held (GiB)", "decode tok/s",
                                      "TTFT (s)", "placement"], rows), "", *ratios]
    harness.write("moe_placement", meta, results, lines, folder=args.results)


def main() -> None:
    parser = harness.arguments(__doc__, reps=3, tokens=128)
    parser.add_argument("--llama-server", type=Path, required=True)
    parser.add_argument("--source", type=Path,
                        help="llama.cpp's source tree [the one llama-server was built in]")
    parser.add_argument("--hold-gib", default="8,16,24",
                        help="free GPU memory each server sees, one run each")
    parser.add_argument("--model", type=Path, help="the model file, if written before")
    parser.add_argument("--layers", type=int, help="write this many layers (a quick check)")
    parser.add_argument("--pinned-threads", type=int,
                        help="also localinfer with --threads N (its thread tuner off)")
    args = parser.parse_args()
    # (the pinned one before the tuned one: a first-use cost would show in the first of them)
    servers = (SERVERS[0], *([f"localinfer-t{args.pinned_threads}"] if args.pinned_threads
                             else []), *SERVERS[1:])
    source = args.source or args.llama_server.resolve().parents[2]
    with tempfile.TemporaryDirectory() as home:
        model = args.model or model_file(source, Path(home), args.layers)
        results: dict[str, dict] = {}
        for gib in args.hold_gib.split(","):
            holder = hold(float(gib))
            try:
                by_server = {}
                for name in servers:
                    by_server[name] = measure(name, model, args.llama_server, home, args.reps,
                                              args.tokens)
                by_server["localinfer"]["plan"] = plan(model, home)
                print("localinfer plan:", by_server["localinfer"]["plan"].get("reason"),
                      flush=True)
            finally:
                release(holder)
            results[gib] = by_server
            note = (f"{SHAPE} Q4_K_M-like, random weights, "
                    f"{model.stat().st_size / 2**30:.1f} GiB")
            meta = harness.run_facts(llama_server=str(args.llama_server), hold_gib=args.hold_gib,
                                     model_note=note, gpu=gpu_name())
            report(args, results, meta)  # after each size: a cut-off run keeps what it has


def gpu_name() -> str | None:
    return _nvidia_smi("name,driver_version")


if __name__ == "__main__":
    main()
