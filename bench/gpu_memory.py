"""The plan's GPU memory against what llama.cpp reports and what the process really takes.

For each model and context: the planner's parts (weights, KV cache, compute buffer, the
backend's runtime overhead), then a fresh process loads the model as `localinfer run` would
(the planner's GPU layers), reads a 600-token prompt and writes 4 tokens, and reports
llama.cpp's own buffer sizes and the GPU memory the process holds (NVML, else nvidia-smi).
Needs an NVIDIA GPU and a CUDA build of llama-cpp-python.

    python3 bench/gpu_memory.py MODEL.gguf [MODEL.gguf ...] [--ctx 4096,8192] [--slots 1,4]
                                [--out FILE.json] [--results FOLDER]

Writes FILE.json ({"meta", "results": the rows}) and FILE.md beside it; without --out,
bench/results/gpu_memory.{json,md} (--results names the folder). bench/gpu_report.py reads
the GPU session's files in bench/results/gpu_h100/.
"""

from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys
from pathlib import Path

import harness

_MIB = 2**20
_CHILD = r"""
import json, logging, os, sys
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
logging.getLogger("localinfer.llama_cpp").addHandler(Keep())
logging.getLogger("localinfer.llama_cpp").setLevel(logging.DEBUG)
import dataclasses, pickle
from localinfer.backends.base import SamplingParams
from localinfer.runners import llama_cpp_backend
path, options = sys.argv[1], pickle.loads(bytes.fromhex(sys.argv[2]))
backend = llama_cpp_backend(path, options, os.path.basename(path))
backend.generate(backend.tokenize("hello " * 600), SamplingParams(temperature=0, max_tokens=4)).text()
def process_gpu_bytes():
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if p.pid == os.getpid():
                return p.usedGpuMemory
    except Exception:
        pass
    import subprocess
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    except OSError:
        return None
    for line in out.splitlines():
        pid, used = [x.strip() for x in line.split(",")]
        if int(pid) == os.getpid():
            return int(used) * 2**20
    return None
print("RESULT", json.dumps({"process_gpu_bytes": process_gpu_bytes(), "log": records,
                            "n_gpu_layers": options.n_gpu_layers}))
"""
_BUFFER = re.compile(r"^\s*\w+:\s+(\S+)\s+(model|KV|compute|output|RS) buffer size =\s+([\d.]+) MiB")


def buffers(log: list[str]) -> dict[str, dict[str, float]]:
    """llama.cpp's buffer report: {device: {kind: bytes}} (device CUDA0, CUDA_Host, CPU...)."""
    out: dict[str, dict[str, float]] = {}
    for message in log:
        for line in message.splitlines():
            m = _BUFFER.search(line)
            if m:
                device, kind, mib = m.groups()
                out.setdefault(device, {}).setdefault(kind, 0.0)
                out[device][kind] += float(mib) * _MIB
    return out


def measure(path: Path, n_ctx: int, n_slots: int) -> dict:
    """The plan made here, the model loaded with its options in a fresh process that plans
    nothing, as a runner loads it (on a CUDA build, a hybrid loaded in the process that
    planned it crashed at load: bench/results/gpu_h200.md)."""
    from localinfer.backends.base import LoadOptions
    from localinfer.model_store.gguf_info import read_gguf_info
    from localinfer.backends.native.machine import detect
    from localinfer.service import plan_for, prepare

    plan = plan_for(read_gguf_info(path), detect(), n_ctx, n_slots)
    options = prepare(str(path), LoadOptions(n_ctx=n_ctx, n_slots=n_slots)).options
    done = subprocess.run([sys.executable, "-X", "faulthandler", "-c", _CHILD, str(path),
                           pickle.dumps(options).hex()],
                          capture_output=True, text=True, timeout=600)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        return {"model": path.name, "n_ctx": n_ctx,  # a crash may leave no stderr
                "error": f"exit {done.returncode}: {(done.stderr or done.stdout)[-2000:]}"}
    child = json.loads(line[len("RESULT "):])
    report = buffers(child["log"])
    gpu_reported = sum(v for dev, kinds in report.items() if dev.startswith(("CUDA", "ROCm"))
                       and "Host" not in dev for v in kinds.values())
    used = child["process_gpu_bytes"]
    return {"model": path.name, "n_ctx": n_ctx, "n_slots": n_slots,
            "n_gpu_layers": child["n_gpu_layers"], "plan": plan.parts,
            "plan_total": plan.memory_bytes, "llama_cpp_buffers": report,
            "llama_cpp_gpu_total": gpu_reported, "process_gpu_bytes": used,
            "outside_llama_cpp_buffers": None if used is None else used - gpu_reported}


def main() -> None:
    parser = harness.arguments(__doc__)
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--ctx", default="4096,8192")
    parser.add_argument("--slots", default="1")
    parser.add_argument("--out", type=Path,
                        help="the JSON file (the .md goes beside it) [RESULTS/gpu_memory.json]")
    args = parser.parse_args()
    rows = []
    for path in args.models:
        for n_ctx in (int(x) for x in args.ctx.split(",")):
            for n_slots in (int(x) for x in args.slots.split(",")):
                row = measure(path, n_ctx, n_slots)
                rows.append(row)
                if "error" in row:
                    print(f"{path.name} ctx {n_ctx}: failed\n{row['error']}", flush=True)
                    continue
                mib = lambda n: "?" if n is None else f"{n / _MIB:,.0f}"  # noqa: E731
                print(f"{path.name} ctx {n_ctx}×{n_slots}: planned {mib(row['plan_total'])} MiB "
                      f"({', '.join(f'{k} {mib(v)}' for k, v in row['plan'].items())}); "
                      f"llama.cpp GPU buffers {mib(row['llama_cpp_gpu_total'])}; process holds "
                      f"{mib(row['process_gpu_bytes'])} MiB, "
                      f"{mib(row['outside_llama_cpp_buffers'])} outside the buffers", flush=True)
    meta = harness.run_facts(models=[p.name for p in args.models], ctx=args.ctx,
                             slots=args.slots)
    out = args.out or args.results / "gpu_memory.json"
    harness.write(out.stem, meta, rows, report(rows), folder=out.parent)


def report(rows: list[dict]) -> list[str]:
    mib = lambda n: "?" if n is None else f"{n / _MIB:,.0f}"  # noqa: E731
    return ["# The plan's GPU memory against llama.cpp's buffers and the process", "",
            *harness.markdown_table(
                ["model", "context × slots", "GPU layers", "plan (MiB)",
                 "llama.cpp GPU buffers", "process holds", "outside the buffers"],
                [[r["model"], f"{r['n_ctx']} × {r.get('n_slots', '?')}", "failed", "", "", "", ""]
                 if "error" in r else
                 [r["model"], f"{r['n_ctx']} × {r['n_slots']}", r["n_gpu_layers"],
                  mib(r["plan_total"]), mib(r["llama_cpp_gpu_total"]),
                  mib(r["process_gpu_bytes"]), mib(r["outside_llama_cpp_buffers"])]
                 for r in rows])]


if __name__ == "__main__":
    main()
