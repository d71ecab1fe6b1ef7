"""The service: turns "run this model" into a loaded backend, checking everything first."""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING
from collections.abc import Callable, Mapping, Sequence

from localinfer.backends.base import Backend, LoadOptions
from localinfer.backends.rpc.workers import HEAD
from localinfer.errors import (ContextTooLarge, InvalidRequest, LocalinferError, ModelNotFound,
                               ModelNotInstalled)
from localinfer.model_store import pulled
from localinfer.model_store.catalog import HubRef, parse_hub_ref
from localinfer.backends.native.machine import detect
from localinfer.model_store.hardware import GPU, Hardware, gpu_count, ram_available, select_gpus
from localinfer.model_store.hub import Progress, RemoteFile, remote_info, remote_projector
from localinfer.model_store.planner import (DEFAULT_OUTPUTS, Plan, WontFit,
                                            free_memory, plan)
from localinfer.model_store.fit import (MemoryEstimate, beyond_training, check_context,
                                        estimate_memory, projector_memory)
from localinfer.model_store.gguf_info import GGUFInfo, read_gguf_info, read_projector_info
from localinfer.model_store.sources import ResolvedModel, catalog_names, is_embedded, resolve
from localinfer.model_store.pulled import Manifest
from localinfer.runners import BackendFactory, runner_backend, warm_runner
from localinfer.settings import Settings

if TYPE_CHECKING:
    from localinfer.backends.native.attention_probe import AttentionShape, Verdict

__all__ = ["Prepared", "check_writes_text", "checkpoints_of", "choose_quant", "draft_memory",
           "gpu_plan", "less_gpu_memory", "less_memory", "load_model", "placed", "plan_for",
           "plan_remote", "projector_bytes", "prepare", "pull_model", "ram_available",
           "describe", "hardware_report", "kv_cache_bytes", "Hardware", "resolve"]

log = logging.getLogger("localinfer.service")

def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the system has one)."""
    return (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1)


def check_threads(n_threads: int | None) -> None:
    """More threads than the CPUs this process may run on only make llama.cpp's threads wait
    on each other (--threads 1000 on 2 cores: 0.3 tokens/s, against 85 with none given):
    refused before a load, as LM Studio's thread count stops at the cores."""
    cpus = usable_cpus()
    if n_threads and n_threads > cpus:
        raise InvalidRequest(f"{n_threads} threads is more than the {cpus} CPUs this machine "
                             f"runs at once, and llama.cpp's threads would wait on each other "
                             f"— use --threads {cpus} or less, or leave it out to follow the "
                             f"load")


def default_context(info: GGUFInfo, settings: Settings) -> int:
    """The context a chat gets when none is asked for: the setting, within what the model
    was trained on."""
    return min(settings.ctx, info.n_ctx_train or settings.ctx)


@dataclass(frozen=True)
class Prepared:
    """A model checked and planned for this machine, before anything is loaded: the one fit
    check of `run`, the chat app and the server alike."""

    model: ResolvedModel
    info: GGUFInfo
    options: LoadOptions  # the context, GPU layers and draft model's file filled in
    ram_bytes: int  # what it takes of RAM (weights the GPU does not hold, KV and buffers)
    # and of each GPU (by index), as the planner counts it (a draft model and a vision
    # projector on the main GPU)
    gpu_use: dict[int, int] = dataclasses.field(default_factory=dict)
    # more copies of the model, each whole on a GPU of its own (`options` is the first's)
    copies: tuple[LoadOptions, ...] = ()

    @property
    def gpu_bytes(self) -> int:
        return sum(self.gpu_use.values())

    @property
    def memory_bytes(self) -> int:
        return self.ram_bytes + self.gpu_bytes


