"""Prompt-lookup drafting for speculative decoding: guess the next tokens from the text so far.

When the last few tokens of a sequence appeared earlier in it (the prompt quoted back, code
being edited, a list continuing), the tokens that followed them then are a good guess for
what follows now. The engine decodes the guesses in the same step as the real next token and
keeps the ones the sampler would have chosen anyway, so the output is exactly what plain
decoding gives — only faster when guesses are right.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ngram_draft"]


def ngram_draft(tokens: Sequence[int], max_draft: int = 8, max_ngram: int = 3,
                min_ngram: int = 2) -> list[int]:
    """Up to `max_draft` tokens that followed the latest earlier match of the sequence's tail.

    The longest tail (max_ngram down to min_ngram tokens) that occurs earlier wins; among its
    occurrences, the latest one.
    """
    n_tokens = len(tokens)
    for n in range(max_ngram, min_ngram - 1, -1):
        if n_tokens <= n:
            continue
        tail = list(tokens[n_tokens - n:])
        last = tail[-1]
        for start in range(n_tokens - n - 1, -1, -1):
            # it runs every step: compare one token before slicing n of them
            if tokens[start + n - 1] == last and list(tokens[start:start + n]) == tail:
                follow = tokens[start + n:start + n + max_draft]
                return list(follow)
    return []
