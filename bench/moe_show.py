"""Where a mixture of experts goes on GPUs too small for it: `localinfer show` on what-if hardware.

Two published shapes, written as their headers and tensor tables (bench/random_gguf.py's
PLAN_SHAPES, the weights' bytes a hole): Qwen3-30B-A3B (Q4_K_M-like, 17 GiB) and
gpt-oss-120b (MXFP4 experts, the rest Q8_0, 59 GiB). For each what-if GPU (--gpu-gib) beside
--ram-gib of RAM, `localinfer show --json` gives the plan: which layers' experts stay in RAM
(llama.cpp's tensor overrides, as `--fit` places them: attention, shared weights, the output
layer and the KV cache on the GPU first), what each device holds, and whether it fits at all.
No GPU is used: this is the planner's arithmetic, which bench/moe_placement.py checks against
llama-server's --fit on a lent GPU.

    python3 bench/moe_show.py [--gpu-gib 8,16,24] [--ram-gib 64] [--ctx 8192]

Writes bench/results/moe_show.{json,md,png}.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import harness
from random_gguf import PLAN_SHAPES, write_plan_shape

from localinfer.cli import number_ranges

SHAPES = ("qwen3-30b-a3b", "gpt-oss-120b")
GIB = 2**30


def show(path: Path, gpu_gib: int, ram_gib: int, ctx: int) -> dict:
    result = subprocess.run([sys.executable, "-m", "localinfer", "show", str(path), "--gpu",
                             f"{gpu_gib}GiB", "--ram", f"{ram_gib}GiB", "--ctx", str(ctx),
                             "--json"], capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        return {"error": (result.stderr or result.stdout).strip().splitlines()[-1]}
    return json.loads(result.stdout)


def main() -> None:
    parser = harness.arguments(__doc__)
    parser.add_argument("--gpu-gib", default="8,16,24")
    parser.add_argument("--ram-gib", type=int, default=64)
    parser.add_argument("--ctx", type=int, default=8192)
    args = parser.parse_args()
    gpus = [int(x) for x in args.gpu_gib.split(",") if x]
    results: dict = {}
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name in SHAPES:
            path = Path(folder) / f"{name}.gguf"
            size = write_plan_shape(PLAN_SHAPES[name], path, name, sparse=True)
            results[name] = {"file_bytes": size, "by_gpu": {}}
            for gib in gpus:
                facts = show(path, gib, args.ram_gib, args.ctx)
                results[name]["by_gpu"][gib] = facts
                if "error" in facts:
                    rows.append([name, f"{gib} GiB", "—", "—", "—", "—", facts["error"]])
                    continue
                plan = facts["plan"]
                gpu = plan["placement"][0]
                ram = next((p for p in plan["placement"][1:] if p["device"] == "RAM"), None)
                n_layers = facts["n_layer"]
                kept = [i for i in range(n_layers) if i not in plan["cpu_experts"]]
                rows.append([
                    name, f"{gib} GiB", f"{plan['n_gpu_layers']}",
                    f"{number_ranges(kept) or 'none'} ({len(kept)} of {n_layers})",
                    f"{gpu['total'] / GIB:.1f}", f"{(ram['total'] if ram else 0) / GIB:.1f}",
                    f"{gpu['kv_cache'] / GIB:.2f}"])
    fig, axes = harness.figure(len(SHAPES))
    for ax, name in zip(axes[0], SHAPES):
        by_gpu = results[name]["by_gpu"]
        ok = [g for g in gpus if "plan" in by_gpu[g]]
        on_gpu = [by_gpu[g]["n_layer"] - len(by_gpu[g]["plan"]["cpu_experts"]) for g in ok]
        ax.bar([f"{g} GiB" for g in ok], on_gpu)
        ax.set(title=name, ylabel="layers whose experts are on the GPU",
               xlabel="what-if GPU")
    lines = ["# A mixture of experts on GPUs too small for it: the plan", "",
             f"`localinfer show` on what-if hardware: one GPU of each size beside "
             f"{args.ram_gib} GiB of RAM, {args.ctx} tokens of context, one slot. The files "
             "are the published shapes' headers and tensor tables (their weights a hole). "
             "Every layer goes to the GPU; the experts of the layers listed stay there, the "
             "others' go to RAM (llama.cpp's tensor overrides, as its `--fit` places them). "
             "On a lent H200 held to the same free memory, llama-server's `--fit` kept the "
             "experts of 35, 13 and 0 of Qwen3-30B-A3B's 48 layers in RAM at 8, 16 and 24 GiB "
             "(bench/results/gpu_h200.md); gpt-oss-120b has not been loaded on a GPU here.",
             "",
             *harness.markdown_table(
                 ["model", "GPU", "layers on the GPU", "experts on the GPU (layers)",
                  "GPU GiB", "RAM GiB", "KV GiB"], rows)]
    meta = harness.run_facts(gpu_gib=gpus, ram_gib=args.ram_gib, ctx=args.ctx)
    harness.write("moe_show", meta, results, lines, fig, args.results)


if __name__ == "__main__":
    main()
