"""A model split over two RPC workers on loopback: localinfer's against llama-server's, and
against the model on the head alone.

Three setups, each a real server process measured through the unmodified `openai` client
(streamed chat completions, greedy):
  - local: `localinfer serve`, the model on this machine only;
  - localinfer: `localinfer serve --workers A,B` with two `localinfer worker` processes (the
    planner's split; the keyed Python front and tunnel carry every byte);
  - llama-server: llama.cpp's `llama-server --rpc A,B` with two `ggml-rpc-server` processes, built
    from the same llama.cpp source with GGML_RPC=ON, given the same placement (the layers
    localinfer's plan kept on the head, the same shares, the output layer on the head).
Every process gets the same threads. Measured outside the servers: decode tok/s (tokens after
the first over the time after the first), TTFT of a short prompt and prefill tok/s of a long
one. Setups alternate round by round. Then load time with and without the workers' tensor
cache (`localinfer worker --cache`), on a model whose embeddings are over 10 MiB.

    python3 bench/rpc_split.py --llama-bin DIR [--reps 3] [--tokens 64] [--threads 1]

DIR holds llama-server and ggml-rpc-server built with -DGGML_RPC=ON. Needs the bench extra.
Writes bench/results/rpc_split.{json,png,md}.
"""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness
import openai
import random_gguf

from localinfer.model_store.sources import resolve

N_CTX = 2048
LONG = " ".join(["The lighthouse keeper wrote down the weather every hour of the night."] * 60)


def _worker(port: int, threads: int, cache: Path | None = None) -> subprocess.Popen:
    args = [sys.executable, "-m", "localinfer", "worker", "--port", str(port), "--threads",
            str(threads)] + (["--cache", str(cache)] if cache else [])
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in process.stdout:
        if line.startswith("on the head:"):
            break
    else:
        raise RuntimeError("the worker did not start")
    return process