def prepare(
    ref: str | None,
    options: LoadOptions,
    settings: Settings | None = None,
    available_memory: Callable[[], int] = ram_available,
    allow_paths: bool = True,
    hardware: Callable[[], Hardware | None] = lambda: detect(),
) -> Prepared:
    """Resolve, validate the file, plan the GPU layers and check the memory — all before
    loading anything."""
    settings = settings or Settings()
    check_threads(options.n_threads)
    model = resolve(ref or settings.default_model, settings.models_dir, allow_paths)
    info = read_gguf_info(model.path)
    n_ctx = options.n_ctx or default_context(info, settings)
    draft_model, draft_bytes, draft_rows = None, 0, 0
    if options.draft_model:  # a name or a path: it comes from whoever starts us, never the network
        draft = resolve(options.draft_model, settings.models_dir)
        draft_model = str(draft.path)
        drafting = draft_memory(read_gguf_info(draft.path), n_ctx, options)
        # (its output buffer is host memory wherever its layers go)
        draft_bytes, draft_rows = drafting.ram, drafting.outputs
    projector = options.projector or (str(model.projector) if model.projector else None)
    # a projector goes where the model's layers go, as a draft model does: counted with it
    beside = draft_bytes + (projector_memory(read_projector_info(projector)) if projector else 0)
    what = " and ".join(w for w, b in (("the draft model", draft_bytes),
                                       ("the vision projector", beside - draft_bytes)) if b)
    options = dataclasses.replace(options, n_ctx=n_ctx, draft_model=draft_model,
                                  projector=projector,
                                  reply_cap=settings.max_tokens if options.reply_cap is None
                                  else options.reply_cap)
    chosen = None
    snapshots = rollback_snapshots(info, options)
    held = checkpoints_of(options)
    if options.n_gpu_layers is None:  # a draft model (and a projector) goes whole onto a GPU
        machine = hardware()
        machine = machine and select_gpus(machine, settings.gpus)  # --gpus
        machine = with_workers(machine, settings.workers, settings.worker_key)
        used = tuple(g.name.rpartition("/")[0] for g in (machine.remote if machine else ()))
        chosen = gpu_plan(info, n_ctx, options.n_slots,
                          less_gpu_memory(machine, beside - draft_rows),
                          options.kv_type, options.n_outputs, snapshots, options.swa_full,
                          flash_attn=options.flash_attn is not False, **held)
        options = placed(options, chosen)
        if chosen is not None and any(p.remote for p in chosen.placement):
            options = dataclasses.replace(options, workers=tuple(dict.fromkeys(used)),
                                          worker_key=settings.worker_key, worker_head=HEAD)
    if chosen is not None:
        # in RAM: the input embeddings of an untied model, the layers the GPU cannot take,
        # the context checkpoints and the output buffers (of memory_bytes, never of gpu_bytes)
        # (this machine's memory only: a worker's is the worker's, and it serves one model)
        use = {p.index: p.total for p in chosen.placement if p.index is not None
               and not p.remote}
        if use:  # a draft model goes on the main GPU; with workers alone, into RAM
            use[chosen.main_gpu] = use.get(chosen.main_gpu, 0) + beside - draft_rows
        ram = chosen.memory_bytes - chosen.gpu_bytes + (draft_rows if use else beside)
        prepared = Prepared(model, info, options, ram, use)
        return replicate(prepared, machine, settings.replicas)
    if not options.n_gpu_layers:
        options = cpu_attention(info, options, available_memory() - beside, snapshots, held)
    flash = options.flash_attn is not False
    estimate = estimate_memory(info, n_ctx, options.n_slots, options.n_batch,
                               options.kv_type, options.n_outputs, options.swa_full, snapshots,
                               flash_attn=flash, **held)
    if not options.n_gpu_layers:  # all of it in RAM: check it fits there
        check_context(info, n_ctx, options.n_slots, available_memory(), options.n_batch,
                      model.name, options.kv_type, beside=(beside, what),
                      n_outputs=options.n_outputs, snapshots=snapshots,
                      swa_full=options.swa_full, flash_attn=flash, **held)
    # (layers the user put on a GPU by hand: counted in RAM, an upper bound)
    return Prepared(model, info, options, estimate.ram + beside)


