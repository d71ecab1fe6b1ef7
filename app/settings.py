"""Every setting, in one schema: each field has one default, its bounds and a help line, and is
read from — highest first — a command-line flag (`cli.py` builds each flag from its field),
`LOCALINFER_<FIELD>` in the environment, the config file (TOML, the same names:
`<home>/config.toml`, or the file `LOCALINFER_CONFIG` names), then the default. Read when
asked for, never at import.

Only LOCALINFER_DEBUG is read on its own (`debug()`): it must work when another setting is the
error being shown.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import tomllib
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import platformdirs
from pydantic import Field, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (BaseSettings, NoDecode, PydanticBaseSettingsSource,
                               SettingsConfigDict)

from localinfer.errors import LocalinferError

__all__ = ["DEFAULT_MODEL", "ImageUrls", "KvType", "Settings", "SettingsError", "SplitMode",
           "binds_loopback", "debug", "default", "explain", "flag_help"]

DEFAULT_MODEL = "smollm2:135m"  # embedded in the package (model_store.sources.EMBEDDED)


class KvType(StrEnum):
    """The KV cache's element type: quantised K and V halve or quarter the cache (the one
    list of them: the CLI's choices, LoadOptions' check, the planner's bytes, llama.cpp's
    ggml type in llama_native)."""

    F16 = "f16"
    Q8_0 = "q8_0"
    Q4_0 = "q4_0"


class ImageUrls(StrEnum):
    """Which image URLs the server fetches for a request: none (clients send the bytes),
    those on public addresses, or any (a server that fetches URLs can be made to reach
    what it can: its own loopback, the LAN, a cloud's metadata service)."""

    OFF = "off"
    PUBLIC = "public"
    ANY = "any"


class SplitMode(StrEnum):
    """How a model spread over several GPUs is cut: whole layers to each, or rows of each."""

    LAYER = "layer"
    ROW = "row"


class SettingsError(LocalinferError):
    """A setting's value, named where it came from: flag, variable or config file."""


def binds_loopback(host: str) -> bool:
    """Whether listening on `host` (a --host) is listening on this machine alone: every
    address it resolves to is a loopback one. A name is asked of the resolver, as the bind
    will ask it (a hosts file may give a .localhost name any address)."""
    try:
        found = socket.getaddrinfo(host.strip("[]"), None, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError):
        return False
    return bool(found) and all(
        ipaddress.ip_address(address[4][0].split("%")[0]).is_loopback for address in found)


def debug() -> bool:
    """LOCALINFER_DEBUG: errors raise with their traceback instead of one line."""
    return bool(os.environ.get("LOCALINFER_DEBUG"))


def _home() -> Path:
    return Path(os.environ.get("LOCALINFER_HOME") or platformdirs.user_data_path("localinfer"))


def config_path() -> Path:
    """The config file: LOCALINFER_CONFIG, else config.toml in the home folder."""
    named = os.environ.get("LOCALINFER_CONFIG")
    return Path(named) if named else _home() / "config.toml"


def _unset(text: str) -> dict[str, Any]:
    """What a field whose default is None means, for its help line."""
    return {"json_schema_extra": {"unset": text}}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LOCALINFER_", extra="ignore")

    # -- where things are
    home: Path = Field(default_factory=_home,
                       description="Where models, chats and the config file live.")
    default_model: str = Field(DEFAULT_MODEL, description="The model used when none is named.")

    # -- each model loaded (`run`, `chat`, `app`, `serve`)
    # (LOCALINFER_DEFAULT_CTX, its old name, is still read: _OldNames)
    ctx: int = Field(4096, ge=16, description="Context tokens per chat or request (a value from the variable or "
                    "the config file stays within what the model was trained on).")
    # a base model, or a model caught in a loop, writes until the context is full: minutes
    # of junk
    max_tokens: int = Field(2048, ge=0, description="The longest reply when a client sets no "
                                                    "limit; 0: only a full context ends one.")
    # (ggml's GGML_MAX_N_THREADS; service.check_threads holds it to this machine's CPUs)
    threads: int | None = Field(None, ge=1, le=512, description="CPU threads.", **_unset(
        "the free cores, re-chosen as the load changes"))
    # on by default: two models' runners, 2 streams each on 2 cores, counting the cores alone
    # took 5.5 s to the last first token and 10.0 s to end every stream (medians); sharing,
    # 0.79 s and 7.5 s (backends/engine/threads.py, bench/results/two_models.md)
    core_share: bool = Field(True, description=(
        "Share the CPU cores with the other localinfer processes running models: a step waits "
        "for a core their running steps hold and takes only the cores they leave (off: each "
        "counts the machine's cores alone)."))
    parallel: int = Field(4, ge=1, le=64, description="Requests decoded together per model.")
    prefill_chunk: int | None = Field(None, ge=1, description=(
        "Prompt tokens per request per step: smaller keeps other streams smoother while a "
        "long prompt is read."), **_unset("512"))
    # on by default: while a 4,000-token prompt is read beside a running stream (2 cores),
    # that stream's longest pause is 0.25 s without flash attention on a Xeon, the prompt
    # read 1.13x the time of reading it alone (llama-server: 9.1 s); 0.32-0.61 s with it on
    # an EPYC (its tiles' floor), 1.5x (llama-server: 5.2 s); a GPU reads a chunk within it
    # and is never cut
    # (bench/results/long_prompt_gap.md, epyc_2core/; step_budget.DEFAULT_STEP_MS)
    step_ms: int | None = Field(None, ge=0, le=60_000, description=(
        "While streams generate, hold each step within this many milliseconds by reading "
        "a prompt in smaller pieces: the longest pause a running stream sees while another "
        "prompt is read (lower: smoother streams, slower long prompts). 0: whole chunks."),
        **_unset("250"))
    # off by default: a bound relative to a decode step, it slows a long prompt and,
    # under load, short prompts' TTFT (bench/results/engine_mixed.md)
    step_budget: float | None = Field(None, ge=0, description=(
        "While streams generate, hold each step to this many decode steps' time by reading "
        "prompts in smaller pieces, e.g. 2 (smoother streams, slower prompts)."), **_unset("off"))
    draft: int = Field(0, ge=0, le=64, description=(
        "Speculative decoding for a lone stream: up to N prompt-lookup guesses a step; the "
        "same reply, faster when it repeats. 0: off."))
    draft_model: str | None = Field(None, description=(
        "Speculative decoding for a lone stream with this small model of the same family "
        "guessing (8 tokens a step unless --draft says)."), **_unset("none"))
    kv_type: KvType = Field(KvType.F16, description="KV cache type: f16, q8_0 (half the "
                                                    "memory) or q4_0 (a quarter).")
    kv_unified: bool = Field(False, description=(
        "One KV pool for all requests: a long chat may use what idle slots leave; requests "
        "wait for free cells (off: a fixed share each)."))
    # on by default: an editor's completions resend a window over the file that moves as
    # the cursor does (bench/results/code_completion.md); a moved run's KV was computed
    # after text that is gone, so 0 reads every prompt exactly
    cache_reuse: int = Field(256, ge=0, description=(
        "Past a prompt's cached prefix, move cached runs of at least this many tokens into "
        "place instead of reading them again (an editor's file after an edit above); 0: off."))
    # llama-server's default (--ctx-checkpoints 32); a slot's checkpoints also stay within
    # ctx_checkpoint_mib (a Qwen3.5-9B's recurrent state is ~50 MiB), in RAM, as planned
    ctx_checkpoints: int = Field(32, ge=0, le=1024, description=(
        "Context checkpoints per slot of a hybrid, recurrent or sliding-window model: its "
        "state saved near each prompt's end, so a next turn that rewrites the last reply "
        "reads only the rest; 0: off."))
    ctx_checkpoint_mib: int | None = Field(None, ge=1, le=1 << 20, description=(
        "MiB of context checkpoints a slot keeps at most, in RAM (the oldest go first); the "
        "memory plan counts them."), **_unset(
        "256, or room for two where one is larger: a large sliding-window model's"))
    # llama-server's default (--cache-ram 8192): an agent's subagents, or more chats than
    # slots, each find their conversation where they left it (engine/prompt_cache.py)
    cache_ram: int = Field(8192, ge=0, le=1 << 24, description=(
        "MiB of RAM for prompts saved when their slot takes another request, put back when "
        "a prompt comes back so only what is new is read (never leaving under 1 GiB free); "
        "0: off."))
    # llama-server's default (off): Gemma 3 at 8,192 tokens keeps 39 MiB of KV, not 144;
    # a prompt that leaves the cached one further back than the window then goes back to a
    # context checkpoint, or is read again
    swa_full: bool = Field(False, description=(
        "Keep every cell of a sliding-window model's windowed layers (Gemma 3, gpt-oss), so "
        "a cached prefix is kept however a prompt ends, and the context can shift; off: "
        "only their window, far less memory."))
    # on a CPU, measured: llama.cpp's CPU kernel decodes deep in a context at half the speed
    # on some CPUs and is the faster one on others (service.cpu_attention, attention_probe)
    flash_attn: bool | None = Field(None, description=(
        "Force flash attention on (long prompts with short replies read faster on a CPU) or "
        "off."), **_unset("where the model runs on the CPU alone, with an f16 KV cache, the "
                          "kernel measured faster on this CPU for its attention (once, at "
                          "its first load), off only where its attention scores have room; "
                          "llama.cpp's choice elsewhere"))
    gpus: str | None = Field(None, description=(
        "GPUs to use: indexes or names as `localinfer hw` shows them, comma-separated "
        "(0,2), or none for the CPU alone."), **_unset("all"))
    split_mode: SplitMode = Field(SplitMode.LAYER, description=(
        "A model spread over several GPUs: whole layers on each (layer), or each layer's "
        "rows split across them (row: tensor parallel, for fast links between the cards)."))
    replicas: int = Field(1, ge=1, le=16, description=(
        "Copies of a model that fits one GPU whole: one on each GPU with room for it, "
        "requests spread over them (more users at once). 1: one copy."))
    # comma-separated in the environment: LOCALINFER_WORKERS=10.0.0.5:50052,10.0.0.6:50052
    workers: Annotated[list[str], NoDecode] = Field(default_factory=list, description=(
        "RPC workers (`localinfer worker` on other machines) whose devices take a share of "
        "each model: host:port, comma-separated."))
    # a secret: no flag (a command line is visible to every user of the machine)
    worker_key: str | None = Field(None, min_length=8, description=(
        "The key a worker requires and a head sends (set it on both; needed for a worker "
        "listening beyond loopback)."), **_unset("none"))
    # a runner with work that makes no progress this long is killed (one prompt chunk of a
    # big model on a slow CPU can take a while); one that takes longer to load, too
    runner_timeout: float = Field(120.0, gt=0, description=(
        "Seconds a runner with work may go without progress before it is stopped."))
    load_timeout: float = Field(300.0, gt=0, description="Seconds a runner may take to load "
                                                         "a model.")

    # -- the server (`serve`; `ps`, `stop` and `chat --url` find it by these)
    model: str | None = Field(None, description="Load this model at startup (others load on "
                                                "first request).", **_unset("none"))
    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(11435, ge=0, le=65535, description="Port.")
    api_key: str | None = Field(None, description=(
        "Require this Bearer token (needed to listen beyond loopback)."), **_unset("none"))
    # comma-separated in the environment: LOCALINFER_ALLOWED_ORIGINS=http://a.example,http://b
    allowed_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Allow browser pages from this origin (CORS; "
                                          "repeatable).")
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Answer to this Host name besides loopback ones "
                                          "(repeatable, * for any).")
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="The largest request "
                                                                      "body.")
    image_urls: ImageUrls = Field(ImageUrls.OFF, description=(
        "Image URLs in requests: off (send the bytes), public (fetched from public addresses "
        "only) or any (the LAN and this machine too: only where every client is trusted)."))
    header_timeout: float = Field(10.0, gt=0, description="Seconds a client has to send a "
                                                          "request's headers.")
    body_timeout: float = Field(60.0, gt=0, description="Seconds a client has to send a "
                                                        "request's body after its headers.")
    keep_alive: str = Field("5m", description="How long an idle model stays loaded, e.g. 5m, "
                                              "1h, -1 for ever.")
    max_loaded_models: int = Field(3, ge=1, description="Models loaded at once.")

    @property
    def models_dir(self) -> Path:
        return self.home / "models"

    @field_validator("allowed_origins", "allowed_hosts", "workers", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings,
                                   dotenv_settings, file_secret_settings):
        return init_settings, env_settings, _OldNames(settings_cls), _ConfigFile(settings_cls)

    @classmethod
    def read(cls, flags: dict[str, Any] | None = None) -> Settings:
        """The settings with these command-line values on top (None: not given); a bad value
        is a SettingsError naming its flag, variable or config file line."""
        given = {k: v for k, v in (flags or {}).items() if v is not None}
        try:
            return cls(**given)
        except ValidationError as exc:
            raise explain(exc, given) from None


