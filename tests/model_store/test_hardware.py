"""Hardware probes: real output shapes of the vendor tools, fed through real processes."""

from __future__ import annotations

import json
import os
import platform
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from localinfer.backends.native.machine import detect
from localinfer.model_store.hardware import (apple_gpu_share, free_gpu_memory,
                                            mapped_file_bytes, parse_nvidia_smi,
                                            parse_rocm_smi, ram_available)

# nvidia-smi --query-gpu=index,name,memory.total,memory.free,driver_version --format=csv,noheader,nounits
NVIDIA_TWO_GPUS = """0, NVIDIA GeForce RTX 4090, 24564, 23012, 550.54.14
1, NVIDIA H100 80GB HBM3, 81559, 80970, 550.54.14
"""

# rocm-smi --showproductname --showmeminfo vram --json (ROCm 6)
ROCM_ONE_GPU = json.dumps({"card0": {
    "Card Series": "Radeon RX 7900 XTX", "Card Model": "0x744c", "Card Vendor": "Advanced Micro Devices, Inc. [AMD/ATI]",
    "Card SKU": "D7070100", "VRAM Total Memory (B)": "25753026560",
    "VRAM Total Used Memory (B)": "1073741824"}})


def test_nvidia_smi_csv_is_parsed_in_mib():
    gpus = parse_nvidia_smi(NVIDIA_TWO_GPUS)
    assert [g.name for g in gpus] == ["NVIDIA GeForce RTX 4090", "NVIDIA H100 80GB HBM3"]
    assert gpus[0].total_bytes == 24564 * 2**20 and gpus[0].free_bytes == 23012 * 2**20
    assert gpus[1].backend == "cuda" and gpus[1].driver == "550.54.14"


def test_nvidia_smi_na_free_memory_and_garbage():
    assert parse_nvidia_smi("0, Tesla T4, 15360, [N/A], 535.104.05")[0].free_bytes is None
    with pytest.raises(ValueError):
        parse_nvidia_smi("NVIDIA-SMI has failed")


def test_rocm_smi_json_is_parsed():
    gpu, = parse_rocm_smi(ROCM_ONE_GPU)
    assert gpu.name == "Radeon RX 7900 XTX" and gpu.backend == "rocm"
    assert gpu.free_bytes == 25753026560 - 1073741824


@pytest.mark.parametrize("gib,share", [(8, 8 * 2 / 3), (16, 16 * 2 / 3), (36, 24), (64, 48),
                                       (192, 144)])
def test_apple_gpu_share_of_unified_memory(gib, share):
    assert apple_gpu_share(gib * 2**30) == pytest.approx(share * 2**30, rel=1e-6)


def test_apple_silicon_through_sysctl_output():
    answers = {("sysctl", "-n", "hw.memsize"): "34359738368\n",
               ("sysctl", "-n", "machdep.cpu.brand_string"): "Apple M2 Pro\n"}
    found = detect(run=lambda cmd, timeout: answers[tuple(cmd)], system="Darwin", machine="arm64")
    apple = [g for g in found.gpus if g.vendor == "apple"]
    assert apple and apple[0].backend == "metal" and apple[0].name == "Apple M2 Pro GPU"
    assert apple[0].total_bytes == apple_gpu_share(32 * 2**30)
    assert "neon" in found.cpu.features and found.cpu.model == "Apple M2 Pro"


