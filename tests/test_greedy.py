"""The reference walk of tests/greedy.py, where a reply's text parts into tokens otherwise
than the reference's likeliest choice."""

from __future__ import annotations

import llama_cpp
import numpy
import pytest

from .greedy import MARGIN


def test_a_near_tie_whose_tokens_both_begin_the_reply_is_followed(smollm2, smollm2_reference):
    """After "The answer is", smollm2 ranks " " and ' "' within the margin (an eight-stream
    server run took ' "' and wrote 'The answer is "2"'). " " begins ' "2"' too: a walk that
    took it would find '"' none of the next choices and call a right reply wrong. The reply
    built on the less likely of the two is followed; a reply off both is not."""
    ref = smollm2_reference
    prompt = smollm2.tokenize(smollm2.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 2?"}]))
    head = "The answer is"
    llama_cpp.llama_memory_clear(ref.model.memory, True)
    logits = ref._decode(prompt + smollm2.tokenize(head, add_special=False))
    space, quote = (smollm2.tokenize(t, add_special=False) for t in (" ", ' "'))
    assert len(space) == len(quote) == 1
    best = float(logits.max())
    assert logits[space[0]] >= best - MARGIN and logits[quote[0]] >= best - MARGIN
    second = min((space[0], quote[0]), key=lambda t: logits[t])
    # the reply along the second choice, as the reference goes on from it
    tail, token = [], second
    for _ in range(4):
        tail.append(token)
        token = int(numpy.argmax(ref._decode([token])))
    text = head + smollm2.detokenize(tail)
    assert ref.follows(prompt, text) >= 4
    with pytest.raises(AssertionError, match="none of the reference's choices"):
        ref.follows(prompt, head + ' "7 apples')
