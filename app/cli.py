"""The `localinfer` command line.

Domain errors become one line on stderr and exit code 1 — never a traceback. Set
LOCALINFER_DEBUG=1 to let them raise instead (tests and bug reports).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from pathlib import Path
from collections.abc import Iterator
from typing import Annotated, Any, NoReturn, Optional

import typer
from pydantic import ValidationError
from rich.console import Console

from localinfer import __version__
from localinfer.backends.base import LoadOptions, SamplingParams
from localinfer.errors import LocalinferError, ModelNotInstalled, user_message
from localinfer.settings import ImageUrls, KvType, Settings, SplitMode, debug, explain, flag_help

__all__ = ["commands", "main", "number_ranges"]

SAMPLING = SamplingParams()  # the defaults of the sampling flags

commands = typer.Typer(
    name="localinfer",
    help="Run large language models on your own machine.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain one-line usage errors, no boxes
)
_err = Console(stderr=True)


def _flag(setting: str, *names: str, **extra: Any) -> Any:
    """The command-line flag of a setting: its help line, default and bounds come from the
    settings schema (settings.py), as its LOCALINFER_* variable and config file key do. A
    flag's value is None when not given: the variable, the config file or the default then
    decides (`Settings.read`)."""
    help_line, bounds = flag_help(setting)
    return typer.Option(*names, help=help_line, show_default=False, **bounds, **extra)


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("huggingface_hub").setLevel(logging.INFO if verbose else logging.ERROR)
    # llama.cpp's own log is noise unless asked for
    logging.getLogger("localinfer.llama_cpp").setLevel(
        logging.DEBUG if verbose else logging.CRITICAL + 1
    )
    if verbose:
        logging.getLogger("localinfer").setLevel(logging.DEBUG)


@contextlib.contextmanager
def _user_errors() -> Iterator[None]:
    try:
        yield
    except LocalinferError as exc:
        _fail(exc, str(exc))
    except BrokenPipeError:  # `localinfer run ... | head`: the reader has gone
        raise typer.Exit(141) from None
    except OSError as exc:  # the disk, not us: an unwritable or full home, a file in the way
        if exc.filename is None:
            raise
        _fail(exc, user_message(exc))
    except ValidationError as exc:  # a setting read without flags: a variable or the file
        _fail(exc, str(explain(exc)))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def _fail(exc: BaseException, message: str) -> NoReturn:
    """One line on stderr and exit 1; with LOCALINFER_DEBUG set, the error itself."""
    if debug():
        raise exc
    _err.print(f"Error: {message}", style="red", highlight=False, soft_wrap=True, markup=False)
    raise typer.Exit(1) from None


def _version(value: bool) -> None:
    if value:
        print(f"localinfer {__version__}")
        raise typer.Exit()


@commands.callback()
def _root(
    version: Annotated[Optional[bool], typer.Option(
        "--version", callback=_version, is_eager=True, help="Print the version and exit.")] = None,
) -> None:
    """Run large language models on your own machine."""


@commands.command()
def run(
    model: Annotated[Optional[str], typer.Argument(
        help="Model name (e.g. smollm2:135m, gemma3:270m) or path to a .gguf file.")] = None,
    prompt: Annotated[Optional[str], typer.Option(
        "--prompt", "-p", help="Answer this once and exit (text piped on stdin works too).")] = None,
    system: Annotated[Optional[str], typer.Option(help="System prompt.")] = None,
    temperature: Annotated[float, typer.Option(min=0.0, help="0 is greedy.")
                           ] = SAMPLING.temperature,
    top_p: Annotated[float, typer.Option(min=0.0, max=1.0)] = SAMPLING.top_p,
    top_k: Annotated[int, typer.Option(min=0, help="0 turns it off.")] = SAMPLING.top_k,
    seed: Annotated[Optional[int], typer.Option(
        min=0, help="Fix the random seed to reproduce a reply.")] = None,
    max_tokens: Annotated[Optional[int], _flag("max_tokens")] = None,
    stop: Annotated[Optional[list[str]], typer.Option(
        help="Stop when this text appears (repeatable).")] = None,
    ctx: Annotated[Optional[int], _flag("ctx")] = None,
    threads: Annotated[Optional[int], _flag("threads")] = None,
    kv_type: Annotated[Optional[KvType], _flag("kv_type")] = None,
    flash_attn: Annotated[Optional[bool], _flag("flash_attn", "--flash-attn/--no-flash-attn")
                          ] = None,
    draft: Annotated[Optional[int], _flag("draft")] = None,
    draft_model: Annotated[Optional[str], _flag("draft_model")] = None,
    gpus: Annotated[Optional[str], _flag("gpus")] = None,
    workers: Annotated[Optional[str], _flag("workers")] = None,
    split_mode: Annotated[Optional[SplitMode], _flag("split_mode")] = None,
    prefix: Annotated[Optional[Path], typer.Option(
        "--prefix", help="Code completion: the text before the cursor, from this file (- for "
        "stdin); the model fills in the middle up to --suffix's text.")] = None,
    suffix: Annotated[Optional[Path], typer.Option(
        "--suffix", help="Code completion: the text after the cursor, from this file.")] = None,
    think: Annotated[Optional[bool], typer.Option(
        "--think/--no-think", help="A thinking model thinks first, or answers at once [its "
        "template's default]; its reasoning is shown dimmed in a terminal.")] = None,
    image: Annotated[Optional[list[Path]], typer.Option(
        "--image", help="Show a vision model this picture with the (first) message "
        "(repeatable; /image PATH in the chat).")] = None,
    verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", help="Show llama.cpp's log.")] = False,
) -> None:
    """Chat with a model in the terminal, or answer one prompt."""
    _warm_runner()
    from localinfer.images import read as read_image
    from localinfer.repl import answer_once, check_vision, fill_middle, interactive
    from localinfer.service import load_model

    _setup_logging(verbose)
    with _user_errors():
        completing = prefix is not None or suffix is not None
        if image and completing:
            raise LocalinferError("--image is for a chat — leave it out of a code completion")
        images = [read_image(path) for path in image or ()]  # (a bad one stops before a load)
        before = _read_text_file(prefix) if prefix is not None else ""
        after = _read_text_file(suffix) if suffix is not None else ""
        settings = Settings.read({"max_tokens": max_tokens, "ctx": ctx, "threads": threads,
                                  "kv_type": kv_type, "flash_attn": flash_attn, "draft": draft,
                                  "draft_model": draft_model, "gpus": gpus, "workers": workers,
                                  "split_mode": split_mode})
        # the reply cap (--max-tokens, LOCALINFER_MAX_TOKENS) applies in the engine; 0: none
        params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                                stop=tuple(stop or ()))
        one_shot = prompt
        if not sys.stdin.isatty() and not completing:
            piped = _read_piped_text()
            one_shot = "\n\n".join(p for p in (prompt, piped) if p) or None
            if one_shot is None:
                raise LocalinferError("nothing to answer — pass --prompt or pipe some text in")
        options = LoadOptions.from_settings(settings, n_ctx=ctx)
        try:
            backend = load_model(model, options, settings, writes_text=True)
        except ModelNotInstalled as missing:  # a hub model: pull it, as `ollama run` does
            _pull(missing.name, settings)
            backend = load_model(model, options, settings, writes_text=True)
        with backend:
            if images:
                check_vision(backend)
            if completing:
                fill_middle(backend, before, after, params)
            elif one_shot is not None:
                answer_once(backend, one_shot, system, params, think=think, images=images)
            else:
                interactive(backend, system, params, think=think, images=images,
                            reload=lambda: load_model(model, options, settings,
                                                      writes_text=True))


def _read_text_file(path: Path) -> str:
    """A file's text for --prefix / --suffix (`-`: stdin), or one line saying why not."""
    try:
        if str(path) == "-":
            return sys.stdin.read()
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise LocalinferError(f"{path} is not UTF-8 text") from None
    except OSError as exc:
        raise LocalinferError(f"cannot read {path}: {exc.strerror or exc}") from None