def _fake_tool(bindir: Path, name: str, script: str) -> None:
    path = bindir / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _hw_json(bindir: Path) -> dict:
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run([sys.executable, "-m", "localinfer", "hw", "--json"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_hw_command_reads_nvidia_smi(tmp_path):
    csv = NVIDIA_TWO_GPUS.replace("\n", "\\n")
    _fake_tool(tmp_path, "nvidia-smi", f'printf "{csv}"')
    found = _hw_json(tmp_path)
    assert [g["name"] for g in found["gpus"]][:2] == ["NVIDIA GeForce RTX 4090",
                                                      "NVIDIA H100 80GB HBM3"]
    assert {"name": "nvidia", "status": "ok", "reason": "nvidia-smi"} in found["probes"]
    assert found["ram_total_bytes"] > 0 and found["cpu"]["physical_cores"] >= 1


def test_a_failing_driver_is_unknown_with_its_reason(tmp_path):
    _fake_tool(tmp_path, "nvidia-smi",
               'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA '
               'driver. Make sure that the latest NVIDIA driver is installed and running."; exit 9')
    probe = next(p for p in _hw_json(tmp_path)["probes"] if p["name"] == "nvidia")
    assert probe["status"] == "unknown" and "couldn't communicate" in probe["reason"]


def test_free_gpu_memory_is_asked_of_the_driver_each_time(tmp_path, monkeypatch):
    """Each call runs the vendor's tool again: what it says now, not what it said at start
    (the second answer: another program took 4 GiB of the first card)."""
    answers = tmp_path / "answers"
    later = NVIDIA_TWO_GPUS.replace("23012", "18916")
    answers.write_text(NVIDIA_TWO_GPUS + "--\n" + later)
    _fake_tool(tmp_path, "nvidia-smi",  # prints the first answer left, then drops it
               f'sed -n "1,/^--$/p" "{answers}" | grep -v "^--$"; '
               f'sed -i "1,/^--$/d" "{answers}"')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr("localinfer.model_store.hardware._nvml", _no_nvml)
    assert free_gpu_memory() == {0: 23012 * 2**20, 1: 80970 * 2**20}
    assert free_gpu_memory() == {0: 18916 * 2**20, 1: 80970 * 2**20}


def _no_nvml():
    raise ImportError("nvidia-ml-py is not installed")


def test_a_hung_tool_times_out_to_unknown(tmp_path, monkeypatch):
    _fake_tool(tmp_path, "rocm-smi", "sleep 30")
    monkeypatch.setattr("localinfer.model_store.hardware.TIMEOUT_S", 0.5)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    found = detect()
    probe = next(p for p in found.probes if p.name == "amd")
    assert probe.status == "unknown" and "did not answer" in probe.reason


def test_this_machine_without_gpu_tools():
    found = detect()
    assert found.cpu.logical_cores >= found.cpu.physical_cores >= 1
    assert 0 < found.ram_available_bytes <= found.ram_total_bytes
    assert all(p.status in ("ok", "absent", "unknown") for p in found.probes)


@pytest.mark.parametrize("text,backends", [
    ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
     "LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | ", ("CPU",)),
    ("CUDA : ARCHS = 500,610,700,750,800,860,890 | USE_GRAPHS = 1 | PEER_MAX_BATCH_SIZE = 128 | "
     "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | OPENMP = 1 | ", ("CUDA", "CPU")),
    ("Metal : EMBED_LIBRARY = 1 | CPU : NEON = 1 | ARM_FMA = 1 | FP16_VA = 1 | DOTPROD = 1 | "
     "ACCELERATE = 1 | REPACK = 1 | ", ("Metal", "CPU")),
])
def test_build_backends_from_system_info(text, backends):
    from localinfer.model_store.hardware import parse_system_info
    assert parse_system_info(text) == backends


def test_this_build_reports_its_cpu_backend():
    assert "CPU" in detect().compute_backends


def test_llama_cpp_runs_on_this_machines_cpu():
    """The devices come from llama.cpp's own registry, read through ctypes."""
    found = detect()
    cpu = [d for d in found.devices if d.kind == "cpu"]
    assert len(cpu) == 1 and cpu[0].backend == "CPU" and cpu[0].description
    assert cpu[0].total_bytes > 0 and "CPU" in found.compute_backends


@pytest.mark.parametrize("names, struck, left", [
    (["AMX", "CPU_REPACK"], ["AMX"], ["CPU_REPACK"]),  # a build for a Sapphire Rapids Xeon
    (["CPU_REPACK", "AMX", "KLEIDIAI"], ["AMX"], ["CPU_REPACK", "KLEIDIAI"]),
    (["CPU_REPACK"], [], ["CPU_REPACK"]),
    ([], [], []),
])
def test_unsafe_buffer_types_are_struck_from_the_list_in_place(names, struck, left):
    """The array llama.cpp reads loses the unsafe entries; the rest keep their order and the
    array its null end."""
    import ctypes

    from localinfer.backends.native.ggml import UNSAFE_BUFFER_TYPES, strike_buffer_types

    handles = {1000 + i: name for i, name in enumerate(names)}
    bufts = (ctypes.c_void_p * (len(names) + 1))(*handles, None)
    assert strike_buffer_types(bufts, handles.__getitem__, UNSAFE_BUFFER_TYPES) == struck
    assert [handles[b] for b in bufts[:len(left)]] == left
    assert list(bufts[len(left):]) == [None] * (len(names) + 1 - len(left))


def test_a_strike_that_did_not_hold_is_an_error_not_a_crash_to_come():
    """The getter is asked again after the strike: where it hands back a fresh copy each time
    (the change went to a copy llama.cpp does not read), AMX is still there: an error. Where
    it hands back its one array, AMX is gone and said so."""
    import ctypes

    from localinfer.backends.native.ggml import strike_unsafe_buffer_types

    handles = {1000: "AMX", 1001: "CPU_REPACK"}
    fresh = lambda: [(ctypes.c_void_p * 3)(1000, 1001, None)]  # noqa: E731
    with pytest.raises(RuntimeError, match="AMX kernels could not be turned off"):
        strike_unsafe_buffer_types(fresh, handles.__getitem__)
    static = (ctypes.c_void_p * 3)(1000, 1001, None)
    assert strike_unsafe_buffer_types(lambda: [static], handles.__getitem__) == ["AMX"]
    assert list(static) == [1001, None, None]
    assert strike_unsafe_buffer_types(lambda: [static], handles.__getitem__) == []


def test_the_default_model_decodes_on_this_cpu_without_amx_kernels(smollm2_path):
    """In a process of its own: once llama.cpp is loaded, the CPU offers no AMX buffer type
    (where the build has it, its matrix product crashes on the first decode: llama.cpp
    #20824), its repacked layouts still; and the embedded model decodes."""
    script = """
import json, sys
from localinfer.backends.base import DoneEvent, LoadOptions, SamplingParams
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.backends.native.ggml import cpu_extra_buffer_types
names = cpu_extra_buffer_types()
with LlamaCppBackend(sys.argv[1], LoadOptions(n_ctx=256)) as backend:
    reply = backend.generate(backend.tokenize("The capital of France is"),
                             SamplingParams(max_tokens=4, ignore_eos=True))
    done = [event for event in reply if isinstance(event, DoneEvent)]
    print(json.dumps({"names": names, "tokens": len(done[0].stats.token_times)}))
"""
    result = subprocess.run([sys.executable, "-c", script, str(smollm2_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    facts = json.loads(result.stdout.splitlines()[-1])
    assert "AMX" not in facts["names"]
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert "CPU_REPACK" in facts["names"]  # (the other extra layouts are kept)
    assert facts["tokens"] == 4


def test_hw_says_which_layouts_the_cpus_weights_may_take_and_which_are_off(tmp_path):
    """`hw` names the CPU's extra buffer types llama.cpp may use, and AMX as off exactly
    where this build has its kernels (llama.cpp's own system info says AMX_INT8 = 1)."""
    import llama_cpp

    found = _hw_json(tmp_path)
    has_amx = "AMX_INT8 = 1" in llama_cpp.llama_print_system_info().decode()
    assert found["cpu_buffer_types_off"] == (["AMX"] if has_amx else [])
    assert "AMX" not in found["cpu_buffer_types"]
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert "CPU_REPACK" in found["cpu_buffer_types"]
    shown = subprocess.run([sys.executable, "-m", "localinfer", "hw"], capture_output=True,
                           text=True, timeout=60).stdout
    layouts = ", ".join(found["cpu_buffer_types"]) or "plain only"
    assert f"CPU weight layouts: {layouts}" + (" · AMX off" if has_amx else "\n") in shown


def test_hw_lists_llama_cpps_devices(tmp_path):
    found = _hw_json(tmp_path)
    assert [d["backend"] for d in found["devices"]] == ["CPU"]
    shown = subprocess.run([sys.executable, "-m", "localinfer", "hw"], capture_output=True,
                           text=True, timeout=60).stdout
    assert f"device CPU (CPU) · {found['devices'][0]['description']} · CPU" in shown


# what a GGML_BACKEND_DL + GGML_CPU_ALL_VARIANTS build of llama-cpp-python 0.3.36 ships
DL_BUILD = ["libggml-base.so", "libggml.so", "libllama.so", "libggml-cpu-haswell.so",
            "libggml-cpu-sandybridge.so", "libggml-cpu-skylakex.so", "libggml-cpu-x64.so",
            "libggml-cpu-zen4.so", "libggml-cuda.so"]


def test_backend_libraries_say_which_were_loaded(tmp_path):
    from localinfer.backends.native.ggml import backend_libraries

    for name in DL_BUILD:
        (tmp_path / name).write_bytes(b"\x7fELF")
    found = backend_libraries(tmp_path, lambda: {"libggml-cpu-zen4.so", "libggml-base.so"})
    assert [lib.name for lib in found] == ["ggml-cpu-haswell", "ggml-cpu-sandybridge",
                                           "ggml-cpu-skylakex", "ggml-cpu-x64",
                                           "ggml-cpu-zen4", "ggml-cuda"]
    assert [lib.name for lib in found if lib.loaded] == ["ggml-cpu-zen4"]
    # where the platform cannot tell what is loaded, it says so rather than "not loaded"
    assert {lib.loaded for lib in backend_libraries(tmp_path, lambda: None)} == {None}


def test_a_backend_library_reached_by_a_link_counts_as_loaded(tmp_path):
    from localinfer.backends.native.ggml import backend_libraries

    (tmp_path / "libggml-cuda.so.0.25.3").write_bytes(b"\x7fELF")
    (tmp_path / "libggml-cuda.so").symlink_to("libggml-cuda.so.0.25.3")
    found = backend_libraries(tmp_path, lambda: {"libggml-cuda.so.0.25.3"})
    assert [(lib.name, lib.loaded) for lib in found] == [("ggml-cuda", True)]


def test_a_gpu_library_that_did_not_load_says_why(tmp_path):
    """A CUDA build on a machine without the driver: the library needs libcuda.so.1, which
    is not there. llama.cpp's release build skips it silently; hw names what is missing."""
    from localinfer.backends.native.ggml import backend_libraries

    if shutil.which("gcc") is None:
        pytest.skip("no C compiler to build a library that needs a missing one")
    source = tmp_path / "backend.c"
    source.write_text("int driver_call(void);\n"  # used, so the link keeps the dependency
                      "int ggml_backend_init(void) { return driver_call(); }\n")
    (tmp_path / "driver.c").write_text("int driver_call(void) { return 1; }\n")
    cc = ["gcc", "-shared", "-fPIC"]
    subprocess.run([*cc, "-o", tmp_path / "libfakedriver.so", tmp_path / "driver.c"], check=True)
    subprocess.run([*cc, "-o", tmp_path / "libggml-fakegpu.so", source, f"-L{tmp_path}",
                    "-lfakedriver"], check=True)
    (tmp_path / "libfakedriver.so").unlink()  # the driver is not installed here
    (tmp_path / "libggml-cpu-sse42.so").write_bytes(b"\x7fELF")  # a CPU variant not chosen

    found = {lib.name: lib for lib in backend_libraries(tmp_path, lambda: set())}
    assert "libfakedriver.so: cannot open shared object file" in found["ggml-fakegpu"].why_not
    assert found["ggml-cpu-sse42"].why_not == ""  # not chosen is not a failure


# a process of ours that maps a file and reads it all, as llama.cpp maps a model's weights
_MAP_AND_WAIT = """
import mmap, sys
with open(sys.argv[1], "rb") as f:
    data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
sum(data[i] for i in range(0, len(data), 4096))
print("mapped", flush=True)
sys.stdin.read()
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="RssFile is Linux's")
def test_weights_our_processes_map_are_not_counted_as_available_ram(tmp_path):
    """Linux counts a mapped file's resident pages as available memory (it may drop them).
    A model's weights are such pages: RAM planned or saved on that count would push them
    out, and every step would read them from the disk again. What a child process of ours
    maps is counted as in use while it holds it, and no longer once it ends."""
    size = 64 << 20
    path = tmp_path / "weights.bin"
    path.write_bytes(os.urandom(size))
    before = mapped_file_bytes()
    child = subprocess.Popen([sys.executable, "-c", _MAP_AND_WAIT, str(path)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "mapped"
        held = mapped_file_bytes()
        available, spare = psutil.virtual_memory().available, ram_available()
        assert held - before >= 0.9 * size
        assert spare <= available - held + (16 << 20)  # (the OS's figure moves meanwhile)
    finally:
        child.communicate("")
    assert mapped_file_bytes() - before < size // 2