def cpu_attention(info: GGUFInfo, options: LoadOptions, available: int, snapshots: int,
                  held: Mapping[str, int | None]) -> LoadOptions:
    """The options with flash attention off for a model wholly on the CPU where the probe
    measured it clearly the slower kernel on this CPU for the model's attention shape
    (`cpu_kernel`, backends/native/attention_probe.py; a shape it cannot measure, or a probe
    that failed, counts as slower), unless the user set it (--flash-attn, --no-flash-attn), its KV
    cache is quantised (which needs it), it pools (an embedder or reranker only reads
    prompts) or the attention scores its compute buffer then holds leave no room in
    `available` bytes.

    llama.cpp turns it on wherever a device has it, a CPU included. Whether it is faster
    there depends on the CPU: on a 2-core Xeon, 2,048 tokens deep, SmolLM2's shape decoded
    21.1 tok/s with it and 41.5 without (llama-server 23.4), 4,096 deep 13.3 and 31.3
    (bench/results/deep_decode.md); on a 2-core EPYC it decoded 1.01-1.07x as fast with it
    from 128 to 3,072 tokens deep and read a 3,072-token prompt 1.4x as fast
    (bench/results/epyc_2core/deep_decode.md). Without it a prompt read beside running
    streams may be cut into pieces of 16 tokens, not 65 (step_budget.py), the context
    reserves at least planner.PLAIN_ATTENTION_OUTPUTS outputs, and its compute buffer holds
    a layer's attention scores (planner.attention_scores: smollm2 at 8,192 tokens 145 MiB
    more; an 8B at 32K, 2 GiB)."""
    if (options.flash_attn is not None or options.n_gpu_layers or options.workers
            or options.kv_type != "f16" or info.shape().pooled or info.shape().encoder):
        return options
    found = cpu_kernel(info, options)
    if found is not None and found.flash:
        log.info("%s: %s", info.name, found.says())
        return options
    plain = estimate_memory(info, options.n_ctx or 0, options.n_slots, options.n_batch,
                            options.kv_type, options.n_outputs, options.swa_full, snapshots,
                            flash_attn=False, **held)
    if plain.ram > available:
        log.info("flash attention stays on for %s: without it the attention scores would not "
                 "fit", info.name)
        return options
    return dataclasses.replace(options, flash_attn=False)


def attention_shape(info: GGUFInfo) -> AttentionShape | None:
    """The attention the probe measures for a model: its query heads, its attention layers'
    most common KV head count and its head size; None for a model without attention layers,
    or whose keys and values differ in size (the probe's llama layers cannot have that)."""
    from localinfer.backends.native.attention_probe import AttentionShape

    heads = [layer.n_head_kv for layer in info.shape().per_layer() if layer.n_head_kv]
    if not heads or info.head_dim_k != info.head_dim_v or not info.head_dim_k:
        return None
    return AttentionShape(info.n_head or max(heads), max(set(heads), key=heads.count),
                          info.head_dim_k)


def cpu_kernel(info: GGUFInfo, options: LoadOptions, measure: bool = True) -> Verdict | None:
    """Whether flash attention is the faster kernel for `info` on this CPU at the load's
    threads (all the cores where it sets none): the probe's verdict, measured now where
    none is kept and `measure`; None where the shape cannot be measured (or is not yet)."""
    from localinfer.backends.engine.threads import physical_cores
    from localinfer.backends.native.attention_probe import cached, verdict

    shape = attention_shape(info)
    if shape is None:
        return None
    threads = options.n_threads or physical_cores()
    return verdict(shape, threads) if measure else cached(shape, threads)


def rollback_snapshots(info: GGUFInfo, options: LoadOptions) -> int:
    """Copies of each slot's recurrent state llama.cpp keeps for a load (n_rs_seq): one per
    guess where a hybrid model speculates (the backend's `rollback`), else none."""
    return options.guesses if info.shape().hybrid else 0


def checkpoints_of(options: LoadOptions | Settings) -> dict[str, int | None]:
    """The context checkpoints a slot keeps at most, and their bytes, as the planner takes
    them (it counts them only for a model with recurrent layers)."""
    mib = options.ctx_checkpoint_mib
    return {"checkpoints": options.ctx_checkpoints,
            "checkpoint_cap": None if mib is None else mib << 20}


def with_workers(hw: Hardware | None, workers: Sequence[str], key: str | None
                 ) -> Hardware | None:
    """The machine with its RPC workers' devices (probed now, with timeouts: a worker that is
    down, busy or of another llama.cpp is an error naming it), numbered after the GPUs
    llama.cpp has here."""
    if hw is None or not workers:
        return hw
    from localinfer.backends.rpc.library import identity
    from localinfer.backends.rpc.workers import check_usable, probe

    ours = identity()
    remote = []
    for endpoint in workers:
        info = probe(endpoint, key)
        if info.busy and info.busy_head == HEAD:
            log.info("worker %s holds another model of ours: planned without it", endpoint)
            continue
        check_usable(info, *ours)
        for device in info.devices:
            remote.append(GPU(vendor="rpc", index=local_gpu_count(hw) + len(remote),
                              name=f"{endpoint}/{device.name}", total_bytes=device.total_bytes,
                              free_bytes=device.free_bytes, backend="rpc",
                              driver=device.description))
    return dataclasses.replace(hw, remote=tuple(remote))