def _warm_runner() -> None:
    """For a command that loads a model: its runner process starts now and loads llama.cpp
    while this one imports, reads the model's header and plans (bench/results/
    runner_start.md), started before the rest of the services are imported."""
    from localinfer.runners import warm_runner

    warm_runner()


def _read_piped_text() -> str:
    try:
        return sys.stdin.buffer.read().decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise LocalinferError(f"the text piped in is not UTF-8 (byte {exc.start}) — convert "
                              f"it first, e.g. with iconv -t UTF-8") from None


def _pull(name: str, settings: Settings) -> None:
    from localinfer.installed import Manifest
    from localinfer.service import pull_model

    _err.print(f"pulling {name} …", style="dim", highlight=False, markup=False)
    got = pull_model(name, settings)
    if isinstance(got, Manifest):
        _err.print(f"{got.name}: {got.file} ({got.quant}, {got.size / 2**30:.2f} GiB) verified",
                   highlight=False, markup=False)
    else:
        _err.print(f"{got.name} ships with localinfer: {got.path}", highlight=False, markup=False)


@commands.command()
def pull(
    model: Annotated[str, typer.Argument(
        help="Catalog name (llama3.2:3b, qwen3:8b-Q8_0) or hf.co/owner/repo[:QUANT].")],
    gpus: Annotated[Optional[str], _flag("gpus")] = None,
    workers: Annotated[Optional[str], _flag("workers")] = None,
) -> None:
    """Download a model from the Hugging Face hub; the quant fits this machine (and its
    workers) unless named."""
    _setup_logging(False)
    with _user_errors():
        _pull(model, Settings.read({"gpus": gpus, "workers": workers}))


