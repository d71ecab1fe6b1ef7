#!/bin/bash
# The GPU checks of the benchmarks, on a machine with an NVIDIA GPU and no network.
#
# Here (with PyPI and the llama-cpp-python sdist unpacked at $SDIST):
#     bash bench/gpu_session.sh prepare [PACKAGES_FILE]
# fills .gpu/ (git-ignored, ~25 MB): wheels for Python 3.12 of what the GPU machine's Python
# lacks, llama.cpp's source trimmed to the CPU and CUDA backends, llama-cpp-python's Python
# package, Qwen's tokenizer and templates, a tokenizer-only GGUF for the llama shapes.
# PACKAGES_FILE lists the packages that machine has (one name a line); the dry run uses it.
# There (in the repo root, with .gpu/ beside it):
#     bash bench/gpu_session.sh run
# builds llama.cpp with CUDA (~200 s on 16 cores; kept in .gpubuild/ for a later call on the
# same machine) while it writes the models, then runs, while LIMIT (s) allows, in this order:
# moe_placement.py at 16 and 8 GiB free, serve_speed.py on Llama 3.2 1B's shape at 1, 8, 32
# clients, gpu_memory.py on the Qwen3.5 hybrid, moe_placement.py at 24 GiB, serve_speed.py on
# Llama 3.1 8B's shape (STEPS="moe serve_1b gpu_memory moe24 serve_8b": which, in that order;
# also hybrid_load: the hybrid served, and loaded after each import that once crashed it;
# omp_wait: the runner's CPU per token beside the GPU's steps, libgomp's spin against its bound).
# Results go to $OUT/res.tgz after each step.
# CPU=1 bash bench/gpu_session.sh run: a dry run here (the CPU build at $SDIST, small
# shapes, only the packages that machine has importable).
set -u
SDIST=${SDIST:-/tmp/sdist/llama_cpp_python-0.3.36}
WHEELS="annotated-types click-default-group diskcache fastapi gguf httptools mdit-py-plugins
opentelemetry-api platformdirs pydantic pydantic-core pydantic-settings python-dotenv sniffio
starlette textual typing-inspection uvicorn"

prepare() {
  mkdir -p .gpu/whl .gpu/src/models/templates || exit 1
  local pins=""
  for name in $WHEELS; do
    pins="$pins $name==$(python3 -c "import importlib.metadata as m; print(m.version('$name'))")"
  done
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .gpu/whl $pins || exit 1
  local gone=""
  for backend in et metal hexagon sycl vulkan opencl cann musa webgpu zdnn openvino; do
    gone="$gone --exclude=llama.cpp/ggml/src/ggml-$backend"
  done
  tar czf .gpu/llama.cpp.tgz -C "$SDIST/vendor" $gone --exclude=llama.cpp/build \
    --exclude=llama.cpp/models --exclude=llama.cpp/docs --exclude=llama.cpp/media \
    --exclude=llama.cpp/gguf-py --exclude=llama.cpp/tests --exclude=llama.cpp/pocs \
    --exclude=llama.cpp/benches --exclude=llama.cpp/tools/server/tests llama.cpp || exit 1
  rm -rf .gpu/llama_cpp && cp -r "$SDIST/llama_cpp" .gpu/llama_cpp \
    && rm -rf .gpu/llama_cpp/lib .gpu/llama_cpp/__pycache__ || exit 1
  local models=$SDIST/vendor/llama.cpp/models
  cp $models/ggml-vocab-qwen2.gguf .gpu/src/models/ \
    && cp $models/templates/Qwen-Qwen3-0.6B.jinja $models/templates/Qwen3.5-4B.jinja \
       .gpu/src/models/templates/ || exit 1
  python3 bench/random_gguf.py --tokenizer-only .gpu/tok.gguf || exit 1
  if [ -n "${1:-}" ]; then cp "$1" .gpu/image.txt; fi
  du -sh .gpu
}

run() {
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpuout}; mkdir -p "$OUT"
RES=/tmp/res; mkdir -p $RES
M=/tmp/m; mkdir -p $M
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
stamp() { echo "== $(el) s: $*"; }
pack() { (cd $RES && tar czf "$OUT/res.tgz" .); }
LIMIT=${LIMIT:-560}
left() { [ $(( LIMIT - $(el) )) -gt "$1" ]; }   # more than $1 s left?
STEPS=${STEPS:-moe serve_1b gpu_memory moe24 serve_8b}
want() { left "$2"; }  # time left for step $1
export PATH=$PATH:/usr/local/cuda/bin
stamp start
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv 2>&1 | tee $RES/gpu.txt
nproc; python3 --version; which nvcc; nvcc --version 2>&1 | tail -1
if [ "${CPU:-0}" = 1 ] && [ -f .gpu/image.txt ]; then  # here: what that machine lacks can't be imported
  mkdir -p /tmp/block && cat > /tmp/block/sitecustomize.py <<'PY'
