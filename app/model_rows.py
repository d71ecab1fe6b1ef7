"""The model picker's rows, for the chat app and the web app alike: installed models with
the planner's fit badge, then catalog models with an estimate from their size tag."""

from __future__ import annotations

from dataclasses import dataclass

from localinfer.errors import LocalinferError
from localinfer.model_store.hardware import Hardware
from localinfer.settings import Settings

__all__ = ["ModelRow", "local_rows"]


@dataclass(frozen=True)
class ModelRow:
    """A line of the model picker."""

    name: str
    installed: bool
    quant: str = ""
    size_bytes: int | None = None
    fit: str = "?"  # "GPU", "partial", "CPU", "won't fit" ("~" in front: an estimate)
    detail: str = ""
    embedded: bool = False  # ships with localinfer: cannot be deleted


def _fit_of_file(path, hw: Hardware, n_ctx: int, settings: Settings
                 ) -> tuple[str, str, str, int]:
    """(badge, reason, quant, size) for a GGUF on disk, by the planner."""
    from localinfer.model_store.gguf_info import read_gguf_info
    from localinfer.model_store.planner import WontFit
    from localinfer.service import checkpoints_of, plan_for

    info = read_gguf_info(path)
    try:
        chosen = plan_for(info, hw, n_ctx, **checkpoints_of(settings))
    except WontFit as exc:
        return "won't fit", str(exc), info.quant, info.file_size
    if chosen.device == "cpu":
        badge = "CPU"
    elif chosen.n_gpu_layers > info.n_layer:
        badge = "GPU"
    else:
        badge = "partial"
    return badge, chosen.reason, info.quant, info.file_size


def local_rows(settings: Settings, hw: Hardware, n_ctx: int) -> list[ModelRow]:
    """Installed models with the planner's badge, then catalog models with an estimate."""
    from localinfer.model_store.catalog import catalog_names
    from localinfer.model_store.hardware import select_gpus
    from localinfer.model_store.planner import params_from_tag, rough_device
    from localinfer.model_store.sources import installed_models

    hw = select_gpus(hw, settings.gpus)  # the GPUs the user chose (--gpus)
    rows = []
    for model in installed_models(settings.models_dir):
        name, path, embedded = model.name, model.path, model.embedded
        if path is None:  # an embedded package not unpacked yet
            rows.append(ModelRow(name, True, detail="unpacked on first use", embedded=embedded))
            continue
        try:
            badge, reason, quant, size = _fit_of_file(path, hw, n_ctx, settings)
        except LocalinferError as exc:
            badge, reason, quant, size = "?", str(exc), "", path.stat().st_size
        rows.append(ModelRow(name, True, quant, size, badge, reason, embedded))
    gpus = list(hw.usable_gpus)
    labels = {"gpu": "~GPU", "partial": "~partial", "cpu": "~CPU", None: "~won't fit"}
    taken = {r.name for r in rows}
    for name in catalog_names():
        if ":" not in name or name in taken:
            continue
        n_params = params_from_tag(name.split(":", 1)[1])
        if n_params is None:
            rows.append(ModelRow(name, False, detail="size unknown until pulled"))
            continue
        where = rough_device(n_params, gpus, hw.ram_available_bytes)
        rows.append(ModelRow(name, False, "Q4_K_M?", None, labels[where],
                             "an estimate from the size tag; the plan is made from the file "
                             "when pulled"))
    return rows
