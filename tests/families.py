"""Real model families without real weights: llama.cpp's own copies of the families' chat
templates and tokenizers, from the llama-cpp-python source release of the installed version
(pip's cache has it where pip built the wheel here; else the package index), and small
random-weight GGUFs made with them (bench/random_gguf.py): one-layer llama-shaped ones
(family_model), and tiny ones of other architectures — hybrid, recurrent, sliding-window,
mixture of experts (arch_model). What a model says is noise, so a test that needs a given
text forces it with a grammar; how the reply is taken apart, and how the template renders
tools and reasoning, is the family's own. A grammar allows a text in many tokenizations, and
which one a random model picks depends on the floats of its batch: leave room for a token a
character.

Everything is kept in a cache of its own, per llama-cpp-python version: the first run
downloads the source (~60 MB) once and writes each model once (a few seconds each).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"
VERSION = importlib.metadata.version("llama-cpp-python")
CACHE = Path(os.environ.get("LOCALINFER_TEST_CACHE", Path.home() / ".cache" / "localinfer-tests")
             ) / f"llama.cpp-{VERSION}"

# Qwen 2.5 / 3's added tokens, at their published ids (the vocabulary file in llama.cpp's
# tests pads those ids): tool calls and thinking are words of their own there
QWEN_ADDED = {151657: "<tool_call>", 151658: "</tool_call>", 151665: "<tool_response>",
              151666: "</tool_response>", 151667: "<think>", 151668: "</think>"}
# Qwen2-VL's and its kin's vision marks, control tokens there
QWEN_VL_ADDED = {**QWEN_ADDED, 151652: "<|vision_start|>", 151653: "<|vision_end|>",
                 151654: "<|vision_pad|>", 151655: "<|image_pad|>"}
# Qwen2.5-Coder's fill-in-the-middle and repository tokens (control tokens there)
QWEN_CODER_ADDED = {**QWEN_ADDED, 151659: "<|fim_prefix|>", 151660: "<|fim_middle|>",
                    151661: "<|fim_suffix|>", 151662: "<|fim_pad|>", 151663: "<|repo_name|>",
                    151664: "<|file_sep|>"}
_CONTROL, _USER_DEFINED = 3, 4


def llama_cpp_file(relative: str) -> Path:
    """A file of llama.cpp's source tree (`models/templates/X.jinja`, `models/ggml-vocab-
    qwen2.gguf`), from the source release of the installed llama-cpp-python."""
    path = CACHE / "src" / relative
    if not path.exists():
        _unpack()
    if not path.exists():
        raise FileNotFoundError(f"llama.cpp {VERSION}'s source has no {relative}")
    return path


def _unpack() -> None:
    download = CACHE / "sdist"
    download.mkdir(parents=True, exist_ok=True)
    if not list(download.glob("llama_cpp_python-*.tar.gz")):
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--no-binary", ":all:", f"llama-cpp-python=={VERSION}", "-d",
                        str(download)], check=True, timeout=900)
    archive = next(download.glob("llama_cpp_python-*.tar.gz"))
    scratch = CACHE / "src.partial"
    shutil.rmtree(scratch, ignore_errors=True)
    with tarfile.open(archive) as tar:
        members = []
        for member in tar.getmembers():
            parts = member.name.split("/vendor/llama.cpp/", 1)
            if len(parts) == 2 and member.isfile() and (
                    parts[1].startswith("models/templates/")
                    or (parts[1].startswith("models/ggml-vocab-") and parts[1].endswith(".gguf"))):
                member.name = parts[1]
                members.append(member)
        tar.extractall(scratch, members=members, filter="data")
    shutil.rmtree(CACHE / "src", ignore_errors=True)
    os.replace(scratch, CACHE / "src")


def family_model(template: str | None, vocab: str = "qwen2",
                 added: dict[int, str] | None = None, tag: str = "", arch: str = "llama"
                 ) -> Path:
    """A one-layer random-weight GGUF with a real family's tokenizer and chat template
    (`models/templates/<template>.jinja`; None: none, as a base model's file); `added`:
    tokens put at their ids (`<|…|>` ones as control tokens); `tag` tells apart two models
    of one template and vocabulary; `arch`: qwen2vl for Qwen2-VL's M-RoPE."""
    added = QWEN_ADDED if added is None and vocab.startswith("qwen") else (added or {})
    out = CACHE / "models" / (f"{template or 'base'}--{vocab}{tag}"
                              f"{'' if arch == 'llama' else '--' + arch}.gguf")
    if out.exists():
        return out
    random_gguf = _random_gguf()
    tokenizer = _tokenizer(random_gguf, template, vocab, added)
    shape = random_gguf.Shape(n_layer=1, n_embd=64, n_head=2, n_head_kv=2, n_ff=128,
                              n_vocab=len(tokenizer["tokenizer.ggml.tokens"][0]),
                              n_ctx_train=4096, tied_output=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    random_gguf.write_model(shape, partial, tokenizer, f"random {template}", arch=arch)
    os.replace(partial, out)
    return out


# each architecture's family: its chat template (None: a base model's file), vocabulary and
# added tokens. Gemma 3's turn marks sit at the ids Gemma 4's vocabulary has its own at;
# Mamba-2 was trained on GPT-NeoX's vocabulary; LFM2's template is ChatML's.
ARCH_FAMILIES = {
    "qwen35": ("Qwen3.5-4B", "qwen2", QWEN_ADDED),
    "qwen3moe": ("Qwen-Qwen3-0.6B", "qwen2", QWEN_ADDED),
    "lfm2": ("LFM2.5-Instruct", "qwen2", QWEN_ADDED),
    "gemma3": ("google-gemma-2-2b-it", "gemma-4", {105: "<start_of_turn>",
                                                    106: "<end_of_turn>"}),
    "mamba2": (None, "gpt-neox", {}),
}


def arch_model(arch: str, template: str | None | bool = True, vocab: str | None = None,
               added: dict[int, str] | None = None, tag: str = "") -> Path:
    """A random-weight GGUF of another architecture than llama's, `<arch>-tiny` of
    bench/random_gguf.py's ARCH_SHAPES (qwen35, mamba2, lfm2, gemma3, qwen3moe), with its
    family's tokenizer and chat template (ARCH_FAMILIES). `template`: True, the family's; a
    name of `models/templates/`; None, none. `vocab`, `added`: in place of the family's;
    `tag` tells apart two files of one architecture and tokenizer."""
    family_template, family_vocab, family_added = ARCH_FAMILIES[arch]
    template = family_template if template is True else template
    vocab = vocab or family_vocab
    added = family_added if added is None else added
    out = CACHE / "models" / f"{arch}-tiny--{template or 'base'}--{vocab}{tag}.gguf"
    if out.exists():
        return out
    random_gguf = _random_gguf()
    tokenizer = _tokenizer(random_gguf, template, vocab, added)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    random_gguf.write_arch(random_gguf.ARCH_SHAPES[f"{arch}-tiny"], partial, tokenizer,
                           f"random {arch}-tiny {template or 'base'}")
    os.replace(partial, out)
    return out


# Qwen3-Reranker's rerank prompt, as llama.cpp's converter writes it into the file
# (tokenizer.chat_template.rerank)
QWEN3_RERANK_PROMPT = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    "and the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that "
    "answer the query\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n")


def reranker_model(arch: str, size: str = "tiny") -> Path:
    """A random-weight reranker of bench/random_gguf.py's `<arch>-rerank-<size>`: "bert", a
    BERT cross-encoder over bge's WordPiece vocabulary ([CLS] query [SEP] document), its
    classifier the only sign of what it is, as llama.cpp's converter writes bge-reranker's
    kin; or "qwen3", a Qwen3-Reranker (rank pooling, the yes/no head, its rerank prompt,
    Qwen3's chat template and vocabulary) — "0.6b" the published one's shape."""
    out = CACHE / "models" / f"{arch}-rerank-{size}.gguf"
    if out.exists():
        return out
    random_gguf = _random_gguf()
    if arch == "bert":
        tokenizer = _tokenizer(random_gguf, None, "bert-bge", {})
    else:
        import gguf

        tokenizer = _tokenizer(random_gguf, "Qwen-Qwen3-0.6B", "qwen2", QWEN_ADDED)
        tokenizer["tokenizer.chat_template.rerank"] = (QWEN3_RERANK_PROMPT,
                                                       gguf.GGUFValueType.STRING, None)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    random_gguf.write_arch(random_gguf.ARCH_SHAPES[f"{arch}-rerank-{size}"], partial, tokenizer,
                           f"random {arch}-rerank-{size}")
    os.replace(partial, out)
    return out


def embedding_model() -> Path:
    """A random-weight Qwen3-Embedding (bench/random_gguf.py's `qwen3-embed-tiny`): Qwen3
    whose file names last-token pooling, with Qwen3's vocabulary."""
    out = CACHE / "models" / "qwen3-embed-tiny.gguf"
    if out.exists():
        return out
    random_gguf = _random_gguf()
    tokenizer = _tokenizer(random_gguf, "Qwen-Qwen3-0.6B", "qwen2", QWEN_ADDED)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    random_gguf.write_arch(random_gguf.ARCH_SHAPES["qwen3-embed-tiny"], partial, tokenizer,
                           "random qwen3-embed-tiny")
    os.replace(partial, out)
    return out


def plan_model(shape: str) -> Path:
    """A published model's shape (bench/random_gguf.py PLAN_SHAPES: qwen3.5-9b,
    qwen3-30b-a3b, lfm2-1.2b, mamba2-2.7b, gemma3-27b, gpt-oss-120b) as a file the planner reads as the
    model: its header and tensor table, the weights' bytes a hole (a few MiB on disk), a
    placeholder vocabulary. For plans, never for llama.cpp."""
    out = CACHE / "plan-shapes" / f"{shape}.gguf"
    if out.exists():
        return out
    random_gguf = _random_gguf()
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    random_gguf.write_plan_shape(random_gguf.PLAN_SHAPES[shape], partial, shape, sparse=True)
    os.replace(partial, out)
    return out


# what the talker says (Qwen 2's tokens), before a full stop and the end of its turn
TALKER_WORDS = ("Hello", "there", "I", "can", "help", "you")


def talker_model() -> Path:
    """A one-layer random model of Qwen 2.5's family (its template, which writes tools, and
    its tokenizer; a 32K context) that says a few of TALKER_WORDS, a full stop, and ends its
    turn (bench/random_gguf.py `write_talker`): a coding agent's turn, quickly."""
    out = CACHE / "models" / "talker--Qwen-Qwen2.5-7B-Instruct--qwen2.gguf"
    if out.exists():
        return out
    random_gguf = _random_gguf()
    tokenizer = _tokenizer(random_gguf, "Qwen-Qwen2.5-7B-Instruct", "qwen2", QWEN_ADDED)
    tokens = tokenizer["tokenizer.ggml.tokens"][0]
    words = [tokens.index(("" if i == 0 else "Ġ") + word)
             for i, word in enumerate(TALKER_WORDS)]
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    random_gguf.write_talker(partial, tokenizer, words, stop=tokens.index("."),
                             end=tokens.index("<|im_end|>"))
    os.replace(partial, out)
    return out


def _random_gguf():
    sys.path.insert(0, str(BENCH))
    try:
        import random_gguf
    finally:
        sys.path.remove(str(BENCH))
    return random_gguf


def _tokenizer(random_gguf, template: str | None, vocab: str, added: dict[int, str]) -> dict:
    """`models/ggml-vocab-<vocab>.gguf`'s tokenizer with `added` at their ids and `template`
    as its chat template."""
    tokenizer = random_gguf.read_tokenizer(llama_cpp_file(f"models/ggml-vocab-{vocab}.gguf"))
    tokens, *token_kind = tokenizer["tokenizer.ggml.tokens"]
    types, *type_kind = tokenizer["tokenizer.ggml.token_type"]
    tokens, types = list(tokens), list(types)
    for token_id, text in added.items():
        tokens[token_id] = text  # a control token stays one (Gemma's turn marks)
        control = text.startswith("<|") or types[token_id] == _CONTROL
        types[token_id] = _CONTROL if control else _USER_DEFINED
    tokenizer["tokenizer.ggml.tokens"] = (tokens, *token_kind)
    tokenizer["tokenizer.ggml.token_type"] = (types, *type_kind)
    import gguf

    tokenizer.pop("tokenizer.chat_template", None)
    if template is not None:
        source = llama_cpp_file(f"models/templates/{template}.jinja").read_text()
        tokenizer["tokenizer.chat_template"] = (source, gguf.GGUFValueType.STRING, None)
    return tokenizer


def install(home: Path, path: Path, name: str, projector: Path | None = None) -> str:
    """The GGUF as a pulled model of this localinfer home (a link to the cached file, or a
    copy), with its vision projector beside it if given: its name, as `list` and the APIs
    give it."""
    repo = f"testorg/{name}"
    folder = home / "models" / "hub" / repo
    folder.mkdir(parents=True)
    target = folder / f"{name}-Q8_0.gguf"
    files = [(path, target)] + ([(projector, folder / "mmproj-F16.gguf")] if projector else [])
    for source, copy in files:
        try:
            os.link(source, copy)
        except OSError:
            shutil.copyfile(source, copy)
    manifests = home / "models" / "manifests"
    manifests.mkdir(parents=True, exist_ok=True)
    installed = f"hf.co/{repo}:Q8_0"
    (manifests / f"{installed.replace('/', '__').replace(':', '--')}.json").write_text(
        json.dumps({"name": installed, "repo": repo, "file": target.name, "quant": "Q8_0",
                    "sha256": None, "size": target.stat().st_size,
                    "pulled_at": "2026-11-24T00:00:00+00:00",
                    "projector": "mmproj-F16.gguf" if projector else None}))
    return installed


def projector(text_model: Path, n_tokens: int = 64, *shape: str) -> Path:
    """A random-weight Gemma 3 vision projector (bench/random_mmproj.py) of `text_model`'s
    width: every image becomes `n_tokens` image tokens; `shape`: more of its flags."""
    tail = "".join(f"-{a.strip('-')}" for a in shape)
    out = CACHE / "models" / f"mmproj--{text_model.stem}--{n_tokens}{tail}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(".partial")
        subprocess.run([sys.executable, str(BENCH / "random_mmproj.py"), str(partial),
                        "--text-model", str(text_model), "--tokens", str(n_tokens), *shape],
                       check=True, capture_output=True)
        os.replace(partial, out)
    return out


def saying(text: str) -> str:
    """A GBNF grammar whose one sentence is `text`: a random-weight model made to write it
    (llama-server's `grammar` field; room for a token per character)."""
    return f"root ::= {json.dumps(text)}"