def local_gpu_count(hw: Hardware) -> int:
    """The GPUs llama.cpp numbers on this machine."""
    if hw.devices:
        return gpu_count(hw.devices)
    return len(hw.gpus) if hw.gpu_offload else 0


def replicate(prepared: Prepared, hardware: Hardware | None, copies: int) -> Prepared:
    """Up to `copies` copies of a model planned whole onto one GPU: the first as planned,
    each other on another GPU with room for all of it (the most free first). A model split
    over GPUs, or partly in RAM, stays one copy."""
    options = prepared.options
    whole = (options.split_mode == "none" and len(prepared.gpu_use) == 1
             and options.n_gpu_layers == prepared.info.n_layer + 1 and not options.cpu_experts)
    if copies < 2 or hardware is None or not whole:
        return prepared
    need = prepared.gpu_use[options.main_gpu]
    room = sorted((g for g in hardware.usable_gpus if g.backend != "rpc"
                   and g.index != options.main_gpu and free_memory(g) >= need),
                  key=free_memory, reverse=True)[:copies - 1]
    if not room:
        return prepared
    return dataclasses.replace(
        prepared, ram_bytes=prepared.ram_bytes * (1 + len(room)),
        gpu_use={**prepared.gpu_use, **{g.index: need for g in room}},
        copies=tuple(dataclasses.replace(options, main_gpu=g.index) for g in room))


def placed(options: LoadOptions, chosen: Plan | None) -> LoadOptions:
    """The options with the plan's placement: its GPU layers, and on one GPU that GPU alone;
    on several, their shares (split by layer or by row, as the options say)."""
    if chosen is None:
        return dataclasses.replace(options, n_gpu_layers=0, split_mode="none", main_gpu=0,
                                   tensor_split=(), cpu_experts=())
    several = chosen.split_mode != "none"
    return dataclasses.replace(options, n_gpu_layers=chosen.n_gpu_layers,
                               main_gpu=chosen.main_gpu, tensor_split=chosen.tensor_split,
                               split_mode=options.split_mode if several else "none",
                               cpu_experts=chosen.cpu_experts)


def draft_memory(info: GGUFInfo, n_ctx: int, options: LoadOptions) -> MemoryEstimate:
    """A draft model's memory: its weights, an f16 KV cache for one stream (for the whole pool
    with --kv-unified; a sliding window's full size: draft.py) and its compute buffer, as the
    backend creates it."""
    n_streams = options.n_slots if options.kv_unified else 1
    return estimate_memory(info, n_ctx, n_streams, options.n_batch, n_outputs=1, swa_full=True)


def less_gpu_memory(hw: Hardware | None, taken: int | Mapping[int, int]) -> Hardware | None:
    """The machine as the model's plan sees it once `taken` bytes are in use: of each GPU
    (a number), or of the GPU of each index (a mapping)."""
    if hw is None or not taken:
        return hw
    use = taken if isinstance(taken, Mapping) else {g.index: taken for g in hw.gpus}
    gpus = tuple(dataclasses.replace(g, free_bytes=max(0, free_memory(g) - use.get(g.index, 0)))
                 for g in hw.gpus)
    return dataclasses.replace(hw, gpus=gpus)


def less_memory(hw: Hardware, taken: int) -> Hardware:
    """The machine once something loaded beside the model takes `taken` bytes: of each GPU
    (where it goes with the model's layers), or of the RAM on a machine without one."""
    if not taken:
        return hw
    if hw.usable_gpus:
        return less_gpu_memory(hw, taken)
    return dataclasses.replace(hw, ram_available_bytes=max(0, hw.ram_available_bytes - taken))


def projector_bytes(repo: str, projector: RemoteFile | None) -> int:
    """What a hub projector will hold once loaded (its header read remotely; 0 for none)."""
    return projector_memory(remote_projector(repo, projector)) if projector else 0


