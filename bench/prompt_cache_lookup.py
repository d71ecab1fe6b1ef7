"""What finding a request's saved conversation costs the engine as more are kept.

    python3 bench/prompt_cache_lookup.py [--saved 10 100 1000 4000] [--reps 5]
                                         [--results FOLDER]

The prompt cache (backends/engine/prompt_cache.py) keeps conversations a slot dropped, up to
--cache-ram (8 GiB by default: a thousand or more on a small model), and every request that
starts asks it for the one its prompt shares the most with, then whether what its slot
held is saved already. The engine's one thread does that between steps: every stream waits.
Here `PromptCache.swap` runs as a request's start calls it, over N saved conversations
behind one 500-token system prompt (each a 50-400-token tail of its own), against the same
cache looking at each saved sequence in turn, as it did before it kept them in order (the
baseline: the loop it had, copied here). Two requests: a conversation coming back, its last
reply regenerated (its slot holds another conversation with the same system prompt), and a
new conversation in an empty slot (every saved one shares its 500 tokens: the cache picks
the least to copy of them all). llama.cpp is not called: the model's state is a stand-in
(4 bytes a token: its size only ranks the candidates), its copy back free, so what is
timed is the lookup alone. Reported: µs per request, medians of rounds in alternating
order, and each round's ratio. Writes bench/results/prompt_cache_lookup.{json,md,png}.
"""

from __future__ import annotations

import ctypes
import random
import statistics
import time

import harness
from localinfer.backends.engine.draft import common_prefix
from localinfer.backends.engine.prompt_cache import PromptCache
from localinfer.backends.engine.slots import Slot

SYSTEM = 500  # tokens of the shared system prompt
PER_TOKEN = 4  # bytes of the stand-in state per token
REQUESTS = 200  # timed per round and case


class _States:
    """The model as the prompt cache sees it: states of a size, copied back at no cost."""
    stateful = windowed = False

    def __init__(self):
        self.size = 0

    def save_sequence(self, seq: int, limit: int | None = None) -> ctypes.Array:
        return (ctypes.c_uint8 * self.size)()

    def restore_sequence(self, seq: int, data: ctypes.Array) -> bool:
        return True


class _EachOne(PromptCache):
    """The cache as it was: every saved sequence compared with each prompt, three times."""

    def _best(self, tokens, limit, have, room, token_s):
        best, shared = None, max(have, self.MIN_TOKENS - 1)
        for saved in self._saved:
            n = self._keeps(saved, min(common_prefix(saved.tokens, tokens), limit))
            if (n > shared and len(saved.tokens) <= room
                    and self._worth_copying(saved, n, n - have, token_s)):
                best, shared = saved, n
        return best, shared

    def _holds(self, tokens):
        return any(common_prefix(s.tokens, tokens) == len(tokens) for s in self._saved)

    def _keep(self, saved):
        self._drop([s for s in self._saved
                    if common_prefix(s.tokens, saved.tokens) == len(s.tokens)])
        super()._keep(saved)


def _conversations(n: int, rng: random.Random) -> list[list[int]]:
    system = [rng.randrange(1000, 49000) for _ in range(SYSTEM)]
    return [system + [rng.randrange(1000, 49000) for _ in range(rng.randrange(50, 400))]
            for _ in range(n)]


def _filled(kind: type[PromptCache], conversations: list[list[int]]) -> PromptCache:
    states = _States()
    cache = kind(states, max_bytes=1 << 62)
    cache.give_back = lambda fresh_s=0.0: 1 << 62  # (not the machine's memory: the lookup)
    for i, tokens in enumerate(conversations):
        states.size = PER_TOKEN * len(tokens)
        cache.save(Slot(0, cache=tokens))
    assert len(cache) == len(conversations)
    return cache


def _requests(conversations: list[list[int]], case: str, rng: random.Random):
    """(slot's tokens, prompt, have, own) for each timed request of a case."""
    out = []
    for _ in range(REQUESTS):
        back, other = rng.sample(conversations, 2)
        if case == "returning":
            prompt = back[:-20] + [rng.randrange(1000, 49000) for _ in range(40)]
            out.append((other, prompt, SYSTEM, SYSTEM))
        else:
            prompt = back[:SYSTEM] + [rng.randrange(1000, 49000) for _ in range(40)]
            out.append(([], prompt, 0, 0))
    return out


def _time(cache: PromptCache, requests) -> tuple[float, int]:
    """µs per request through swap, and how many had a saved sequence put back."""
    slot, restored = Slot(0), cache.restored
    started = time.perf_counter()
    for held, prompt, have, own in requests:
        slot.cache = held
        cache.swap(slot, prompt, len(prompt) - 1, have, own, 1 << 20, 1e-3)
    return (time.perf_counter() - started) / len(requests) * 1e6, cache.restored - restored


def main() -> None:
    parser = harness.arguments(__doc__, reps=5)
    parser.add_argument("--saved", type=int, nargs="+", default=[10, 100, 1000, 4000])
    args = parser.parse_args()
    rng = random.Random(0)
    rows, results = [], []
    for n in args.saved:
        conversations = _conversations(n, rng)
        caches = {"in order": _filled(PromptCache, conversations),
                  "each one": _filled(_EachOne, conversations)}
        for case in ("returning", "new"):
            requests = _requests(conversations, case, rng)
            rounds = {name: [] for name in caches}
            for r in range(args.reps):
                for name in (caches if r % 2 == 0 else reversed(list(caches))):
                    us, restored = _time(caches[name], requests)
                    assert restored == len(requests)  # (each request found one)
                    assert len(caches[name]) == n  # (none handed over: all lent a start)
                    rounds[name].append(us)
            ratios = [b / a for a, b in zip(rounds["in order"], rounds["each one"])]
            new, old = (statistics.median(rounds[k]) for k in ("in order", "each one"))
            results.append(dict(saved=n, case=case, rounds_us=rounds, ratios=ratios,
                                in_order_us=new, each_one_us=old))
            rows.append((n, case, f"{old:.0f}", f"{new:.0f}", f"{statistics.median(ratios):.1f}x",
                         ", ".join(f"{x:.1f}" for x in ratios)))
            print(rows[-1], flush=True)
    lines = ["# Finding a request's saved conversation (prompt cache lookup)", "",
             "µs per request through `PromptCache.swap` (the engine's thread, between steps),"
             f" with N conversations saved behind one {SYSTEM}-token system prompt; medians of"
             f" {args.reps} rounds of {REQUESTS} requests, alternating order.", ""]
    lines += harness.markdown_table(
        ["saved", "request", "each one compared (µs)", "in order (µs)", "speed-up",
         "each round"], rows)
    fig, axes = harness.figure(ncols=2, size=(5, 4))
    for ax, case in zip(axes[0], ("returning", "new")):
        mine = [r for r in results if r["case"] == case]
        for key, label in (("each_one_us", "each one compared"), ("in_order_us", "in order")):
            ax.plot([r["saved"] for r in mine], [r[key] for r in mine], marker="o", label=label)
        ax.set(xscale="log", yscale="log", xlabel="conversations saved",
               ylabel="µs per request", title=f"{case} conversation")
        ax.legend()
    harness.write("prompt_cache_lookup", harness.run_facts(reps=args.reps, system=SYSTEM),
                  results, lines, fig, args.results)


if __name__ == "__main__":
    main()
