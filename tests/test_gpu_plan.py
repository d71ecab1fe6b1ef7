"""The planner's GPU layers and the RAM check reach the load options (hardware injected: no
GPU here), a draft model's memory counted."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import re
import subprocess
import sys

import llama_cpp
import pytest

from localinfer.backends.base import LoadOptions
from localinfer.errors import ContextTooLarge, InvalidRequest
from localinfer.model_store.hardware import CPU, GPU, Hardware
from localinfer.model_store.fit import estimate_memory
from localinfer.model_store.planner import attention_scores
from localinfer import service
from localinfer.backends.native.attention_probe import AttentionShape, Verdict
from localinfer.service import attention_shape, prepare
from localinfer.settings import Settings

CPU_X86 = CPU("AMD Ryzen 9 7950X", 16, 32, ("avx", "avx2", "avx512f", "fma", "f16c"))


def machine(free_mib: int, offload: bool = True) -> Hardware:
    gpu = GPU("nvidia", 0, "NVIDIA GeForce RTX 4090", 24564 * 2**20, free_mib * 2**20, "cuda",
              "550.54.14")
    return Hardware(CPU_X86, 64 * 2**30, 60 * 2**30, (gpu,), offload)


def _layers(hw: Hardware | None, **options) -> int:
    prepared = prepare("smollm2:135m", LoadOptions(**{"n_ctx": 2048, **options}), Settings(),
                       hardware=lambda: hw)
    return prepared.options.n_gpu_layers, prepared.info.n_layer


def test_a_roomy_gpu_takes_every_layer():
    layers, n_layer = _layers(machine(23000))
    assert layers == n_layer + 1  # the output layer too


def test_a_nearly_full_gpu_takes_some_layers():
    layers, n_layer = _layers(machine(750))  # 608 MiB of it go to CUDA's own runtime
    assert 0 < layers < n_layer


def test_no_gpu_or_a_cpu_build_or_an_explicit_choice():
    assert _layers(None)[0] == 0
    assert _layers(machine(23000, offload=False))[0] == 0
    assert _layers(machine(23000), n_gpu_layers=5)[0] == 5


def test_a_gpu_plan_without_flash_attention_counts_the_attention_scores():
    """--no-flash-attn on a GPU: its compute buffer holds a layer's attention scores (smollm2
    at 8,192 tokens: 144 MiB more), so a card that holds all of the model with flash
    attention, llama.cpp's default there, takes fewer layers without it."""
    from localinfer.service import plan_for

    info = prepare("smollm2:135m", LoadOptions(n_ctx=2048, n_gpu_layers=0), Settings()).info
    on = plan_for(info, machine(23000), 8192)
    off = plan_for(info, machine(23000), 8192, flash_attn=False)
    scores = attention_scores(info.shape(), 8192)
    assert scores == 512 * 8192 * 9 * 4
    assert off.parts["compute"] - on.parts["compute"] == scores
    assert off.gpu_bytes > on.gpu_bytes + scores
    tight = machine((on.gpu_bytes + scores // 2) // 2**20)
    assert _layers(tight, n_ctx=8192)[0] == info.n_layer + 1
    assert 0 < _layers(tight, n_ctx=8192, flash_attn=False)[0] < info.n_layer


def test_show_plans_a_gpu_as_the_settings_load_it():
    """`show` plans what the load would: with flash attention off in the settings, a GPU's
    compute buffer holds the attention scores."""
    import os

    def compute(**env: str) -> int:
        shown = subprocess.run([sys.executable, "-m", "localinfer", "show", "smollm2:135m",
                                "--gpu", "24GiB", "--ctx", "8192", "--json"],
                               capture_output=True, text=True, timeout=60,
                               env={**os.environ, **env})
        assert shown.returncode == 0, shown.stderr
        return json.loads(shown.stdout)["plan"]["memory"]["compute"]

    info = prepare("smollm2:135m", LoadOptions(n_ctx=2048, n_gpu_layers=0), Settings()).info
    assert (compute(LOCALINFER_FLASH_ATTN="false") - compute()
            == attention_scores(info.shape(), 8192))


def test_a_draft_model_takes_its_share_of_the_gpu_first():
    alone, n_layer = _layers(machine(900))
    with_draft, _ = _layers(machine(900), draft_model="smollm2:135m")
    assert alone == n_layer + 1
    assert 0 < with_draft < n_layer  # the draft goes whole onto the GPU: fewer layers are left


def test_a_draft_models_output_buffer_is_host_memory_beside_its_layers_on_the_gpu():
    """Its layers, KV and compute buffer go on the main GPU; llama.cpp's output buffer (a
    row of logits) is host memory wherever the layers are."""
    from localinfer.service import draft_memory

    def prepared(**options):
        # (9 slots: the model's own output rows, one a slot, as many as its 1 + 8 guesses)
        return prepare("smollm2:135m", LoadOptions(n_ctx=2048, n_slots=9, **options),
                       Settings(), hardware=lambda: machine(23000))

    alone, drafting = prepared(), prepared(draft_model="smollm2:135m")
    assert alone.options.n_outputs == drafting.options.n_outputs
    draft = draft_memory(alone.info, 2048, drafting.options)
    assert draft.outputs == alone.info.n_vocab * 4  # one row: it guesses for one stream
    assert drafting.gpu_use[0] - alone.gpu_use[0] == draft.ram - draft.outputs
    assert drafting.ram_bytes - alone.ram_bytes == draft.outputs


def test_a_draft_model_counts_in_the_ram_check():
    info = prepare("smollm2:135m", LoadOptions(n_ctx=2048, n_gpu_layers=0), Settings()).info
    model = estimate_memory(info, 2048).total
    room = lambda: int(model * 1.9)  # noqa: E731  the model fits; with its draft, a smaller context
    options = LoadOptions(n_ctx=2048, n_gpu_layers=0)
    prepare("smollm2:135m", options, Settings(), available_memory=room)
    with pytest.raises(ContextTooLarge, match="GiB for the draft model — use --ctx"):
        prepare("smollm2:135m", dataclasses.replace(options, draft_model="smollm2:135m"),
                Settings(), available_memory=room)


# the probe's verdicts as measured (attention_probe.measure, smollm2's shape, 2 threads):
# on a 2-core EPYC; a Xeon's, shaped as that Xeon's deep decode (2x as slow with it); a
# probe that failed
EPYC = Verdict(True, 57.844, 60.641, {"on": [22.752, 85.703], "off": [37.97, 105.917]},
               {"on": [0.2613, 0.6991], "off": [0.2465, 0.5244]})
XEON = Verdict(False, 121.4, 58.2, {"on": [25.1, 90.3], "off": [36.8, 104.2]},
               {"on": [0.52, 1.61], "off": [0.26, 0.52]})
FAILED = Verdict(None, error="the probe ended with killed by SIGABRT: GGML_ASSERT failed")


@pytest.mark.parametrize("measured, expected", [(XEON, False), (FAILED, False), (EPYC, None)])
def test_a_model_wholly_on_the_cpu_runs_with_the_attention_kernel_measured_faster(
        monkeypatch, measured, expected):
    """llama.cpp's CPU flash attention decodes deep in a context at half the speed on some
    CPUs and is the faster kernel on others (service.cpu_attention): a model all in RAM
    loads with the one the probe measured faster for its shape (None: llama.cpp's own
    choice, on), without it where the probe failed, its compute buffer then counted with
    one layer's attention scores. The user's choice, a quantised KV cache (which needs it)
    and a GPU's layers keep theirs, unasked; where the scores would not fit beside the
    rest, it stays on."""
    asked = []
    monkeypatch.setattr(service, "cpu_kernel", lambda info, options: asked.append(
        (attention_shape(info), options.n_threads)) or measured)

    def flash(hw, **options):
        room = options.pop("room", None)
        kw = {"available_memory": lambda: room} if room else {}
        return prepare("smollm2:135m", LoadOptions(n_ctx=2048, **options), Settings(),
                       hardware=lambda: hw, **kw).options.flash_attn

    assert flash(None) is expected
    assert asked == [(AttentionShape(9, 3, 64), None)]
    assert flash(machine(23000, offload=False)) is expected  # a CPU-only build
    assert flash(machine(23000), n_gpu_layers=0, n_threads=1) is expected
    assert asked[-1] == (AttentionShape(9, 3, 64), 1)
    asked.clear()
    assert flash(None, flash_attn=True) is True
    assert flash(None, flash_attn=False) is False
    assert flash(None, kv_type="q8_0") is None
    assert flash(machine(23000)) is None  # on the GPU
    assert asked == []  # none of them asks the probe
    info = prepare("smollm2:135m", LoadOptions(n_ctx=2048, n_gpu_layers=0), Settings()).info
    with_it, without = estimate_memory(info, 2048), estimate_memory(info, 2048, flash_attn=False)
    assert (without.compute - with_it.compute == attention_scores(info.shape(), 2048)
            == 512 * 2048 * 9 * 4)  # micro-batch × cells × query heads × f32
    with_it, without = with_it.ram, without.ram
    assert flash(None, room=(with_it + without) // 2) is None
    assert flash(None, room=without) is expected


def test_bench_runs_on_the_device_the_planner_picks(smollm2_path):
    from localinfer.bench import planned_device

    layers, device = planned_device(smollm2_path, 2048, 8, hw=machine(23000))
    assert layers == 31 and device == "GPU NVIDIA GeForce RTX 4090, 31 of 31 layers"
    layers, device = planned_device(smollm2_path, 2048, 8, hw=machine(750))
    assert 0 < layers < 30 and device.startswith("GPU NVIDIA GeForce RTX 4090")
    assert planned_device(smollm2_path, 2048, 8, hw=machine(23000, offload=False)) == (0, "CPU")
    assert planned_device(smollm2_path, 2048, 8, 0, hw=machine(23000)) == (0, "CPU")


def two_cards(free_mib: int, other_free_mib: int | None = None) -> Hardware:
    """Two RTX 4090s as NVML reports them, with this much free on each."""
    gpus = tuple(GPU("nvidia", i, "NVIDIA GeForce RTX 4090", 24564 * 2**20, free * 2**20,
                     "cuda", "550.54.14")
                 for i, free in enumerate((free_mib, other_free_mib or free_mib)))
    return Hardware(CPU_X86, 64 * 2**30, 60 * 2**30, gpus, True)


def _placed(hw: Hardware, gpus: str | None = None) -> LoadOptions:
    settings = Settings(gpus=gpus)
    options = LoadOptions.from_settings(settings, n_ctx=2048)
    return prepare("smollm2:135m", options, settings, hardware=lambda: hw).options


def test_a_model_no_one_card_holds_is_split_over_both():
    """720 MiB free on each card (608 of them CUDA's own): smollm2 fits neither alone, so
    its layers are dealt out over both, by layer, each card's share in tensor_split."""
    options = _placed(two_cards(720))
    assert options.n_gpu_layers == 31 and options.split_mode == "layer"
    assert options.tensor_split == pytest.approx((0.5, 0.5), abs=0.05)
    roomy = _placed(two_cards(720, 23000))  # one card has room: the model goes there alone
    assert (roomy.split_mode, roomy.main_gpu, roomy.tensor_split) == ("none", 1, ())


def test_the_gpus_setting_chooses_the_cards():
    only_first = _placed(two_cards(23000, 23500), gpus="0")
    assert (only_first.main_gpu, only_first.split_mode) == (0, "none")
    assert _placed(two_cards(23000), gpus="none").n_gpu_layers == 0
    by_name = _placed(two_cards(720), gpus="NVIDIA GeForce RTX 4090")  # both cards of the name
    assert by_name.split_mode == "layer"
    with pytest.raises(InvalidRequest, match="no GPU '2'.*0 \\(NVIDIA GeForce RTX 4090\\)"):
        _placed(two_cards(23000), gpus="0,2")


def test_the_placement_reaches_llama_cpps_model_params():
    from localinfer.backends.native.model import model_params

    params, keep = model_params(31, "layer", 0, (0.25, 0.75))
    assert (params.n_gpu_layers, params.main_gpu) == (31, 0)
    assert params.split_mode == llama_cpp.LLAMA_SPLIT_MODE_LAYER
    assert [params.tensor_split[i] for i in range(3)] == [0.25, 0.75, 0.0]
    params, _ = model_params(31, "none", 1)
    assert params.split_mode == llama_cpp.LLAMA_SPLIT_MODE_NONE and params.main_gpu == 1
    assert not params.tensor_split  # NULL: llama.cpp's own default
    assert not params.tensor_buft_overrides
    # a CPU head with workers keeps the output layer: its tensors go to host memory
    params, keep = model_params(31, "layer", 0, (0.5, 0.5), output_on_cpu=True)
    first = keep[-1][0]
    assert params.tensor_buft_overrides == ctypes.addressof(keep[-1])
    assert re.match(first.pattern.decode(), "output.weight") and first.buft
    assert re.match(first.pattern.decode(), "token_embd.weight")  # tied embeddings
    assert not re.match(first.pattern.decode(), "blk.0.attn_q.weight")
    assert keep[-1][1].pattern is None  # the list's end


def test_show_plans_for_gpus_this_machine_does_not_have():
    """`show --gpu --gpu --ram`: the same planner on hardware named, each device's share."""
    result = subprocess.run([sys.executable, "-m", "localinfer", "show", "--gpu", "1GiB",
                             "--gpu", "1GiB", "--ram", "8GiB", "--ctx", "8192", "--parallel",
                             "8", "--json"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)["plan"]
    devices = [(p["index"], p["layers"]) for p in plan["placement"]]
    assert plan["what_if"] and plan["split_mode"] == "layer" and len(devices) == 3
    assert devices[0][0] == 0 and devices[1][0] == 1 and devices[2][0] is None  # then RAM
    assert sum(layers for _, layers in devices) == 31
    assert all(p["total"] <= 2**30 for p in plan["placement"][:2])
    bad = subprocess.run([sys.executable, "-m", "localinfer", "show", "--gpu", "lots"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "24GiB" in bad.stderr


def test_more_devices_than_the_build_takes_is_one_clear_error():
    from localinfer.backends.native.model import model_params
    from localinfer.errors import ModelLoadFailed

    too_many = (1.0,) * (llama_cpp.llama_max_devices() + 1)
    with pytest.raises(ModelLoadFailed, match="at most"):
        model_params(99, "layer", 0, too_many)


def test_a_vision_projector_is_counted_with_its_model(gemma3_path):
    """A projector's weights and image buffer (Gemma 3's widths at 896 px, 121 MiB of
    compute) are kept free on the GPU the layers go to, and in the RAM check."""
    from localinfer.model_store.fit import projector_memory
    from localinfer.model_store.gguf_info import read_projector_info

    from .families import projector

    mmproj = str(projector(gemma3_path, 256, "--image-size", "896", "--gemma3", "--layers", "2"))
    taken = projector_memory(read_projector_info(mmproj))

    def plan(free_mib: int, path: str | None = None, room=None):
        return prepare(str(gemma3_path), LoadOptions(n_ctx=2048, projector=path), Settings(),
                       hardware=lambda: machine(free_mib), **({"available_memory": room}
                                                               if room else {}))

    alone = plan(1100)
    n_layer = alone.info.n_layer
    assert alone.options.n_gpu_layers == n_layer + 1 and alone.options.projector is None
    seen = plan(1100, mmproj)
    assert seen.options.projector == mmproj
    assert 0 < seen.options.n_gpu_layers <= n_layer  # fewer layers: the projector's room
    roomy = plan(23000, mmproj)
    assert roomy.gpu_use[0] - plan(23000).gpu_use[0] == taken  # on the model's GPU

    cpu = LoadOptions(n_ctx=2048, n_gpu_layers=0)
    need = prepare(str(gemma3_path), cpu, Settings()).ram_bytes
    assert prepare(str(gemma3_path), dataclasses.replace(cpu, projector=mmproj),
                   Settings()).ram_bytes == need + taken
    with pytest.raises(ContextTooLarge, match=r"after 0\.\d+ GiB for the vision projector"):
        prepare(str(gemma3_path), dataclasses.replace(cpu, projector=mmproj), Settings(),
                available_memory=lambda: need + taken // 2)


def what_if_gpu(gib: int) -> Hardware:
    gpu = GPU("nvidia", 0, f"what-if GPU of {gib} GiB", gib * 2**30, gib * 2**30, "cuda")
    return Hardware(CPU_X86, 64 * 2**30, 60 * 2**30, (gpu,), True)


def test_show_places_a_moes_experts_for_a_gpu_short_of_memory():
    """A Qwen3-30B-A3B-shaped file (its header and tensor table) on a 16 GiB what-if GPU:
    attention, shared weights and the whole KV cache on the GPU, the last layers' experts
    in RAM, listed per device."""
    from .families import plan_model

    result = subprocess.run([sys.executable, "-m", "localinfer", "show",
                             str(plan_model("qwen3-30b-a3b")), "--gpu", "16GiB", "--ram",
                             "64GiB", "--ctx", "8192", "--json"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout)
    assert facts["kinds"] == ["MoE 128 experts, 8 active"]
    assert facts["experts"]["count"] == 128 and facts["experts"]["used"] == 8
    plan = facts["plan"]
    gpu, ram = plan["placement"]
    assert plan["n_gpu_layers"] == gpu["layers"] == 49 and ram["layers"] == 0
    first = len(gpu["experts"])
    assert 8 < first < 48 and gpu["experts"] == list(range(first))
    assert ram["experts"] == plan["cpu_experts"] == list(range(first, 48))
    assert gpu["kv_cache"] == plan["memory"]["kv_cache"] == 96 * 1024 * 8192
    assert gpu["total"] <= 16 * 2**30 and ram["expert_bytes"] > 4 * 2**30
    text = subprocess.run([sys.executable, "-m", "localinfer", "show",
                           str(plan_model("qwen3-30b-a3b")), "--gpu", "16GiB", "--ram", "64GiB",
                           "--ctx", "8192"], capture_output=True, text=True, timeout=120).stdout
    assert "MoE 128 experts, 8 active" in text and f"experts of layers {first}-47" in text


def test_show_places_gpt_oss_120b_on_gpus_of_8_16_and_24_gib():
    """gpt-oss-120b's shape (MXFP4 experts, 59 GiB; every other layer a window of 128) beside
    64 GiB of RAM: every layer on the GPU, the first layers' experts with it, the more the
    bigger the card, the rest in RAM; the KV cache only the full layers' per token (the
    windowed layers' a window a slot), all within each card."""
    from .families import plan_model

    on_gpu = []
    for gib in (8, 16, 24):
        result = subprocess.run([sys.executable, "-m", "localinfer", "show",
                                 str(plan_model("gpt-oss-120b")), "--gpu", f"{gib}GiB",
                                 "--ram", "64GiB", "--ctx", "8192", "--json"],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        facts = json.loads(result.stdout)
        assert facts["kinds"] == ["sliding window 128 on 18 of 36 layers",
                                  "MoE 128 experts, 4 active"]
        assert facts["quant"] == "MXFP4_MOE"
        gpu, ram = facts["plan"]["placement"]
        assert gpu["layers"] == 37 and ram["layers"] == 0
        assert gpu["experts"] == list(range(len(gpu["experts"])))
        assert ram["experts"] == facts["plan"]["cpu_experts"] == list(range(len(gpu["experts"]),
                                                                             36))
        assert gpu["total"] <= gib * 2**30 and ram["total"] <= 64 * 2**30
        # in RAM with its experts: the input embeddings, Q8_0 (0.57 GiB, where a share of the
        # parameters would say half of it: the experts beside them are 4-bit)
        assert ram["weights"] == ram["expert_bytes"] + 201088 * 2880 // 32 * 34
        full_layers = 18 * 8 * 64 * 2 * 2 * 8192  # K and V, f16, of the 18 full layers
        assert full_layers < gpu["kv_cache"] < full_layers * 1.2  # (not 2x: windows)
        on_gpu.append(len(gpu["experts"]))
    assert 0 < on_gpu[0] < on_gpu[1] < on_gpu[2] < 18, on_gpu


def test_show_says_what_a_hybrid_keeps():
    from .families import plan_model

    result = subprocess.run([sys.executable, "-m", "localinfer", "show",
                             str(plan_model("qwen3.5-9b")), "--gpu", "24GiB", "--ctx", "32768",
                             "--parallel", "2", "--json"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout)
    assert facts["kinds"] == ["hybrid: 8 attention + 24 Gated DeltaNet layers"]
    assert facts["kv_bytes_per_token"] == 32 * 1024
    memory = facts["plan"]["memory"]
    assert memory["kv_cache"] == 32 * 1024 * 32768 * 2  # 2 GiB, not 8
    assert memory["recurrent_state"] == 2 * facts["recurrent_state_bytes_per_slot"]
    # the default context checkpoints, 32 a slot within 256 MiB: 5 of ~50 MiB, in RAM
    one = facts["recurrent_state_bytes_per_slot"] + 28 + 24 * 24
    assert memory["checkpoints"] == 2 * 5 * one
    plan = facts["plan"]
    # in RAM: the checkpoints, the output buffer (a row of logits a slot) and the input
    # embeddings (Qwen3.5's are untied), on a row
    ram = [p for p in plan["placement"] if p["index"] is None]
    assert len(ram) == 1 and ram[0]["layers"] == 0 and ram[0]["weights"] > 0
    assert memory["output_buffer"] == 2 * facts["n_vocab"] * 4
    assert plan["memory_bytes"] - plan["gpu_bytes"] == (memory["checkpoints"] + ram[0]["weights"]
                                                        + memory["output_buffer"])
    text = subprocess.run([sys.executable, "-m", "localinfer", "show",
                           str(plan_model("qwen3.5-9b")), "--gpu", "24GiB", "--ctx", "32768",
                           "--parallel", "2"], capture_output=True, text=True, timeout=120)
    assert re.search(r"memory: .*recurrent state [\d.]+ MiB \+ checkpoints 502\.5 MiB \+", text.stdout)


def test_the_plans_experts_in_ram_reach_the_load_options():
    from .families import plan_model

    prepared = prepare(str(plan_model("qwen3-30b-a3b")), LoadOptions(n_ctx=8192), Settings(),
                       hardware=lambda: what_if_gpu(16))
    options = prepared.options
    assert options.n_gpu_layers == 49 and options.cpu_experts
    assert options.cpu_experts == tuple(range(options.cpu_experts[0], 48))
    assert prepared.gpu_use[0] <= 16 * 2**30
    roomy = prepare(str(plan_model("qwen3-30b-a3b")), LoadOptions(n_ctx=8192), Settings(),
                    hardware=lambda: what_if_gpu(48))
    assert roomy.options.n_gpu_layers == 49 and not roomy.options.cpu_experts


def test_experts_left_in_ram_become_llama_cpps_tensor_overrides(caplog):
    """LoadOptions.cpu_experts → a tensor_buft_overrides entry (host memory) whose pattern
    names those layers' ffn_*_exps tensors and nothing else, as the load log shows."""
    import logging

    from localinfer.backends.native.model import model_params
    from localinfer.backends.llamacpp import LlamaCppBackend

    from .families import arch_model

    params, keep = model_params(49, cpu_experts=(3, 5, 47))
    entry = keep[-1][0]
    assert params.tensor_buft_overrides == ctypes.addressof(keep[-1]) and entry.buft
    pattern = entry.pattern.decode()
    for name in ("blk.5.ffn_down_exps.weight", "blk.47.ffn_gate_exps.weight",
                 "blk.3.ffn_up_exps.weight", "blk.3.ffn_gate_up_exps.weight"):
        assert re.search(pattern, name), name
    for name in ("blk.4.ffn_down_exps.weight", "blk.15.ffn_up_exps.weight",
                 "blk.5.attn_q.weight", "blk.5.ffn_down_shexp.weight", "blk.5.ffn_gate_inp.weight"):
        assert not re.search(pattern, name), name
    assert keep[-1][1].pattern is None
    caplog.set_level(logging.DEBUG, logger="localinfer.llama_cpp")
    with LlamaCppBackend(arch_model("qwen3moe"), LoadOptions(n_ctx=512, n_gpu_layers=0,
                                                             cpu_experts=(1,))):
        pass
    moved = re.findall(r"tensor (\S+) \(.*buffer type overridden to CPU", caplog.text)
    assert sorted(moved) == ["blk.1.ffn_down_exps.weight", "blk.1.ffn_gate_exps.weight",
                             "blk.1.ffn_up_exps.weight"]
