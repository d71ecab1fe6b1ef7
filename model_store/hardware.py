"""What this machine has for running models: GPUs and their memory, CPU, RAM, offload support.

Every probe runs with a timeout and ends as data: a probe that cannot answer (no tool, no
driver, a hung tool) gives "unknown" with the reason, never an exception to the caller.
NVIDIA GPUs are read through NVML when nvidia-ml-py is installed, else from
`nvidia-smi --query-gpu` CSV; AMD from `rocm-smi --json`; Apple Silicon from sysctl.

This module loads no native library: what llama.cpp's own build says (offload, backends,
devices) comes in as `NativeFacts`, from `backends.machine.detect`, which callers use.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import asdict, dataclass, field, replace

import psutil

from localinfer.errors import InvalidRequest

__all__ = ["CPU", "GPU", "BackendLibrary", "Device", "Hardware", "NativeFacts", "Probe",
           "SERVER_PID", "by_bus", "free_gpu_memory", "gpu_count", "mapped_file_bytes",
           "parse_size", "ram_available", "select_gpus", "what_if", "parse_nvidia_smi",
           "parse_rocm_smi", "parse_system_info", "run_tool", "survey"]

_MIB = 1024 * 1024
TIMEOUT_S = 5.0

Runner = Callable[[Sequence[str], float], str]


@dataclass(frozen=True)
class GPU:
    vendor: str  # "nvidia", "amd", "apple"
    index: int
    name: str
    total_bytes: int
    free_bytes: int | None  # None where the platform does not say
    backend: str  # the llama.cpp backend that drives it: "cuda", "rocm", "metal"
    driver: str | None = None


@dataclass(frozen=True)
class CPU:
    model: str
    physical_cores: int
    logical_cores: int
    features: tuple[str, ...]  # of those llama.cpp uses: avx, avx2, avx512f, fma, f16c, neon


@dataclass(frozen=True)
class Probe:
    name: str
    status: str  # "ok", "absent" (nothing of that kind here) or "unknown" (could not tell)
    reason: str = ""


@dataclass(frozen=True)
class Device:
    """A device llama.cpp can run on, as its ggml backend lists it."""

    backend: str  # the ggml backend that drives it: "CPU", "CUDA", "Vulkan", "Metal"
    name: str  # "CUDA0"
    description: str  # "NVIDIA H100 80GB HBM3"
    kind: str  # "cpu", "gpu", "igpu", "accel"
    free_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class BackendLibrary:
    name: str  # "ggml-cpu-haswell", "ggml-cuda"
    loaded: bool | None  # None where the platform cannot tell
    why_not: str = ""  # a GPU library that did not load: what the system's loader says


@dataclass(frozen=True)
class NativeFacts:
    """What the running llama.cpp build says of itself (nothing, where it did not load)."""

    gpu_offload: bool = False
    compute_backends: tuple[str, ...] = ()
    devices: tuple[Device, ...] = ()
    backend_libraries: tuple[BackendLibrary, ...] = ()
    # the layouts llama.cpp may put CPU weights in besides plain memory ("CPU_REPACK"), and
    # those the build offered that localinfer turned off (its AMX kernels crash)
    cpu_buffer_types: tuple[str, ...] = ()
    cpu_buffer_types_off: tuple[str, ...] = ()


@dataclass(frozen=True)
class Hardware:
    cpu: CPU
    ram_total_bytes: int
    ram_available_bytes: int
    gpus: tuple[GPU, ...]
    gpu_offload: bool  # this llama-cpp-python build can offload layers to a GPU
    compute_backends: tuple[str, ...] = ()  # ggml backends in this build: CPU, CUDA, Metal, ...
    probes: tuple[Probe, ...] = field(default_factory=tuple)
    devices: tuple[Device, ...] = ()  # what llama.cpp itself can run on, GPUs first
    # a build whose backends load at run time (GGML_BACKEND_DL): each library, loaded or not
    backend_libraries: tuple[BackendLibrary, ...] = ()
    # the devices of the RPC workers the head was given (backend "rpc"), numbered after the
    # GPUs llama.cpp has here, as it numbers them once they join
    remote: tuple[GPU, ...] = ()
    cpu_buffer_types: tuple[str, ...] = ()  # NativeFacts says
    cpu_buffer_types_off: tuple[str, ...] = ()

    @property
    def usable_gpus(self) -> tuple[GPU, ...]:
        """The GPUs this build of llama.cpp can use (none on a CPU-only build), then the
        workers' devices."""
        return (self.gpus if self.gpu_offload else ()) + self.remote

    def to_dict(self) -> dict:
        return asdict(self)


