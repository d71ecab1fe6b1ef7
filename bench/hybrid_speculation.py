"""Speculative decoding (prompt lookup) on a hybrid: a Qwen3.5-shaped model, tokens/s with
and without, the same reply.

Random weights write text no prompt holds, so no guess is ever right and prompt lookup only
pays its checks. The model here copies: it is the Qwen3.5-0.8B shape of bench/hybrid_turns.py
(random Q8_0 weights, Gated DeltaNet layers with one attention layer in four) with every
projection that writes into the residual stream zeroed (attn_output, ssm_out, ffn_down) and
an output layer of its own whose rows are the input embeddings in another order: each layer
still computes at full cost, its recurrent state and KV still kept, but the next token is a
function of the last, a chain through the vocabulary that runs long before it repeats. Its greedy reply to a "code edit" — a prompt that holds a
text S and then begins S again — goes on with the rest of S, as an edit repeats the code it
was given. Prompt lookup guesses it from the prompt; llama.cpp's rollback snapshots (n_rs_seq,
one per guess) take the hybrid's state back where a guess is wrong.

Runs alternate (plain, prompt lookup), greedy, one model loaded at a time in one process;
tok/s is the reply's tokens over the time from its first token to its last (prefill apart:
both read the same prompt, cached by a first short reply).
The replies are checked identical. What this model cannot show: whether a wrong guess's
rollback restores the state right (its output ignores the state); tests/backends/
test_speculative.py checks that on random weights that do not copy.

    python3 bench/hybrid_speculation.py --source LLAMA_CPP_TREE [--reps 5] [--draft 8]

LLAMA_CPP_TREE: llama.cpp's source (the llama-cpp-python sdist's vendor/llama.cpp), whose
models/ give Qwen's tokenizer and Qwen3.5's template.

Writes bench/results/hybrid_speculation.{json,md,png}.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import harness
from random_gguf import qwen35_chat_model

from localinfer.backends.base import LoadOptions, SamplingParams, TokenEvent
from localinfer.backends.llamacpp import LlamaCppBackend

_WRITERS = ("attn_output.weight", "ssm_out.weight", "ffn_down.weight", "ffn_down_exps.weight",
            "ffn_down_shexp.weight")


def copying(path: Path, seed: int = 0) -> int:
    """Make the untied model at `path` copy, in place: zero the tensors that write into the
    residual stream (the next token then depends on the last alone), the final norm's
    weights ones, and each output row another token's input embedding (row j: token σ(j)'s,
    σ a random permutation), so that the last token t gives σ⁻¹(t): a chain through the
    vocabulary that runs long before it repeats. The tensors zeroed."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(path, "r+")
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    zeroed = 0
    for name, tensor in tensors.items():
        if name.endswith(_WRITERS):
            tensor.data[...] = 0  # (zero bytes: a zero scale for every Q8_0 block)
            zeroed += 1
    tensors["output_norm.weight"].data[...] = 1.0
    embd, out = tensors["token_embd.weight"].data, tensors["output.weight"].data
    out[...] = embd[np.random.default_rng(seed).permutation(len(embd))]
    reader.data.flush()
    return zeroed


def _chain(backend: LlamaCppBackend, seed: list[int], n: int) -> list[int]:
    """The greedy reply's tokens to `seed`: n of them, each its event's."""
    generation = backend.generate(seed, SamplingParams(temperature=0, max_tokens=n))
    tokens = [event.token for event in generation if isinstance(event, TokenEvent)]
    if len(tokens) != generation.stats.generated_tokens:
        raise SystemExit(f"{len(tokens)} token events for {generation.stats.generated_tokens} "
                         f"tokens: the chain is not whole")
    return tokens


def _reply(backend: LlamaCppBackend, prompt: list[int], n: int) -> tuple[str, float, object]:
    generation = backend.generate(prompt, SamplingParams(temperature=0, max_tokens=n))
    text = generation.text()
    stats = generation.stats
    decode = stats.token_times[-1] - stats.token_times[0]
    return text, (stats.generated_tokens - 1) / decode, stats