@commands.command("list")
def list_models() -> None:
    """Installed models: the embedded ones and those pulled from the hub."""
    from localinfer.installed import installed_models

    with _user_errors():
        models_dir = Settings.read().models_dir
    # (gemma3 is unpacked on first use: the size it will have)
    rows = [(m.name, "embedded", m.size, "—") if m.embedded else
            (m.name, m.quant or "?", m.size, (m.pulled_at or "").replace("T", " ")[:16])
            for m in installed_models(models_dir)]
    width = max([len("NAME"), *(len(name) for name, *_ in rows)])  # hub names run long
    print(f"{'NAME':{width}} {'QUANT':10} {'SIZE':>10}  MODIFIED")
    for name, quant, size, when in rows:
        shown = f"{size / 2**20:,.0f} MiB" if size else "—"
        print(f"{name:{width}} {quant:10} {shown:>10}  {when}")


@commands.command()
def rm(model: Annotated[str, typer.Argument(help="An installed model's name.")]) -> None:
    """Delete a pulled model."""
    from localinfer.installed import delete_model

    with _user_errors():
        print(f"deleted {delete_model(Settings.read().models_dir, model)}")


@commands.command()
def show(
    model: Annotated[Optional[str], typer.Argument(help="Model name or .gguf path.")] = None,
    ctx: Annotated[Optional[int], typer.Option(
        min=16, help="Context to plan for. [default: what `run` gives this model]")] = None,
    parallel: Annotated[int, typer.Option(help="Concurrent sequences to plan for.",
                                          **flag_help("parallel")[1])] = 1,
    gpus: Annotated[Optional[str], _flag("gpus")] = None,
    workers: Annotated[Optional[str], _flag("workers")] = None,
    gpu: Annotated[Optional[list[str]], typer.Option(
        "--gpu", help="Plan for a GPU of this size instead of this machine's, e.g. --gpu 24GiB "
                      "--gpu 12GiB (repeatable): what a model would need.")] = None,
    ram: Annotated[Optional[str], typer.Option(
        help="Plan for this much free RAM instead of this machine's, e.g. 64GiB.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Architecture, quant, size, KV bytes per token, and the plan: for this machine, or for
    the GPUs and RAM named (what-if)."""
    import json

    from localinfer.service import describe

    with _user_errors():
        settings = Settings.read({"gpus": gpus, "workers": workers})
        facts, on_hub = describe(model, settings, ctx=ctx, parallel=parallel, gpu=gpu or (),
                                 ram=ram)
        plan_dict, projector = facts["plan"], facts["projector"]
        if as_json:
            print(json.dumps(facts, indent=2))
            return
        print(f"{facts['name']}  ({facts['architecture']}, {facts['quant']}, "
              f"{facts['file_size'] / 2**20:,.0f} MiB)" + ("  — on the hub, not pulled"
                                                            if on_hub else ""))
        print(f"  layers {facts['n_layer']} · heads {facts['n_head']} (KV {facts['n_head_kv']}) · "
              f"trained context {facts['context_length']} · vocabulary {facts['n_vocab']}")
        for line in _shape_lines(facts):
            print(f"  {line}")
        if not facts["chat_template"]:
            print("  no chat template in the file: likely a base model, which continues text "
                  "rather than answering (chats use a generic turn format)")
        if projector:
            print(f"  vision: {projector['file']} ({projector['type']}, "
                  f"{projector['quant']}): {projector['memory_bytes'] / 2**20:,.0f} MiB with "
                  f"an image's compute buffer, on the model's GPU or in RAM, kept free by "
                  f"the plan below")
        print(f"  plan{' (what-if)' if plan_dict['what_if'] else ''}: {plan_dict['reason']}")
        if plan_dict.get("n_ctx"):
            each = (f" for each of {plan_dict['n_slots']} sequences" if plan_dict["n_slots"] > 1
                    else "")
            print(f"  context: {plan_dict['n_ctx']:,} tokens{each}")
        if plan_dict.get("memory"):
            # (each in its own unit: a small model's output buffer read "0.00" in GiB)
            parts = " + ".join(f"{k.replace('_', ' ')} {_size(v)}"
                               for k, v in plan_dict["memory"].items() if v)
            print(f"  memory: {parts} = {_size(plan_dict['memory_bytes'])}")
        if plan_dict.get("attention"):
            print(f"  attention: {plan_dict['attention']}")
        for place in plan_dict.get("placement") or []:
            if place["index"] is None and not (place["layers"] or place["experts"]
                                               or place["kv_cache"]):
                print(f"    {place['device']}: the input embeddings, "
                      f"{place['weights'] / 2**30:.2f} GiB")
                continue
            state = (f"recurrent state {place['recurrent_state'] / 2**30:.2f}, "
                     if place["recurrent_state"] else "")
            experts = (f"; experts of layers {number_ranges(place['experts'])}, "
                       f"{place['expert_bytes'] / 2**30:.2f} GiB" if place["experts"] else "")
            print(f"    {place['device']}: {place['layers']} layers, "
                  f"{place['total'] / 2**30:.2f} GiB "
                  f"(weights {place['weights'] / 2**30:.2f}, KV {place['kv_cache'] / 2**30:.2f}, "
                  f"{state}compute {place['compute'] / 2**30:.2f}, "
                  f"runtime {place['runtime'] / 2**30:.2f}){experts}")


def _shape_lines(facts: dict) -> list[str]:
    """`show`'s lines on the architecture and what each part costs."""
    lines = list(facts["kinds"])
    memory = [f"KV cache {facts['kv_bytes_per_token'] / 1024:.1f} KiB per token (f16)"]
    if facts["layers"]["sliding_window"]:
        memory[0] += (f" if every layer kept every token; the {facts['layers']['sliding_window']}"
                      f" sliding-window layers keep their last {facts['layers']['window']} (and"
                      f" a micro-batch) a slot unless --swa-full")
    if facts["recurrent_state_bytes_per_slot"]:
        memory.append(f"recurrent state {_size(facts['recurrent_state_bytes_per_slot'])} per "
                      f"slot")
    if facts["experts"]:
        memory.append(f"experts {_size(facts['experts']['bytes'])} of the weights")
    return lines + [" · ".join(memory)]


def _size(n: int) -> str:
    """Bytes in the unit that reads best: 57.0 KiB, 50.2 MiB, 17.51 GiB."""
    if n >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


def number_ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 5] → "0-2, 5"."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


@commands.command()
def ps(
    url: Annotated[Optional[str], typer.Option(
        help="The server to ask [http://127.0.0.1:11435, or LOCALINFER_HOST/PORT].")] = None,
) -> None:
    """What a running `localinfer serve` has loaded, the memory it takes, and until when."""
    with _user_errors():
        models = _ask_server(url, "GET", "/api/ps").get("models", [])
        print(f"{'NAME':32} {'SIZE':>10} {'PROCESSOR':10} {'CONTEXT':>8}  UNTIL")
        for m in models:
            processor = "GPU" if m.get("size_vram") else "CPU"
            print(f"{m['name']:32} {m['size'] / 2**20:>6,.0f} MiB {processor:10} "
                  f"{m.get('context_length', 0):>8}  {m.get('expires_at', '')[:19].replace('T', ' ')}")


@commands.command()
def stop(
    model: Annotated[str, typer.Argument(help="The model to unload, as `localinfer ps` names it.")],
    url: Annotated[Optional[str], typer.Option(
        help="The server to ask [http://127.0.0.1:11435, or LOCALINFER_HOST/PORT].")] = None,
) -> None:
    """Unload a model from a running `localinfer serve` now, as `ollama stop` does."""
    with _user_errors():
        loaded = [m["name"] for m in _ask_server(url, "GET", "/api/ps").get("models", [])]
        # the server says which model the name means (an alias, a short name) as it unloads it
        gone = _ask_server(url, "POST", "/api/generate", json={"model": model, "keep_alive": 0})
        if gone.get("model") not in loaded:
            raise LocalinferError(f"'{model}' is not loaded — loaded: {', '.join(loaded) or 'none'}")


def _ask_server(url: str | None, method: str, path: str, **kwargs) -> dict:
    """A running server's JSON answer; one clear line when none answers or it refuses."""
    import httpx

    settings = Settings.read()
    url = (url or f"http://{settings.host}:{settings.port}").rstrip("/")
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    try:
        response = httpx.request(method, url + path, headers=headers, timeout=60, **kwargs)
    except httpx.TransportError:
        raise LocalinferError(f"no server answers at {url} — start one with `localinfer serve`") from None
    if response.status_code != 200:
        try:
            said = response.json()["error"]
        except (ValueError, KeyError, TypeError):
            said = response.text[:200]
        raise LocalinferError(f"{url} answered {response.status_code}: {said}")
    return response.json()


@commands.command()
def bench(
    model: Annotated[Optional[str], typer.Argument(help="Model name or .gguf path.")] = None,
    levels: Annotated[str, typer.Option(help="Concurrency levels, comma-separated.")] = "1,2,4,8,16",
    requests_per_client: Annotated[int, typer.Option(min=1)] = 2,
    max_prompt: Annotated[int, typer.Option(min=8, help="Longest prompt in tokens.")] = 2000,
    max_output: Annotated[int, typer.Option(min=2, help="Longest reply in tokens.")] = 256,
    scenarios: Annotated[bool, typer.Option(
        help="Also run the long-prefill and cached-system-prompt scenarios.")] = True,
    threads: Annotated[Optional[int], typer.Option(min=1)] = None,
    gpu_layers: Annotated[Optional[int], typer.Option(
        min=0, help="Layers on the GPU; 0 for the CPU alone [as the planner says].")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Write the results as JSON here.")] = None,
) -> None:
    """Measure the engine under a mixed workload against the bare-loop ceiling and Llama."""
    import json

    from localinfer.bench import Workload, run_bench
    from localinfer.service import resolve

    _setup_logging(False)
    with _user_errors():
        settings = Settings.read()
        path = resolve(model or settings.default_model, settings.models_dir).path
        try:
            level_list = [int(x) for x in levels.split(",")]
        except ValueError:
            raise LocalinferError("--levels takes numbers separated by commas, e.g. 1,4,8") from None
        work = Workload(min_prompt=min(32, max_prompt), max_prompt=max_prompt,
                        min_output=min(16, max_output), max_output=max_output,
                        requests_per_client=requests_per_client)
        result = run_bench(path, level_list, work, threads, scenarios,
                           log=lambda line: print(line, flush=True), gpu_layers=gpu_layers)
        if out:
            out.write_text(json.dumps(result, indent=2))


@commands.command()
def chat(
    model: Annotated[Optional[str], typer.Argument(
        help="Model to start with (default smollm2:135m); Ctrl+T picks another.")] = None,
    url: Annotated[Optional[str], typer.Option(
        help="Chat through a running `localinfer serve` at this URL instead of in-process.")
    ] = None,
    api_key: Annotated[Optional[str], typer.Option(
        help="The server's API key, with --url [LOCALINFER_API_KEY].")] = None,
    ctx: Annotated[Optional[int], _flag("ctx")] = None,
    threads: Annotated[Optional[int], _flag("threads")] = None,
    gpus: Annotated[Optional[str], _flag("gpus")] = None,
    workers: Annotated[Optional[str], _flag("workers")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show llama.cpp's log.")
                       ] = False,
) -> None:
    """A full-screen chat: streaming replies, live TTFT and tok/s, models, saved chats."""
    from localinfer.tui.chat_app import ChatApp
    from localinfer.tui.client import LocalClient, RemoteClient
    from localinfer.tui.conversations import ConversationStore

    _setup_logging(verbose)
    with _user_errors():
        settings = Settings.read({"api_key": api_key, "ctx": ctx, "threads": threads,
                                  "gpus": gpus, "workers": workers})
        if url:
            client = RemoteClient(url, settings.api_key)
        else:
            _warm_runner()
            client = LocalClient(settings, LoadOptions.from_settings(settings, n_ctx=ctx))
        store = ConversationStore(settings.home / "chats.db")
        chat_app = ChatApp(client, store, model)
        chat_app.run()
    if chat_app.return_code:  # the app stopped on an error it has already shown
        raise typer.Exit(chat_app.return_code)


@commands.command()
def serve(
    model: Annotated[Optional[str], _flag("model", "--model", "-m")] = None,
    host: Annotated[Optional[str], _flag("host")] = None,
    port: Annotated[Optional[int], _flag("port")] = None,
    parallel: Annotated[Optional[int], _flag("parallel")] = None,
    ctx: Annotated[Optional[int], _flag("ctx")] = None,
    threads: Annotated[Optional[int], _flag("threads")] = None,
    core_share: Annotated[Optional[bool], _flag("core_share", "--core-share/--no-core-share")
                          ] = None,
    prefill_chunk: Annotated[Optional[int], _flag("prefill_chunk")] = None,
    step_budget: Annotated[Optional[float], _flag("step_budget")] = None,
    step_ms: Annotated[Optional[int], _flag("step_ms")] = None,
    draft: Annotated[Optional[int], _flag("draft")] = None,
    draft_model: Annotated[Optional[str], _flag("draft_model")] = None,
    kv_type: Annotated[Optional[KvType], _flag("kv_type")] = None,
    kv_unified: Annotated[Optional[bool], _flag("kv_unified", "--kv-unified/--no-kv-unified")
                          ] = None,
    cache_reuse: Annotated[Optional[int], _flag("cache_reuse")] = None,
    ctx_checkpoints: Annotated[Optional[int], _flag("ctx_checkpoints")] = None,
    ctx_checkpoint_mib: Annotated[Optional[int], _flag("ctx_checkpoint_mib")] = None,
    cache_ram: Annotated[Optional[int], _flag("cache_ram")] = None,
    swa_full: Annotated[Optional[bool], _flag("swa_full", "--swa-full/--no-swa-full")] = None,
    flash_attn: Annotated[Optional[bool], _flag("flash_attn", "--flash-attn/--no-flash-attn")
                          ] = None,
    max_tokens: Annotated[Optional[int], _flag("max_tokens")] = None,
    gpus: Annotated[Optional[str], _flag("gpus")] = None,
    workers: Annotated[Optional[str], _flag("workers")] = None,
    split_mode: Annotated[Optional[SplitMode], _flag("split_mode")] = None,
    replicas: Annotated[Optional[int], _flag("replicas")] = None,
    api_key: Annotated[Optional[str], _flag("api_key")] = None,
    allow_origin: Annotated[Optional[list[str]], _flag("allowed_origins", "--allow-origin")
                            ] = None,
    allow_host: Annotated[Optional[list[str]], _flag("allowed_hosts", "--allow-host")] = None,
    keep_alive: Annotated[Optional[str], _flag("keep_alive")] = None,
    max_loaded_models: Annotated[Optional[int], _flag("max_loaded_models")] = None,
    image_urls: Annotated[Optional[ImageUrls], _flag("image_urls")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log requests and llama.cpp.")] = False,
) -> None:
    """Serve models over HTTP with OpenAI- and Ollama-compatible APIs."""
    _warm_runner()
    from localinfer.api.server import serve as run_server
    from localinfer.pool import parse_keep_alive
    from localinfer.service import check_threads

    _setup_logging(verbose)
    with _user_errors():
        settings = Settings.read({
            "model": model, "host": host, "port": port, "parallel": parallel, "ctx": ctx,
            "threads": threads, "core_share": core_share, "prefill_chunk": prefill_chunk,
            "step_budget": step_budget, "step_ms": step_ms, "draft": draft,
            "draft_model": draft_model, "kv_type": kv_type,
            "kv_unified": kv_unified, "cache_reuse": cache_reuse,
            "ctx_checkpoints": ctx_checkpoints, "ctx_checkpoint_mib": ctx_checkpoint_mib,
            "cache_ram": cache_ram,
            "swa_full": swa_full,
            "flash_attn": flash_attn,
            "max_tokens": max_tokens,
            "gpus": gpus, "workers": workers, "split_mode": split_mode, "replicas": replicas, "api_key": api_key,
            "allowed_origins": allow_origin, "allowed_hosts": allow_host,
            "keep_alive": keep_alive, "max_loaded_models": max_loaded_models,
            "image_urls": image_urls})
        parse_keep_alive(settings.keep_alive, None)  # a bad value fails here, not later
        check_threads(settings.threads)  # (and here, not at each load)
        # --ctx here is each model's context within what it was trained on (as Ollama caps
        # it): a server serves many models, and 32,768 must not break an 8K-trained one
        options = LoadOptions.from_settings(settings, n_slots=settings.parallel)
        run_server(settings, options, settings.model, verbose)


@commands.command(context_settings={"allow_extra_args": True,
                                     "ignore_unknown_options": True})
def launch(
    context: typer.Context,
    agent: Annotated[str, typer.Argument(
        help="claude (Claude Code), codex, opencode, qwen (Qwen Code), aider or continue "
             "(Continue's CLI); what follows (after --) goes to the agent.")],
    model: Annotated[Optional[str], typer.Option(
        "--model", "-m", help="The model it uses [the largest installed one whose template "
                              "takes tools, with the context the agent needs].")] = None,
    ctx: Annotated[Optional[int], typer.Option(
        min=256, help="The context a server started here gives the model [what the agent "
                      "needs: 32768 for Claude Code, 16384 for OpenCode].")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log requests and llama.cpp.")
                       ] = False,
) -> None:
    """A coding agent on your models: the local server (started for this run if none is
    running), the model, and the agent's own settings for this run only."""
    from localinfer.launch import find, launch as run_agent

    _setup_logging(verbose)
    logging.getLogger("localinfer.launch").setLevel(logging.INFO if verbose else logging.WARNING)
    with _user_errors():
        chosen = find(agent)
        settings = Settings.read()
        raise typer.Exit(run_agent(chosen, settings, model, context.args, ctx, verbose))


@commands.command(name="app")
def desktop_app(
    model: Annotated[Optional[str], typer.Argument(
        help="Model to load at start (default smollm2:135m); the page picks others.")] = None,
    ctx: Annotated[Optional[int], _flag("ctx")] = None,
    parallel: Annotated[Optional[int], _flag("parallel")] = None,
    threads: Annotated[Optional[int], _flag("threads")] = None,
    gpus: Annotated[Optional[str], _flag("gpus")] = None,
    workers: Annotated[Optional[str], _flag("workers")] = None,
    browser: Annotated[bool, typer.Option(
        "--browser/--no-browser", help="Open a window or the system browser [yes]; without, "
                                       "only print the page's address.")] = True,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log requests and llama.cpp.")
                       ] = False,
) -> None:
    """The chat app in a window: streaming replies, models with fit badges, saved chats."""
    _warm_runner()
    from localinfer.desktop import run_app

    _setup_logging(verbose)
    with _user_errors():
        settings = Settings.read({"ctx": ctx, "parallel": parallel, "threads": threads,
                                  "gpus": gpus, "workers": workers})
        run_app(settings, model or settings.default_model,
                LoadOptions.from_settings(settings, n_ctx=ctx, n_slots=settings.parallel),
                browser, verbose)


@commands.command()
def worker(
    host: Annotated[str, typer.Option(help="Address to listen on; beyond loopback a key is "
                                           "required (LOCALINFER_WORKER_KEY).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port.")] = 50052,
    threads: Annotated[Optional[int], typer.Option(
        min=1, help="CPU threads for the layers it runs. [default: the physical cores]")] = None,
    cache: Annotated[Optional[Path], typer.Option(
        help="Keep the tensors a head sends (those over 10 MiB) in this folder: the next load "
             "of the same model sends only their hashes.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show llama.cpp's log.")
                       ] = False,
) -> None:
    """Serve this machine's GPUs (or its CPU) to a head over llama.cpp's RPC: the head's
    `--workers host:port` then puts a share of each model's layers here."""
    from localinfer.service import check_threads
    from localinfer.worker import start_worker

    _setup_logging(verbose)
    with _user_errors():
        check_threads(threads)
        settings = Settings.read()
        if cache is not None:
            cache.mkdir(parents=True, exist_ok=True)
        front = start_worker(host, port, settings.worker_key, threads, cache,
                             say=lambda line: print(line, flush=True))
        front.serve_forever()


@commands.command()
def hw(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Show the GPUs, CPU and memory localinfer sees, and what each probe found."""
    import json
    import textwrap

    from localinfer.service import hardware_report

    found, rpc = hardware_report()
    if as_json:
        print(json.dumps({**found.to_dict(), "rpc": rpc}, indent=2))
        return
    gib = lambda n: f"{n / 2**30:.1f} GiB"  # noqa: E731
    cpu = found.cpu
    print(f"CPU   {cpu.model} · {cpu.physical_cores} cores, {cpu.logical_cores} threads · "
          f"{' '.join(f.upper() for f in cpu.features) or 'no SIMD features found'}")
    print(f"RAM   {gib(found.ram_total_bytes)} total, {gib(found.ram_available_bytes)} available")
    for gpu in found.gpus:
        free = f", {gib(gpu.free_bytes)} free" if gpu.free_bytes is not None else ""
        print(f"GPU {gpu.index} {gpu.name} · {gib(gpu.total_bytes)}{free} · {gpu.backend.upper()}"
              + (f" · driver {gpu.driver}" if gpu.driver else ""))
    if not found.gpus:
        print("GPU   none found")
    print(f"llama.cpp backends: {', '.join(found.compute_backends) or 'unknown'} · GPU offload "
          f"{'yes' if found.gpu_offload else 'no (CPU-only build)'}")
    for dev in found.devices:
        memory = f" · {gib(dev.total_bytes)}, {gib(dev.free_bytes)} free" if dev.kind != "cpu" else ""
        print(f"  device {dev.name} ({dev.backend}) · {dev.description} · {dev.kind.upper()}{memory}")
    if found.cpu_buffer_types or found.cpu_buffer_types_off:
        off = ", ".join(found.cpu_buffer_types_off)
        print(f"  CPU weight layouts: {', '.join(found.cpu_buffer_types) or 'plain only'}"
              + (f" · {off} off (its kernels crash in this llama.cpp)" if off else ""))
    if found.backend_libraries:  # a build whose backends are libraries loaded at start
        # one CPU library loads, the best this CPU runs; a GPU one where its driver loads
        for state, label in ((True, "loaded"), (False, "not loaded"), (None, "present")):
            names = [lib.name for lib in found.backend_libraries if lib.loaded is state]
            if names:
                print(textwrap.fill(f"backend libraries {label}: {', '.join(names)}",
                                    width=100, initial_indent="  ", subsequent_indent="    ",
                                    break_on_hyphens=False))
        for lib in found.backend_libraries:
            if lib.why_not:
                print(f"  {lib.name} did not load: {lib.why_not}")
    print(f"RPC workers: {rpc['summary']}")
    for probe in found.probes:
        print(f"  probe {probe.name}: {probe.status}" + (f" ({probe.reason})" if probe.reason else ""))


def main() -> None:
    commands()


if __name__ == "__main__":
    main()