# As on the GPU machine: only its image's packages, the carried wheels and /tmp/pkg import.
import importlib.metadata as md, os, re, sys
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
root = os.environ["GPU_DIR"]
allowed = set(open(os.path.join(root, "image.txt")).read().split())
allowed |= {norm(f.split("-")[0]) for f in os.listdir(os.path.join(root, "whl"))}
allowed |= {"httpx2", "httpcore2", "httpx2-jsfetch", "truststore"}  # this machine's newer hub's
blocked = {top for top, dists in md.packages_distributions().items()
           if not any(norm(d) in allowed for d in dists)}
class _Block:  # the other finders see none of the blocked names outside /tmp/pkg
    def __init__(self, finders):
        self.finders = finders
    def find_spec(self, name, path=None, target=None):
        for finder in self.finders:
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                if name.split(".")[0] in blocked and not (spec.origin or "").startswith("/tmp/pkg"):
                    continue
                return spec
        return None
    def find_distributions(self, *args, **kwargs):
        for finder in self.finders:
            if hasattr(finder, "find_distributions"):
                for dist in finder.find_distributions(*args, **kwargs):
                    if norm(dist.metadata["Name"] or "") in allowed or str(
                            getattr(dist, "_path", "")).startswith("/tmp/pkg"):
                        yield dist
sys.meta_path[:] = [_Block(list(sys.meta_path))]
PY
  export PYTHONPATH=/tmp/block:/tmp/pkg GPU_DIR=$PWD/.gpu
elif [ "${CPU:-0}" = 1 ]; then
  export PYTHONPATH=/tmp/pkg
else
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || return 1
  export PYTHONPATH=/tmp/site:/tmp/pkg