def plan_for(info: GGUFInfo, hw: Hardware, n_ctx: int, n_slots: int = 1,
             kv_type: str = "f16", n_outputs: int = DEFAULT_OUTPUTS, snapshots: int = 0,
             swa_full: bool = False, flash_attn: bool = True, **checkpoints: int) -> Plan:
    """The planner's plan for this one file on this machine; raises WontFit. checkpoints:
    `checkpoints_of` the options (none: the model keeps none); flash_attn: False where the
    user turned it off (a GPU's default is on)."""
    gpus = list(hw.usable_gpus)
    return plan(info.shape(), {info.quant: info.file_size}, gpus, hw.ram_available_bytes,
                n_ctx=n_ctx, n_slots=n_slots, kv_type=kv_type, n_outputs=n_outputs,
                snapshots=snapshots, swa_full=swa_full, flash_attn=flash_attn, **checkpoints)


def gpu_plan(info: GGUFInfo, n_ctx: int, n_slots: int, hw: Hardware | None,
             kv_type: str = "f16", n_outputs: int = DEFAULT_OUTPUTS, snapshots: int = 0,
             swa_full: bool = False, flash_attn: bool = True, **checkpoints: int
             ) -> Plan | None:
    """The planner's GPU plan for this file on this machine; None: it runs on the CPU (no GPU,
    a CPU-only build, or no layer fits)."""
    if hw is None or not hw.usable_gpus:
        return None
    try:
        chosen = plan_for(info, hw, n_ctx, n_slots, kv_type, n_outputs, snapshots, swa_full,
                          flash_attn, **checkpoints)
    except WontFit:
        return None  # the RAM check that follows says what to do
    log.info("plan for %s: %s", info.name, chosen.reason)
    return chosen if chosen.n_gpu_layers else None


def load_model(
    ref: str | None,
    options: LoadOptions,
    settings: Settings | None = None,
    available_memory: Callable[[], int] = ram_available,
    backend_factory: BackendFactory = runner_backend,
    writes_text: bool = False,
) -> Backend:
    """writes_text: for a chat or a completion (`run`): a model that does not write text is
    refused before it loads (check_writes_text)."""
    warm_runner(backend_factory)
    prepared = prepare(ref, options, settings, available_memory)
    if writes_text:
        check_writes_text(prepared.info, prepared.model.name)
    return backend_factory(prepared.model.path, prepared.options, prepared.model.name)


def check_writes_text(info: GGUFInfo, name: str) -> None:
    """An embedding model or a reranker writes no text (a BERT one has no output layer, and
    llama.cpp aborts a reranker's runner asked to): `run` and the chat app refuse it before
    it loads, in one line that says where its requests go, as the API does with a 400
    (api/core.check_completes)."""
    if info.rerank:
        raise InvalidRequest(f"{name} is a reranker: it scores documents against a query and "
                             f"does not chat — serve it (localinfer serve) and send its "
                             f"requests to /v1/rerank")
    if info.embedding:
        raise InvalidRequest(f"{name} is an embedding model: it turns text into vectors and "
                             f"does not chat — serve it (localinfer serve) and send its "
                             f"requests to /v1/embeddings or /api/embed")


def plan_remote(ref: HubRef, files: Sequence[RemoteFile], hardware: Hardware,
                n_ctx: int = 8192, n_slots: int = 1, info: GGUFInfo | None = None,
                **also: int) -> tuple[GGUFInfo, Plan]:
    """A hub model's plan before it is pulled: the header of one file read remotely (unless
    given), each quant's size from the listing (only the quant the name asks for, if it
    asks); raises WontFit. also: the planner's other settings (the context checkpoints,
    n_outputs)."""
    info = info or remote_info(ref.repo, min(files, key=lambda f: f.size))
    sizes = {f.quant: f.size for f in files if f.quant and ref.quant in (None, f.quant)}
    if not sizes:
        raise ModelNotFound(f"{ref.repo} (no file names {ref.quant or 'a quant'})")
    return info, plan(info.shape(), sizes, list(hardware.usable_gpus),
                      hardware.ram_available_bytes, n_ctx=n_ctx, n_slots=n_slots, **also)