def gpu_count(devices: Sequence[Device]) -> int:
    """The GPUs llama.cpp puts layers on by default among these devices: the discrete ones,
    else the integrated ones (RPC workers' devices are not counted)."""
    here = [d for d in devices if not d.backend.startswith("RPC")]
    return sum(d.kind == "gpu" for d in here) or sum(d.kind == "igpu" for d in here)


def select_gpus(hw: Hardware, selection: str | None) -> Hardware:
    """The machine with only the GPUs chosen: indexes or names as `hw` shows them,
    comma-separated ("0,2", "NVIDIA GeForce RTX 4090": every card of that name); "none" for
    the CPU alone; None or "" for all."""
    if not selection or not selection.strip():
        return hw
    if selection.strip().lower() == "none":
        return replace(hw, gpus=())
    chosen: list[GPU] = []
    for wanted in (w.strip() for w in selection.split(",") if w.strip()):
        found = [g for g in hw.gpus if wanted == str(g.index) or wanted.lower() == g.name.lower()]
        if not found:
            have = ", ".join(f"{g.index} ({g.name})" for g in hw.gpus) or "none"
            raise InvalidRequest(f"no GPU '{wanted}' on this machine — `localinfer hw` lists "
                                 f"them: {have}")
        chosen += [g for g in found if g not in chosen]
    return replace(hw, gpus=tuple(sorted(chosen, key=lambda g: g.index)))


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(k|m|g|t)?(i)?b?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes from "24GiB", "24G" (binary: GiB), "24GB" (decimal), "512MiB", "1.5T"."""
    match = _SIZE.match(text)
    if not match or not match.group(2):
        raise InvalidRequest(f"'{text}' is not a memory size — write it as 24GiB, 12GB or "
                             f"512MiB")
    number, unit, binary = float(match.group(1)), match.group(2).lower(), match.group(3)
    power = "kmgt".index(unit) + 1
    decimal = text.strip().lower().endswith("b") and not binary
    return int(number * (1000 if decimal else 1024) ** power)


def what_if(hw: Hardware, gpus: Sequence[int], ram: int | None = None) -> Hardware:
    """This machine as if it had these GPUs (CUDA cards of these sizes, all free) and this
    much RAM available: the same planner then says what a model would need."""
    cards = tuple(GPU("nvidia", i, f"what-if GPU of {size / 2**30:g} GiB", size, size, "cuda")
                  for i, size in enumerate(gpus))
    return replace(hw, gpus=cards, gpu_offload=bool(cards) or hw.gpu_offload,
                   ram_available_bytes=hw.ram_available_bytes if ram is None else ram,
                   ram_total_bytes=hw.ram_total_bytes if ram is None else ram)


def run_tool(cmd: Sequence[str], timeout: float) -> str:
    done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip().splitlines()
        raise RuntimeError(message[0] if message else f"exit code {done.returncode}")
    return done.stdout


# ---------------------------------------------------------------------------- NVIDIA
_NVIDIA_QUERY = "index,name,memory.total,memory.free,driver_version"


def parse_nvidia_smi(csv_text: str) -> list[GPU]:
    """`nvidia-smi --query-gpu=index,name,memory.total,memory.free,driver_version
    --format=csv,noheader,nounits` → GPUs (memory comes in MiB)."""
    gpus = []
    for line in csv_text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5:
            raise ValueError(f"unexpected nvidia-smi line: {line!r}")
        index, name, total, free, driver = parts
        gpus.append(GPU("nvidia", int(index), name, int(float(total)) * _MIB,
                        None if free in ("[N/A]", "N/A") else int(float(free)) * _MIB,
                        "cuda", driver))
    return gpus


def _nvml() -> list[GPU]:
    import pynvml  # nvidia-ml-py, optional

    pynvml.nvmlInit()
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            gpus.append(GPU("nvidia", i, name.decode() if isinstance(name, bytes) else name,
                            memory.total, memory.free, "cuda",
                            driver.decode() if isinstance(driver, bytes) else driver))
        return gpus
    finally:
        pynvml.nvmlShutdown()


def _probe_nvidia(run: Runner) -> tuple[list[GPU], Probe]:
    nvml_error = ""
    try:
        return _nvml(), Probe("nvidia", "ok", "NVML")
    except ImportError:  # nvidia-ml-py is optional
        pass
    except Exception as exc:  # NVML present but the driver did not answer: try the tool
        nvml_error = f"NVML: {exc}; "
    if shutil.which("nvidia-smi") is None:
        return [], Probe("nvidia", "absent", nvml_error + "no nvidia-smi on PATH")
    try:
        out = run(["nvidia-smi", f"--query-gpu={_NVIDIA_QUERY}",
                   "--format=csv,noheader,nounits"], TIMEOUT_S)
        return parse_nvidia_smi(out), Probe("nvidia", "ok", "nvidia-smi")
    except subprocess.TimeoutExpired:
        return [], Probe("nvidia", "unknown", f"nvidia-smi did not answer in {TIMEOUT_S:.0f} s")
    except (RuntimeError, ValueError, OSError) as exc:
        return [], Probe("nvidia", "unknown", f"nvidia-smi: {exc}")


def free_gpu_memory(run: Runner = run_tool) -> dict[int, int]:
    """Each GPU's free memory now, by index, as its driver says (NVML or nvidia-smi, then
    rocm-smi); GPUs whose driver says nothing (Apple's, a tool that failed) are left out.
    Asked at each load decision: what other programs took, and what an unload gave back,
    shows here, not in the machine's probe at start."""
    free: dict[int, int] = {}
    for gpus, _ in (_probe_nvidia(run), _probe_amd(run)):
        free.update({g.index: g.free_bytes for g in gpus if g.free_bytes is not None})
    return free


# ---------------------------------------------------------------------------- AMD
def parse_rocm_smi(json_text: str) -> list[GPU]:
    """`rocm-smi --showproductname --showmeminfo vram --json` → GPUs (memory in bytes)."""
    data = json.loads(json_text)
    gpus = []
    for key, card in sorted(data.items()):
        if not key.startswith("card"):
            continue
        total = int(card["VRAM Total Memory (B)"])
        used = int(card.get("VRAM Total Used Memory (B)", 0))
        name = card.get("Card Series") or card.get("Card series") or card.get("Card SKU") or "AMD GPU"
        gpus.append(GPU("amd", int(key[4:]), name, total, total - used, "rocm"))
    return gpus


def _probe_amd(run: Runner) -> tuple[list[GPU], Probe]:
    if shutil.which("rocm-smi") is None:
        return [], Probe("amd", "absent", "no rocm-smi on PATH")
    try:
        out = run(["rocm-smi", "--showproductname", "--showmeminfo", "vram", "--json"], TIMEOUT_S)
        return parse_rocm_smi(out), Probe("amd", "ok", "rocm-smi")
    except subprocess.TimeoutExpired:
        return [], Probe("amd", "unknown", f"rocm-smi did not answer in {TIMEOUT_S:.0f} s")
    except (RuntimeError, ValueError, KeyError, OSError) as exc:
        return [], Probe("amd", "unknown", f"rocm-smi: {exc}")


# ---------------------------------------------------------------------------- Apple
def apple_gpu_share(total_bytes: int) -> int:
    """Metal's default working-set limit on Apple Silicon: about 2/3 of unified memory up to
    36 GiB, 3/4 above (what llama.cpp sees as the device's recommendedMaxWorkingSetSize)."""
    return total_bytes * 2 // 3 if total_bytes <= 36 * 1024 * _MIB else total_bytes * 3 // 4


def _probe_apple(run: Runner, system: str, machine: str) -> tuple[list[GPU], Probe]:
    if system != "Darwin" or machine != "arm64":
        return [], Probe("apple", "absent", "not Apple Silicon")
    try:
        total = int(run(["sysctl", "-n", "hw.memsize"], TIMEOUT_S).strip())
        name = run(["sysctl", "-n", "machdep.cpu.brand_string"], TIMEOUT_S).strip()
    except (subprocess.TimeoutExpired, RuntimeError, ValueError, OSError) as exc:
        return [], Probe("apple", "unknown", f"sysctl: {exc}")
    share = apple_gpu_share(total)
    return [GPU("apple", 0, f"{name} GPU", share, None, "metal")], Probe("apple", "ok", "sysctl")


# ---------------------------------------------------------------------------- CPU
_FEATURES = ("avx", "avx2", "avx512f", "fma", "f16c")


def _cpu_info(run: Runner, system: str, machine: str) -> CPU:
    model, flags = "", set()
    try:
        if system == "Linux":
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                text = f.read()
            # x86 says "model name" and "flags"; ARM says "Model" and "Features"
            found = re.search(r"^(?:model name|Model)\s*:\s*(.+)$", text, re.M)
            model = found.group(1).strip() if found else ""
            found = re.search(r"^(?:flags|Features)\s*:\s*(.+)$", text, re.M)
            flags = set(found.group(1).split()) if found else set()
        elif system == "Darwin":
            model = run(["sysctl", "-n", "machdep.cpu.brand_string"], TIMEOUT_S).strip()
    except (OSError, subprocess.TimeoutExpired, RuntimeError):
        pass
    features = [f for f in _FEATURES if f in flags]
    if machine in ("arm64", "aarch64") and (system == "Darwin" or "asimd" in flags):
        features.append("neon")
    return CPU(model or platform.processor() or machine or "unknown",
               psutil.cpu_count(logical=False) or os.cpu_count() or 1,
               psutil.cpu_count() or os.cpu_count() or 1, tuple(features))


def cpu_model() -> str:
    """This machine's CPU model, as `localinfer hw` names it."""
    return _cpu_info(run_tool, platform.system(), platform.machine()).model


def parse_system_info(text: str) -> tuple[str, ...]:
    """Backend names from llama_print_system_info(): "CUDA : ARCHS = 890 | ... | CPU : AVX = 1"."""
    return tuple(dict.fromkeys(re.findall(r"(?:^|\|\s*)([A-Za-z][\w-]*) : ", text)))


# set in a runner's environment (backends/runner/spawn.py): the server whose processes hold
# its models, its own and every runner's
SERVER_PID = "LOCALINFER_SERVER_PID"


def by_bus(environ: MutableMapping[str, str]) -> None:
    """CUDA numbers its devices fastest first unless told otherwise; NVML, nvidia-smi and so
    `hw` and the planner number them by PCI bus: one order for both, in `environ` (this
    process's before CUDA starts, a runner's as it is started), unless the user chose one."""
    environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")


def ram_available() -> int:
    """The RAM a new allocation may take: what the OS says is available, less the file pages
    resident in this server's processes (`mapped_file_bytes`).

    A model's weights are mapped from its file, and Linux counts such pages as available
    (it may drop them and read them back): measured, a 1.23 GiB model mapped and read took
    1.2 GiB from free memory and none from available. Memory handed out on that count (a
    second model's plan, saved prompts) would come out of the weights a model reads at every
    step, read again from the disk each time."""
    return max(0, psutil.virtual_memory().available - mapped_file_bytes())


def mapped_file_bytes() -> int:
    """Bytes of mapped files resident in this server's processes: the server (in a runner:
    its parent, `SERVER_PID`; else this process) and its descendants. Linux's RssFile; 0
    where there is no /proc (the OS's own figure is then taken as it is)."""
    if not os.path.exists("/proc/self/status"):
        return 0
    try:
        root = psutil.Process(int(os.environ.get(SERVER_PID) or os.getpid()))
        family = [root, *root.children(recursive=True)]
    except (psutil.Error, ValueError):  # (the server is gone: its runner ends with it)
        family = [psutil.Process()]
    return sum(_rss_file(p.pid) for p in family)


def _rss_file(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"RssFile:"):
                    return int(line.split()[1]) * 1024  # (kB)
    except (OSError, ValueError, IndexError):  # (it ended meanwhile)
        pass
    return 0


def survey(native: NativeFacts, run: Runner = run_tool, system: str | None = None,
           machine: str | None = None) -> Hardware:
    """The machine as the vendors' tools and the OS say, with llama.cpp's own facts."""
    system = system or platform.system()
    machine = machine or platform.machine()
    gpus: list[GPU] = []
    probes: list[Probe] = []
    for found, probe in (_probe_nvidia(run), _probe_amd(run), _probe_apple(run, system, machine)):
        gpus += found
        probes.append(probe)
    return Hardware(_cpu_info(run, system, machine), psutil.virtual_memory().total,
                    ram_available(), tuple(gpus),
                    native.gpu_offload, native.compute_backends, tuple(probes), native.devices,
                    native.backend_libraries, cpu_buffer_types=native.cpu_buffer_types,
                    cpu_buffer_types_off=native.cpu_buffer_types_off)
