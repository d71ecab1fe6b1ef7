"""Fill-in-the-middle prompts in each code family's own tokens (app/chat_formats/fim.py), on
random-weight models with the real coder vocabularies (tests/families.py): Qwen2.5-Coder's
(with its repository tokens), StarCoder's and DeepSeek-Coder's."""

from __future__ import annotations

import pytest

from localinfer.backends.base import LoadOptions
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.errors import InvalidRequest

from ..families import QWEN_CODER_ADDED, family_model

CODERS = {  # vocabulary → (how the model is made, its FIM marks)
    "qwen2.5-coder": (("Qwen-Qwen2.5-7B-Instruct", "qwen2", QWEN_CODER_ADDED, "-coder"),
                      ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")),
    "starcoder": ((None, "starcoder"), ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")),
    "deepseek-coder": ((None, "deepseek-coder"), ("<｜fim▁begin｜>", "<｜fim▁hole｜>",
                                                  "<｜fim▁end｜>")),
}
PREFIX = "def add(a, b):\n    return "
SUFFIX = "\n\nprint(add(1, 2))\n"


@pytest.fixture(scope="module", params=sorted(CODERS))
def coder(request):
    made, marks = CODERS[request.param]
    backend = LlamaCppBackend(family_model(*made), LoadOptions(n_ctx=512), name=request.param)
    yield request.param, backend, marks
    backend.close()


def _text(backend, text: str) -> list[int]:
    return backend.native.tokenize(text, add_special=False, parse_special=False)


def test_the_prompt_is_prefix_suffix_middle_in_the_familys_tokens(coder):
    name, backend, (pre, suf, mid) = coder
    native = backend.native
    ids = {t: native.tokenize(t, add_special=False, parse_special=True) for t in (pre, suf, mid)}
    assert all(len(v) == 1 for v in ids.values()), ids  # each mark is one token
    tokens = backend.infill_tokens(PREFIX, SUFFIX)
    head = [native.bos()] if native.adds_bos() else []
    if name == "qwen2.5-coder":  # the repository part, with its tokens
        rep, sep = (native.tokenize(t, add_special=False, parse_special=True)[0]
                    for t in ("<|repo_name|>", "<|file_sep|>"))
        head += [rep, *_text(backend, "myproject\n"), sep, *_text(backend, "filename\n")]
    assert tokens == [*head, *ids[pre], *_text(backend, PREFIX), *ids[suf],
                      *_text(backend, SUFFIX), *ids[mid]]
    assert backend.info.fim


def test_other_files_go_first_and_typed_marks_stay_text(coder):
    name, backend, (pre, suf, mid) = coder
    typed = f"# a file that mentions {suf} and {mid}\n"
    tokens = backend.infill_tokens(PREFIX + typed, SUFFIX, extra=[("util.py", "X = 1\n")])
    marks = [backend.native.tokenize(t, add_special=False, parse_special=True)[0]
             for t in (pre, suf, mid)]
    assert [tokens.count(m) for m in marks] == [1, 1, 1]  # only the prompt's own
    before = backend.detokenize(tokens[:tokens.index(marks[0])])  # the other file goes first
    assert "util.py" in before and "X = 1" in before
    assert suf in backend.detokenize(tokens[tokens.index(marks[0]):tokens.index(marks[1])])


def test_what_does_not_fit_keeps_the_text_nearest_the_cursor(coder):
    _, backend, (pre, suf, mid) = coder
    prefix = "".join(f"line_{i} = {i}\n" for i in range(400)) + "last = "
    suffix = "".join(f"after_{i} = {i}\n" for i in range(400))
    tokens = backend.infill_tokens(prefix, suffix, room=200)
    assert len(tokens) <= 200
    pre_at, suf_at, mid_at = (tokens.index(backend.native.tokenize(
        t, add_special=False, parse_special=True)[0]) for t in (pre, suf, mid))
    kept_before = backend.detokenize(tokens[pre_at + 1:suf_at])
    kept_after = backend.detokenize(tokens[suf_at + 1:mid_at])
    assert kept_before.endswith("last = ") and "line_0 =" not in kept_before
    assert kept_after.startswith("after_0 =") and "after_399" not in kept_after
    assert mid_at == len(tokens) - 1


def test_a_model_without_fim_tokens_says_so(smollm2):
    assert not smollm2.info.fim
    with pytest.raises(InvalidRequest, match="fill-in-the-middle"):
        smollm2.infill_tokens(PREFIX, SUFFIX)


def test_a_huge_request_is_cut_to_the_text_nearest_the_cursor_before_it_is_read():
    """Megabytes from an editor are cut by characters before they cross to the runner: the
    prefix's end, the suffix's start, the last other files."""
    from localinfer.chat_formats.fim import Infill

    big = Infill("a" * 1_000_000 + "END", "START" + "b" * 1_000_000,
                 (("old.py", "o" * 1_000_000), ("new.py", "n" * 10)), "p" * 1_000_000)
    cut = big.clipped(100)
    assert cut.prefix.endswith("END") and len(cut.prefix) == 1600
    assert cut.suffix.startswith("START") and len(cut.suffix) == 1600
    assert cut.extra[-1] == ("new.py", "n" * 10) and len(cut.extra[0][1]) == 1590
    assert len(cut.prompt) == 1600