def choose_quant(ref: HubRef, files: Sequence[RemoteFile], n_ctx: int = 8192,
                 hardware: Hardware | None = None, projector: RemoteFile | None = None,
                 **checkpoints: int) -> str:
    """The planner's pick for this machine, from the header of one file read remotely; with
    room kept for the vision projector that comes with it (and the context checkpoints)."""
    try:
        _, chosen = plan_remote(ref, files, less_memory(hardware or detect(), projector_bytes(
            ref.repo, projector)), n_ctx, **checkpoints)
    except WontFit as exc:
        raise ContextTooLarge(f"{ref.installed_name}: {exc}") from None
    log.info("plan for %s: %s", ref.installed_name, chosen.reason)
    return chosen.quant


def pull_model(ref: str, settings: Settings | None = None,
               progress: Progress | None = None, allow_paths: bool = True
               ) -> Manifest | ResolvedModel:
    """Download a hub model; an embedded one is only located (assembled if need be).
    allow_paths: False where the name comes from a client, who may not probe for files."""
    settings = settings or Settings()
    if is_embedded(ref):
        return resolve(ref, settings.models_dir, allow_paths=False)
    hub_ref = parse_hub_ref(ref)
    if hub_ref is None:
        try:
            resolve(ref, settings.models_dir, allow_paths)  # a path, or "not found"
        except ModelNotFound as missing:
            if missing.suggestions:
                raise
            # (not the installed names, which `run` lists: they are what it need not pull)
            families = ", ".join(sorted({n.split(":")[0] for n in catalog_names()}))
            raise ModelNotFound(ref, hint=f"the catalog has {families}; any GGUF repo on the "
                                          f"hub pulls as hf.co/OWNER/REPO[:QUANT]") from None
        raise InvalidRequest(f"'{ref}' is a local file — nothing to pull")
    def choose(ref: HubRef, files: Sequence[RemoteFile], projector: RemoteFile | None
               ) -> str:  # for the GPUs chosen
        return choose_quant(ref, files, hardware=with_workers(
            select_gpus(detect(), settings.gpus), settings.workers, settings.worker_key),
            projector=projector, **checkpoints_of(settings))

    return pulled.pull(hub_ref, settings.models_dir, choose, progress)