fi
rm -rf /tmp/pkg && python3 packaging/installed_tree.py /tmp/pkg >/dev/null && cp -r .gpu/llama_cpp /tmp/pkg/llama_cpp && mkdir -p /tmp/pkg/llama_cpp/lib || return 1
mkdir -p /tmp/pkg/llama_cpp_python-0.3.36.dist-info && printf 'Metadata-Version: 2.1\nName: llama_cpp_python\nVersion: 0.3.36\n' > /tmp/pkg/llama_cpp_python-0.3.36.dist-info/METADATA
B=$PWD/.gpubuild
if [ "${CPU:-0}" = 1 ]; then
  LS=$SDIST/vendor/llama.cpp/build/bin
  cp -P $LS/*.so* /tmp/pkg/llama_cpp/lib/; LLAMA_SERVER=$LS/llama-server
  SMALL=1
else
  LLAMA_SERVER=$B/build/bin/llama-server
  if [ ! -x $LLAMA_SERVER ]; then
    mkdir -p $B && tar xzf .gpu/llama.cpp.tgz -C $B
    # llama.cpp's AMX kernels off in llama-server as localinfer has them (a lent GPU's Xeon
    # has AMX; their matrix product crashes: bench/serve_fast_steps.py's docstring)
    sed -i 's/bufts.push_back(ggml_backend_amx_buffer_type());//' \
      $B/llama.cpp/ggml/src/ggml-cpu/ggml-cpu.cpp
    GEN=""; command -v ninja >/dev/null && GEN="-G Ninja"
    ( cmake -S $B/llama.cpp -B $B/build $GEN -DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF \
        -DCMAKE_BUILD_TYPE=Release > $B/cfg.log 2>&1 \
      && cmake --build $B/build --target llama llama-server mtmd -j16 > $B/build.log 2>&1
      echo $? > $B/build.rc ) &
    BUILD=$!
  fi
  SMALL=0
fi
# models, while llama.cpp builds
Q=.gpu/src/models
if [ $SMALL = 1 ]; then MOE_LAYERS="--layers 3"; L1=smollm2-135m; L8=smollm2-135m; else MOE_LAYERS=""; L1=llama3.2-1b; L8=llama3.1-8b; fi
[ -f $M/models.done ] && echo "models kept from an earlier call" || \
( python3 bench/random_gguf.py qwen3.5-0.8b $M/qwen3.5-0.8b.gguf --tokenizer $Q/ggml-vocab-qwen2.gguf --template $Q/templates/Qwen3.5-4B.jinja > $M/w1.log 2>&1
  if [ $SMALL = 1 ]; then
    python3 -c "import dataclasses,sys; sys.path.insert(0,'bench'); from pathlib import Path; import random_gguf as r, gguf
tok=r.read_tokenizer(Path('$Q/ggml-vocab-qwen2.gguf')); tok['tokenizer.chat_template']=(Path('$Q/templates/Qwen-Qwen3-0.6B.jinja').read_text(), gguf.GGUFValueType.STRING, None)
r.write_arch(dataclasses.replace(r.PLAN_SHAPES['qwen3-30b-a3b'], n_layer=3), Path('$M/moe.gguf'), tok, 'random qwen3-30b-a3b Q4_K_M', quant='q4_k_m')"
  else
    python3 bench/random_gguf.py qwen3-30b-a3b $M/moe.gguf --quant q4_k_m --tokenizer $Q/ggml-vocab-qwen2.gguf --template $Q/templates/Qwen-Qwen3-0.6B.jinja
  fi > $M/w2.log 2>&1; echo done > $M/models.done ) &
WRITE=$!
if [ -n "${BUILD:-}" ]; then
  wait $BUILD; stamp "build rc $(cat $B/build.rc)"; tail -3 $B/build.log
  [ "$(cat $B/build.rc)" = 0 ] || { tail -40 $B/build.log $B/cfg.log; cp $B/build.log $B/cfg.log $OUT/; return 1; }
fi
if [ "${CPU:-0}" != 1 ]; then cp -P $B/build/bin/*.so* /tmp/pkg/llama_cpp/lib/; fi
export LD_LIBRARY_PATH=/tmp/pkg/llama_cpp/lib
ls /tmp/pkg/llama_cpp/lib
python3 -c "import llama_cpp; print('gpu offload', llama_cpp.llama_supports_gpu_offload())"
python3 -c "from localinfer.cli import main; main()" hw 2>&1 | tee $RES/hw.txt
wait $WRITE; stamp "models written"; cat $M/w1.log $M/w2.log | tail -4; ls -la $M
sync; stamp "written to disk"  # (the kernel's writeback of 20 GB must not run beside a measure)

# the steps, each if named in STEPS (in that order) and its time is left; results packed after each
step_moe() {  # MoE placement, the two sizes that split the model (PINNED=N: also --threads N)
  want moe 150 || return 0; stamp moe
  python3 bench/moe_placement.py --llama-server $LLAMA_SERVER --source .gpu/src --model $M/moe.gguf \
    --hold-gib ${HOLDS:-16,8} --reps ${MOE_REPS:-3} --tokens 128 --results $RES/moe \
    ${PINNED:+--pinned-threads $PINNED} 2>&1 | tail -30
}
step_serve_1b() {  # serve against llama-server, Llama 3.2 1B's shape
  want serve_1b 120 || return 0; stamp serve_1b
  python3 bench/serve_speed.py --llama-server $LLAMA_SERVER --shape $L1 --tokenizer .gpu/tok.gguf \
    --levels ${LEVELS1:-1,8,32} --reps ${REPS:-3} --no-ceiling --results $RES/serve_1b 2>&1 | tail -15
}
step_gpu_memory() {  # the hybrid's plan against what the GPU holds
  want gpu_memory 60 || return 0; stamp gpu_memory
  python3 bench/gpu_memory.py $M/qwen3.5-0.8b.gguf --ctx 4096,32768 --slots 1,4 \
    --out $RES/gpu_memory_qwen35.json 2>&1 | tail -12
}
step_hybrid_load() {  # the hybrid served, and loaded after each import that once made it crash (app/__init__.py)
  want hybrid_load 60 || return 0; stamp hybrid_load
  local model=$M/qwen3.5-0.8b.gguf
  python3 - "$model" <<'PY' 2>&1 | tee $RES/hybrid_load.txt | tail -40
import subprocess, sys
from pathlib import Path
sys.path.insert(0, "bench")
import harness, httpx
model = sys.argv[1]
process, url = harness.start_serve(harness.SERVE, model, 1, 4096, "/tmp/home")
try:
    reply = httpx.post(url + "/v1/chat/completions", timeout=120, json={
        "model": Path(model).stem, "max_tokens": 8,
        "messages": [{"role": "user", "content": "hello"}]})
    print("serve:", reply.status_code, reply.text[:200])
finally:
    harness.stop_servers({"localinfer": (process, url)})
LOAD = ("import llama_cpp as l; from localinfer.backends.native.model import model_params; "
        "l.llama_backend_init(); p, k = model_params(99, 'none', 0, (), False, ()); "
        "print('loaded', bool(l.llama_model_load_from_file(sys.argv[1].encode(), p)))")
crashed = None
for name, before in [
        ("nothing", ""),
        ("import_service", "import localinfer.service"),
        ("devices", "from localinfer.backends.native.ggml import devices; devices()"),
        ("nvml", "from localinfer.model_store.hardware import _nvml; _nvml()"),
        ("detect", "from localinfer.backends.native.machine import detect; detect()"),
        ("read_gguf_info", "from localinfer.model_store.gguf_info import read_gguf_info; "
                           "read_gguf_info(sys.argv[1])"),
        ("shape", "from localinfer.model_store.gguf_info import read_gguf_info; "
                  "read_gguf_info(sys.argv[1]).shape()"),
        ("prepare_cpu", "from localinfer.service import prepare; "
                        "from localinfer.backends.base import LoadOptions; "
                        "prepare(sys.argv[1], LoadOptions(n_ctx=4096, n_gpu_layers=0))"),
        ("prepare", "from localinfer.service import prepare; "
                    "from localinfer.backends.base import LoadOptions; "
                    "prepare(sys.argv[1], LoadOptions(n_ctx=4096))")]:
    code = f"import sys\n{before}\n{LOAD}"
    try:
        done = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code, model],
                              capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        print(f"load after {name}: timed out")
        continue
    print(f"load after {name}: exit {done.returncode}",
          (done.stdout.strip().splitlines() or [""])[-1],
          " | ".join(l for l in done.stderr.splitlines() if "File" in l)[-300:])
    if done.returncode < 0 and crashed is None:  # a signal
        crashed = code
        open("/tmp/res/hybrid_load_stderr.txt", "w").write(done.stderr[-20000:])
if crashed is not None:  # the first crash's native stack (cuda-gdb debugs host code too)
    Path("/tmp/crash.py").write_text(crashed)
    try:
        gdb = subprocess.run(["cuda-gdb", "-batch", "-ex", "run", "-ex", "bt 40",
                              "-ex", "info sharedlibrary", "--args", sys.executable,
                              "/tmp/crash.py", model],
                             capture_output=True, text=True, timeout=120)
        text = gdb.stdout + gdb.stderr
    except Exception as exc:
        text = f"cuda-gdb: {exc}"
    open("/tmp/res/hybrid_load_gdb.txt", "w").write(text[-60000:])
    print("\n".join(l for l in text.splitlines() if l.startswith("#"))[:3000])
PY
}
step_omp_wait() {  # llama.cpp's idle OpenMP threads beside the GPU's steps: libgomp's spin against the runner's bound
  want omp_wait 60 || return 0; stamp omp_wait
  python3 bench/omp_wait.py --models fast-step --levels 1,8 --reps ${OMP_REPS:-3} \
    --results $RES/omp_wait 2>&1 | tail -8
}
step_moe24() {  # MoE at 24 GiB (the whole model fits)
  want moe24 80 || return 0; stamp moe24
  python3 bench/moe_placement.py --llama-server $LLAMA_SERVER --source .gpu/src --model $M/moe.gguf \
    --hold-gib 24 --reps 3 --tokens 128 --results $RES/moe24 2>&1 | tail -8
}
step_serve_8b() {  # serve, Llama 3.1 8B's shape
  want serve_8b 100 || return 0; stamp serve_8b
  python3 bench/serve_speed.py --llama-server $LLAMA_SERVER --shape $L8 --tokenizer .gpu/tok.gguf \
    --levels ${LEVELS8:-1,8} --reps ${REPS8:-2} --no-ceiling --results $RES/serve_8b 2>&1 | tail -10
}
for step in $STEPS; do
  declare -F "step_$step" >/dev/null || { echo "no step $step"; continue; }
  "step_$step"; pack
done
stamp end
pack
}

case "${1:-}" in
  prepare) shift; prepare "$@" ;;
  run) run ;;
  *) echo "usage: bash bench/gpu_session.sh prepare [PACKAGES_FILE] | run" >&2; exit 2 ;;
esac