def _rpc_server(bin_dir: Path, port: int, threads: int) -> subprocess.Popen:
    process = subprocess.Popen([str(bin_dir / "ggml-rpc-server"), "-H", "127.0.0.1", "-p", str(port),
                                "-t", str(threads)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("rpc-server did not start")


def _stop(*processes: subprocess.Popen) -> None:
    for process in processes:
        process.kill()
        process.wait()


def _plan(endpoints: list[str]) -> dict:
    shown = subprocess.run([sys.executable, "-m", "localinfer", "show", "--ctx", str(N_CTX),
                            "--workers", ",".join(endpoints), "--json"],
                           capture_output=True, text=True, check=True)
    return json.loads(shown.stdout)["plan"]


def _stream(url: str, model: str, prompt: str, tokens: int) -> dict:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    start = time.monotonic()
    stamps = []
    for chunk in client.chat.completions.create(
            model=model, temperature=0, max_tokens=tokens, stream=True,
            messages=[{"role": "user", "content": prompt}]):
        if chunk.choices and chunk.choices[0].delta.content:
            stamps.append(time.monotonic())
    if len(stamps) < 2:
        raise RuntimeError(f"{url}: {len(stamps)} chunks")
    return {"ttft_s": stamps[0] - start,
            "decode_tps": (len(stamps) - 1) / (stamps[-1] - stamps[0]), "chunks": len(stamps)}


def _prompt_tokens(url: str, model: str, prompt: str) -> int:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    reply = client.chat.completions.create(model=model, max_tokens=1, temperature=0,
                                           messages=[{"role": "user", "content": prompt}])
    return reply.usage.prompt_tokens


def _measure(url: str, model: str, tokens: int) -> dict:
    _stream(url, model, "Hi", 4)  # warm-up
    short = _stream(url, model, "Write a short essay about tides.", tokens)
    long_prompt = f"({time.monotonic()}) Summarise: {LONG}"  # no cached prefix to reuse
    long = _stream(url, model, long_prompt, 2)
    n_long = _prompt_tokens(url, model, long_prompt)  # (counted after: now it is cached)
    return {"decode_tps": short["decode_tps"], "ttft_s": short["ttft_s"],
            "prefill_tps": n_long / long["ttft_s"], "prompt_tokens": n_long}


def _setup(kind: str, bin_dir: Path, threads: int, model_path: Path,
           placement: dict | None) -> tuple[list[subprocess.Popen], str, str]:
    """The processes of a setup, its URL and the model name it answers to."""
    if kind == "llama-server":
        ports = [harness.free_port(), harness.free_port()]
        workers = [_rpc_server(bin_dir, p, threads) for p in ports]
        split = ",".join(f"{x:.4f}" for x in placement["tensor_split"])
        server, url = harness.start_server(
            [str(bin_dir / "llama-server")],
            ["-m", str(model_path), "-c", str(N_CTX), "-t", str(threads), "-np", "1",
             "--rpc", ",".join(f"127.0.0.1:{p}" for p in ports),
             "-ngl", str(placement["n_gpu_layers"]), "-ts", split,
             "-ot", r"^(output|output_norm|token_embd)\.weight$=CPU"], path="/health")
        return [*workers, server], url, "smollm2"
    workers = []
    args = ["--model", "smollm2:135m", "--parallel", "1", "--ctx", str(N_CTX), "--threads",
            str(threads)]
    if kind == "localinfer":
        ports = [harness.free_port(), harness.free_port()]
        workers = [_worker(p, threads) for p in ports]
        args += ["--workers", ",".join(f"127.0.0.1:{p}" for p in ports)]
    server, url = harness.start_server(harness.SERVE, args, path="/api/ps",
                                       ready=lambda r: bool(r.json().get("models")))
    return [*workers, server], url, "smollm2:135m"


def _cache_model() -> Path:
    """Llama 3.2 1B's shape with random weights (1.3 GB): its feed-forward matrices (18 MB
    each) are over the 10 MiB a worker caches, where a tiny model's layers are not."""
    path = harness.STORE / "random-llama3.2-1b.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        random_gguf.write_model(random_gguf.SHAPES["llama3.2-1b"], path,
                                random_gguf.read_tokenizer(random_gguf.embedded_smollm2()),
                                "random llama3.2-1b Q8_0")
    return path


def _load_times(threads: int, reps: int) -> dict:
    """`run --workers` on a 1.3 GB model from start to its one-token answer: workers
    without a cache, then with one already filled (their layers' large tensors sent as
    hashes)."""
    model = _cache_model()
    results: dict = {"no cache": [], "cache filled": []}
    with tempfile.TemporaryDirectory() as cache_root:
        for label in ("no cache", "cache filled"):
            caches = [Path(cache_root) / "a", Path(cache_root) / "b"] if label != "no cache" \
                else [None, None]
            ports = [harness.free_port(), harness.free_port()]
            workers = [_worker(p, threads, c) for p, c in zip(ports, caches)]
            command = [sys.executable, "-m", "localinfer", "run", str(model), "--ctx", "256",
                       "--max-tokens", "1", "--threads", str(threads), "-p", "hi",
                       "--workers", ",".join(f"127.0.0.1:{p}" for p in ports)]
            try:
                if label != "no cache":  # fill the cache once, then time the loads after
                    subprocess.run(command, capture_output=True, check=True)
                    cached = sum(f.stat().st_size for c in caches for f in c.iterdir())
                    results["cached_bytes"] = cached
                for _ in range(reps):
                    start = time.monotonic()
                    subprocess.run(command, capture_output=True, check=True)
                    results[label].append(time.monotonic() - start)
            finally:
                _stop(*workers)
    return results


def main() -> None:
    parser = harness.arguments(__doc__, reps=3, tokens=64, threads=1)
    parser.add_argument("--llama-bin", type=Path, required=True,
                        help="folder with llama-server and ggml-rpc-server built with GGML_RPC=ON")
    args = parser.parse_args()
    model_path = resolve("smollm2:135m", harness.STORE).path
    probe_ports = [harness.free_port(), harness.free_port()]
    probes = [_worker(p, args.threads) for p in probe_ports]
    try:
        placement = _plan([f"127.0.0.1:{p}" for p in probe_ports])
    finally:
        _stop(*probes)
    kinds = ["local", "localinfer", "llama-server"]
    rounds: dict[str, list[dict]] = {k: [] for k in kinds}
    for rep in range(args.reps):
        for kind in kinds:
            processes, url, name = _setup(kind, args.llama_bin, args.threads, model_path,
                                          placement)
            try:
                result = _measure(url, name, args.tokens)
            finally:
                _stop(*processes)
            rounds[kind].append(result)
            print(f"round {rep + 1} {kind:12s} decode {result['decode_tps']:6.1f} tok/s  "
                  f"TTFT {result['ttft_s'] * 1000:6.0f} ms  prefill "
                  f"{result['prefill_tps']:6.0f} tok/s", flush=True)
    loads = _load_times(args.threads, args.reps)
    _write(rounds, loads, placement, args)


def _median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def _write(rounds: dict, loads: dict, placement: dict, args) -> None:
    meta = harness.run_facts(threads=args.threads, tokens=args.tokens, reps=args.reps,
                             n_ctx=N_CTX, llama_bin=str(args.llama_bin),
                             placement=placement["reason"],
                             n_gpu_layers=placement["n_gpu_layers"],
                             tensor_split=placement["tensor_split"])
    summary = {k: {key: _median(rows, key) for key in ("decode_tps", "ttft_s", "prefill_tps")}
               for k, rows in rounds.items()}
    ours, theirs = summary["localinfer"], summary["llama-server"]
    rows = [[k, f"{s['decode_tps']:.1f}", f"{s['ttft_s'] * 1000:.0f}", f"{s['prefill_tps']:.0f}"]
            for k, s in summary.items()]
    lines = ["# smollm2 split over two RPC workers on loopback", "",
             f"Placement (localinfer's plan, given to llama-server too): {placement['reason']}; "
             f"`-ngl {placement['n_gpu_layers']}`, shares {placement['tensor_split']}, the "
             f"output layer on the head. {args.threads} thread(s) per process; medians of "
             f"{args.reps} rounds.", "",
             *harness.markdown_table(["setup", "decode tok/s", "TTFT ms", "prefill tok/s"], rows),
             "",
             f"localinfer's split against llama-server's: decode "
             f"{ours['decode_tps'] / theirs['decode_tps']:.2f}x, prefill "
             f"{ours['prefill_tps'] / theirs['prefill_tps']:.2f}x, TTFT "
             f"{ours['ttft_s'] / theirs['ttft_s']:.2f}x (lower is better).", "",
             "Load of Llama 3.2 1B's shape (random Q8_0 weights, 1.3 GB) over the two workers "
             "(`run … --max-tokens 1`, start to exit), median: "
             + ", ".join(f"{k} {statistics.median(v):.2f} s" for k, v in loads.items()
                         if k != "cached_bytes")
             + f" ({loads['cached_bytes'] / 2**20:.0f} MiB in the workers' caches). On "
             "loopback, sending a "
             "tensor costs about what hashing it does; the cache pays where the network is "
             "slower than the disk."]
    fig, axes = harness.figure(ncols=2)
    kinds = list(summary)
    axes[0][0].bar(kinds, [summary[k]["decode_tps"] for k in kinds], color="#4c72b0")
    axes[0][0].set_ylabel("decode tok/s (higher is better)")
    axes[0][0].set_title("smollm2: local vs two loopback workers")
    timed = {k: v for k, v in loads.items() if k != "cached_bytes"}
    axes[0][1].bar(list(timed), [statistics.median(v) for v in timed.values()],
                   color="#dd8452")
    axes[0][1].set_ylabel("load + 1 token, s (lower is better)")
    axes[0][1].set_title("random Llama 3.2 1B over two workers: tensor cache")
    harness.write("rpc_split", meta, {"rounds": rounds, "summary": summary, "loads": loads},
                  lines, fig, args.results)


if __name__ == "__main__":
    main()