def main() -> None:
    parser = harness.arguments(__doc__, reps=5)
    parser.add_argument("--source", type=Path, required=True,
                        help="llama.cpp's source tree (the sdist's vendor/llama.cpp)")
    parser.add_argument("--draft", type=int, default=8)
    parser.add_argument("--text-tokens", type=int, default=200,
                        help="the length of S, the text the prompt holds")
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()
    runs: dict[str, list[float]] = {"plain": [], "prompt lookup": []}
    with tempfile.TemporaryDirectory() as home:
        path = qwen35_chat_model(args.source, Path(home) / "qwen3.5-0.8b-copying.gguf",
                                 tied_output=False)  # (its output rows: copying's)
        zeroed = copying(path)

        def load(draft: int) -> LlamaCppBackend:
            return LlamaCppBackend(path, LoadOptions(n_ctx=2048, n_slots=1, n_gpu_layers=0,
                                                     draft_tokens=draft), name="qwen3.5-0.8b")

        first = load(0)
        try:
            seed = first.tokenize("def add(a, b):\n    return a + b\n", add_special=False)
            text = seed + _chain(first, seed, args.text_tokens)
        finally:
            first.close()
        begin = len(text) // 4
        prompt = text + text[:begin]  # S, then S begun again: the reply goes on with S
        replies, stats = {}, None
        for rep in range(args.reps):
            pair = (("plain", 0), ("prompt lookup", args.draft))
            for name, draft in pair if rep % 2 == 0 else pair[::-1]:
                # one model loaded at a time: two engines in one process would each decode
                # with an OpenMP team of its own, and every barrier of both then sleeps
                backend = load(draft)
                try:
                    _reply(backend, prompt, 4)  # the prompt read (cached for the next)
                    reply, tps, got = _reply(backend, prompt, args.max_tokens)
                finally:
                    backend.close()
                runs[name].append(tps)
                replies.setdefault(name, reply)
                if name == "prompt lookup":
                    stats = got
                print(rep, name, f"{tps:.1f} tok/s", flush=True)
    same = replies["plain"] == replies["prompt lookup"]
    med = {name: statistics.median(values) for name, values in runs.items()}
    ratios = [b / a for a, b in zip(runs["plain"], runs["prompt lookup"])]
    summary = {"plain_tps": med["plain"], "lookup_tps": med["prompt lookup"],
               "speedup": statistics.median(ratios), "speedups": ratios, "identical": same,
               "acceptance_rate": stats.acceptance_rate, "zeroed_tensors": zeroed,
               "prompt_tokens": len(prompt), "runs": runs}
    meta = harness.run_facts(reps=args.reps, draft=args.draft, text_tokens=args.text_tokens,
                             max_tokens=args.max_tokens)
    lines = ["# Speculative decoding on a hybrid (Qwen3.5-0.8B's shape)", "",
             f"Greedy, {args.max_tokens} tokens after a {len(prompt)}-token prompt that holds a "
             f"text and begins it again; prompt lookup guesses up to {args.draft} tokens a step, "
             f"llama.cpp's rollback snapshots one per guess. The model is Qwen3.5-0.8B's shape "
             f"with random Q8_0 weights and its {zeroed} residual writers zeroed, so that it "
             "copies (see the script's docstring for what that leaves out). tok/s: the reply's "
             f"tokens from its first to its last; medians of {args.reps} alternating runs, "
             "one process.", "",
             "| plain tok/s | prompt lookup tok/s | speedup (each run) | acceptance | same "
             "reply |", "|---|---|---|---|---|",
             f"| {med['plain']:.1f} | {med['prompt lookup']:.1f} | "
             f"**{summary['speedup']:.2f}x** ({' '.join(f'{r:.2f}' for r in ratios)}) | "
             f"{(stats.acceptance_rate or 0):.0%} | {same} |"]
    fig, axes = harness.figure(1, 1, size=(5, 3.6))
    ax = axes[0][0]
    ax.bar(list(med), list(med.values()))
    ax.set(ylabel="tok/s", title="Qwen3.5-0.8B shape (copying), CPU")
    harness.write("hybrid_speculation", meta, summary, lines, fig, folder=args.results)


if __name__ == "__main__":
    main()