def describe(model: str | None, settings: Settings, *, ctx: int | None = None, parallel: int = 1,
             gpu: Sequence[str] = (), ram: str | None = None) -> tuple[dict, bool]:
    """What `show` says of a model — its header's facts, its architecture's parts and what each
    costs, and the plan — for this machine, or for the GPUs and RAM named (what-if); a hub
    model not pulled is planned from the hub's listing. Returns (the facts, as `show --json`
    prints them; whether the model is on the hub, not pulled)."""
    from localinfer.model_store.catalog import parse_hub_ref
    from localinfer.model_store.fit import projector_memory
    from localinfer.model_store.hardware import parse_size, what_if
    from localinfer.model_store.hub import list_repo, pick_projector

    machine = with_workers(select_gpus(detect(), settings.gpus), settings.workers,
                           settings.worker_key)
    if gpu or ram:  # the same planner, on the hardware named
        machine = what_if(machine, [parse_size(g) for g in gpu] if gpu else
                          [g.total_bytes for g in machine.usable_gpus],
                          parse_size(ram) if ram else None)
    name = model or settings.default_model
    try:
        resolved = resolve(name, settings.models_dir)
        info, remote = read_gguf_info(resolved.path), None
        path = str(resolved.path)
        projector = resolved.projector and read_projector_info(resolved.projector)
    except ModelNotInstalled:  # a hub model not pulled: planned from the hub's listing
        remote = parse_hub_ref(name)
        if remote is None:
            raise
        files, projectors = list_repo(remote.repo)
        if not files:
            raise LocalinferError(f"'{remote.repo}' holds no GGUF model") from None
        info = remote_info(remote.repo, min(files, key=lambda f: f.size))
        path = f"{remote.repo} on the hub (not pulled)"
        projector = pick_projector(projectors, min(files, key=lambda f: f.size))
        projector = projector and remote_projector(remote.repo, projector)
    # a vision model's projector loads beside it, where its layers go: planned with it
    vision_bytes = projector_memory(projector) if projector else 0
    machine = less_memory(machine, vision_bytes)
    try:
        n_ctx = ctx or default_context(info, settings)
        beyond = beyond_training(info, n_ctx, remote.installed_name if remote else resolved.name)
        if beyond:  # planned as `run` would load it: not at all
            raise WontFit(beyond)
        held = checkpoints_of(settings)
        # as the load plans: the rows of logits a step asks for (a slot's, or a lone stream's
        # guesses), and a GPU's attention scores where the settings turn flash attention off
        load = LoadOptions.from_settings(settings, n_slots=parallel)
        also = dict(n_outputs=load.n_outputs, flash_attn=load.flash_attn is not False, **held)
        chosen = (plan_remote(remote, files, machine, n_ctx, parallel, info, **also)[1]
                  if remote else plan_for(info, machine, n_ctx=n_ctx, n_slots=parallel, **also))
        plan_dict = {"device": chosen.device, "n_gpu_layers": chosen.n_gpu_layers,
                     "n_ctx": chosen.n_ctx, "n_slots": chosen.n_slots,
                     "memory_bytes": chosen.memory_bytes, "gpu_bytes": chosen.gpu_bytes,
                     "memory": chosen.parts, "reason": chosen.reason,
                     "placement": [{**dataclasses.asdict(p), "total": p.total}
                                   for p in chosen.placement],
                     "split_mode": (chosen.split_mode if chosen.split_mode == "none"
                                    else str(settings.split_mode)),
                     "main_gpu": chosen.main_gpu, "tensor_split": chosen.tensor_split,
                     "cpu_experts": chosen.cpu_experts, "what_if": bool(gpu or ram)}
    except WontFit as exc:
        plan_dict = {"device": None, "reason": str(exc), "what_if": bool(gpu or ram)}
    if plan_dict["device"] == "cpu" and not gpu and load.flash_attn is None:
        # what this CPU's attention kernels measured for the model's shape (a load measures
        # them; show only says what was kept)
        found = cpu_kernel(info, load, measure=False)
        plan_dict["attention"] = (
            found.says() if found else "flash attention on or off: measured at the first "
            "load on this CPU" if attention_shape(info) else None)
    facts = {"name": remote.installed_name if remote else resolved.name, "path": path,
             "architecture": info.architecture,
             "quant": chosen.quant if remote and plan_dict["device"] else info.quant,
             "file_size": ({f.quant: f.size for f in files}[chosen.quant]
                           if remote and plan_dict["device"] else info.file_size),
             "n_layer": info.n_layer, "n_head": info.n_head, "n_head_kv": info.n_head_kv,
             "context_length": info.n_ctx_train, "n_vocab": info.n_vocab,
             "kv_bytes_per_token": int(info.kv_bytes_per_token()),
             **_shape_facts(info),
             "chat_template": info.chat_template is not None, "plan": plan_dict,
             "projector": projector and {
                 "file": projector.path.name, "type": projector.projector_type,
                 "quant": projector.quant, "file_size": projector.file_size,
                 "memory_bytes": vision_bytes}}
    return facts, remote is not None


def _shape_facts(info: GGUFInfo) -> dict:
    """What `show` says of a model's architecture: its kinds of layer, what a slot's
    recurrent state and the experts weigh."""
    shape = info.shape()
    windows = sorted({layer.window for layer in shape.per_layer() if layer.window})
    return {"kinds": shape.describe(),
            "layers": {"attention": shape.n_attention, "sliding_window": shape.n_swa,
                       "window": windows[0] if windows else None,
                       "recurrent": shape.n_recurrent,
                       "recurrent_kind": shape.recurrent_kind if shape.n_recurrent else None},
            "recurrent_state_bytes_per_slot": shape.state_bytes(1),
            "experts": {"count": shape.n_expert, "used": shape.n_expert_used,
                        "bytes": sum(shape.expert_bytes(info.file_size))}
            if shape.n_expert else None}


def kv_cache_bytes(info: GGUFInfo, options: LoadOptions) -> int:
    """The KV cache (and recurrent state) a loaded model holds, by the planner's arithmetic:
    the chat app's KV figure."""
    return estimate_memory(info, options.n_ctx, options.n_slots, kv_type=options.kv_type,
                           swa_full=options.swa_full).kv_cache


def hardware_report() -> tuple[Hardware, dict]:
    """`localinfer hw`: what the probes found (GPUs, CPU, memory, llama.cpp's devices and
    backend libraries), and whether RPC workers can run here."""
    from localinfer.backends.rpc.library import status

    return detect(), status()