class _OldNames(PydanticBaseSettingsSource):
    """Variables renamed since a release: read below their new names."""

    OLD = {"LOCALINFER_DEFAULT_CTX": "ctx"}

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return {new: os.environ[old] for old, new in self.OLD.items() if old in os.environ}


class _ConfigFile(PydanticBaseSettingsSource):
    """The TOML config file, if there is one: a table of the schema's own field names."""

    def __init__(self, settings_cls: type[BaseSettings]):
        super().__init__(settings_cls)
        self.values = _read_config(config_path())

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self.values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self.values)


def _read_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        if os.environ.get("LOCALINFER_CONFIG"):
            raise SettingsError(f"LOCALINFER_CONFIG names {str(path)!r}, which is not a file — "
                                f"fix or unset that variable")
        return {}
    if path.stat().st_size > 1 << 20:
        raise SettingsError(f"{path} is over 1 MiB: not a config file — move it away")
    try:
        values = tomllib.loads(path.read_text("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SettingsError(f"{path} is not TOML ({exc}) — fix the file") from None
    fields = set(Settings.model_fields)
    for name in values:
        if name == "home":
            raise SettingsError(f"{path}: `home` cannot be set in the file it holds — use "
                                f"LOCALINFER_HOME")
        if name not in fields:
            raise SettingsError(f"{path}: no setting is called {name!r} — the settings are "
                                f"{', '.join(sorted(fields - {'home'}))}")
    return values


def explain(exc: ValidationError, given: dict[str, Any] | None = None) -> SettingsError:
    """One line for a bad setting, named as the user wrote it."""
    err = exc.errors()[0]
    field = str(err["loc"][0]) if err.get("loc") else "?"
    field = field.removeprefix("LOCALINFER_").lower()
    value = err.get("input")
    if given and field in given:
        return SettingsError(f"--{field.replace('_', '-')} {value}: {err['msg']}")
    variable = f"LOCALINFER_{field.upper()}"
    old = [o for o, new in _OldNames.OLD.items() if new == field and o in os.environ]
    if variable not in os.environ and old:
        variable = old[0]
    if variable in os.environ or field not in Settings.model_fields:
        return SettingsError(f"{variable}={value!r}: {err['msg']} — fix or unset that variable")
    return SettingsError(f"{config_path()}: {field} = {value!r}: {err['msg']} — fix the file")


def default(name: str) -> Any:
    """A setting's default, as the schema gives it (for code that runs without settings)."""
    return Settings.model_fields[name].get_default(call_default_factory=True)


def flag_help(name: str) -> tuple[str, dict[str, Any]]:
    """A setting's help line for its command-line flag, `[default; LOCALINFER_NAME]` after it,
    and the bounds click can check (min, max)."""
    info = Settings.model_fields[name]
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    if "unset" in extra:
        default = extra["unset"]
    elif info.default_factory is not None:
        default = None
    else:
        default = info.default.value if isinstance(info.default, StrEnum) else info.default
        default = {True: "on", False: "off"}.get(default, default) if isinstance(
            default, bool) else default
    shown = f"{default}; " if default not in (None, []) else ""
    bounds = {}
    for rule in info.metadata:
        for attr, key in (("ge", "min"), ("le", "max")):
            if getattr(rule, attr, None) is not None:
                bounds[key] = getattr(rule, attr)
    return f"{info.description} [{shown}LOCALINFER_{name.upper()}]", bounds
