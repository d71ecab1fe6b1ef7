"""The one definition of request timings, used by the CLI, TUI, API and benchmarks.

All times are seconds on one monotonic clock, taken by the engine thread:

- submitted_at: the request entered the engine's queue
- started_at: a slot took it and prompt processing began
- token_times: the moment each generated token was sampled (the end-of-generation
  token included, since computing it cost a decode step)

- shown_from: which of them the client was shown first (0 unless told otherwise)

From those, with n generated tokens:
- queue time = started_at − submitted_at
- TTFT       = first token shown − submitted_at: time to first token as the client sees
               it. A reply's text is shown as it comes, so that is the first token, unless
               the reply is taken apart as it streams (api/core.py `Job`) and its first
               tokens are held until they can be said: a tool call's opening JSON until its
               name is known, a marker's first characters. Then it is the token with which
               the first piece (content, reasoning, a call's name) went out — for a call,
               when its name reached the client.
- ITL        = gaps between consecutive tokens
- E2EL       = last token − submitted_at
- TPOT       = (E2EL − first token) / (n − 1): the engine's pace, from the first token
               sampled, shown or not (so TTFT + (n − 1) × TPOT = E2EL where it was shown)
- prefill tok/s = prompt tokens evaluated (cached ones excluded) / (first token − started_at)
- decode tok/s  = (n − 1) / (E2EL − first token)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = ["EngineStats", "Figures", "RequestStats"]


@dataclass
class RequestStats:
    submitted_at: float
    started_at: float | None = None
    token_times: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: str | None = None
    context_shifts: int = 0  # times the older half of the context was dropped to go on
    draft_tokens: int = 0  # prompt-lookup guesses decoded (speculative decoding)
    accepted_tokens: int = 0  # guesses that were what the sampler chose anyway
    # times its KV was dropped to make room for older requests in a shared (unified) cache,
    # and rebuilt from its tokens when cells came free
    preemptions: int = 0
    stop_string: str | None = None  # the request's stop string that ended the reply
    # the index in token_times of the first token the client was shown (TTFT's; above)
    shown_from: int = 0

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def generated_tokens(self) -> int:
        return len(self.token_times)

    @property
    def evaluated_prompt_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    @property
    def queue_time(self) -> float | None:
        return None if self.started_at is None else self.started_at - self.submitted_at

    @property
    def ttft(self) -> float | None:
        if not self.token_times:
            return None
        return self.token_times[min(self.shown_from, len(self.token_times) - 1)] \
            - self.submitted_at

    @property
    def e2el(self) -> float | None:
        return self.token_times[-1] - self.submitted_at if self.token_times else None

    @property
    def itls(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def decode_time(self) -> float | None:
        if self.generated_tokens < 2:
            return None
        return self.token_times[-1] - self.token_times[0]

    @property
    def tpot(self) -> float | None:
        decode_time = self.decode_time
        return None if decode_time is None else decode_time / (self.generated_tokens - 1)

    @property
    def decode_tps(self) -> float | None:
        decode_time = self.decode_time
        if not decode_time:
            return None
        return (self.generated_tokens - 1) / decode_time

    @property
    def prefill_time(self) -> float | None:
        if self.started_at is None or not self.token_times:
            return None
        return self.token_times[0] - self.started_at

    @property
    def prefill_tps(self) -> float | None:
        prefill_time = self.prefill_time
        if not prefill_time:
            return None
        return self.evaluated_prompt_tokens / prefill_time

    def figures(self) -> Figures:
        """What these timings come to, as every front end shows, stores and sends them."""
        return Figures(
            prompt_tokens=self.prompt_tokens, cached_tokens=self.cached_tokens,
            generated_tokens=self.generated_tokens, queue_time_s=self.queue_time,
            ttft_s=self.ttft, tpot_s=self.tpot, e2el_s=self.e2el,
            prefill_s=self.prefill_time, decode_s=self.decode_time,
            prefill_tps=self.prefill_tps, decode_tps=self.decode_tps,
            finish_reason=self.finish_reason, context_shifts=self.context_shifts,
            draft_tokens=self.draft_tokens, accepted_tokens=self.accepted_tokens,
            preemptions=self.preemptions)

    def summary(self) -> str:
        return self.figures().summary()


_MS = 1000.0


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else round(value * factor, 6)


@dataclass(frozen=True)
class Figures:
    """One reply's numbers, from the engine to the screen: what `run` prints, the chat app
    shows and stores, and the API sends (OpenAI `timings`, Ollama's durations) — and reads
    back from a server, so that nothing is lost on the way. Seconds, or tokens/s."""

    prompt_tokens: int | None = None  # None: not known (a reply stopped before the engine said)
    cached_tokens: int = 0
    generated_tokens: int = 0
    queue_time_s: float | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2el_s: float | None = None
    prefill_s: float | None = None  # the slot's start to the first token
    decode_s: float | None = None  # the first token to the last
    prefill_tps: float | None = None
    decode_tps: float | None = None
    finish_reason: str | None = None
    context_shifts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    preemptions: int = 0
    reasoning_tokens: int = 0  # of the generated tokens, those a reasoning block took

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Figures:
        """From `to_dict()`'s keys; one written by an older version lacks some: defaults."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def to_timings(self) -> dict[str, Any]:
        """The OpenAI dialect's extra `timings` field, in milliseconds (`prompt_ms`,
        `predicted_ms` and the counts as llama-server names them)."""
        return {
            "queue_ms": _scaled(self.queue_time_s, _MS), "ttft_ms": _scaled(self.ttft_s, _MS),
            "tpot_ms": _scaled(self.tpot_s, _MS), "e2el_ms": _scaled(self.e2el_s, _MS),
            "prompt_ms": _scaled(self.prefill_s, _MS),
            "predicted_ms": _scaled(self.decode_s, _MS),
            "prompt_n": self.prompt_tokens, "cached_n": self.cached_tokens,
            "predicted_n": self.generated_tokens,
            "prefill_tps": self.prefill_tps, "decode_tps": self.decode_tps,
            "draft_n": self.draft_tokens, "draft_n_accepted": self.accepted_tokens,
            "context_shifts": self.context_shifts, "preemptions": self.preemptions,
            "reasoning_n": self.reasoning_tokens,
        }

    @classmethod
    def from_timings(cls, timings: Mapping[str, Any], finish: str | None) -> Figures:
        """`to_timings()` read back (the chat app on a server)."""
        def seconds(key: str) -> float | None:
            return _scaled(timings.get(key), 1 / _MS)

        return cls(
            prompt_tokens=timings.get("prompt_n"), cached_tokens=timings.get("cached_n") or 0,
            generated_tokens=timings.get("predicted_n") or 0,
            queue_time_s=seconds("queue_ms"), ttft_s=seconds("ttft_ms"),
            tpot_s=seconds("tpot_ms"), e2el_s=seconds("e2el_ms"),
            prefill_s=seconds("prompt_ms"), decode_s=seconds("predicted_ms"),
            prefill_tps=timings.get("prefill_tps"), decode_tps=timings.get("decode_tps"),
            finish_reason=finish, context_shifts=timings.get("context_shifts") or 0,
            draft_tokens=timings.get("draft_n") or 0,
            accepted_tokens=timings.get("draft_n_accepted") or 0,
            preemptions=timings.get("preemptions") or 0,
            reasoning_tokens=timings.get("reasoning_n") or 0)

    def ollama_durations(self) -> dict[str, int]:
        """Ollama's prompt and reply durations, in nanoseconds."""
        return {"prompt_eval_duration": int((self.prefill_s or 0) * 1e9),
                "eval_count": self.generated_tokens,
                "eval_duration": int((self.decode_s or 0) * 1e9)}

    def summary(self) -> str:
        """The line `run` prints after a reply: each figure with its rate."""
        parts = []
        if self.ttft_s is not None:
            parts.append(f"TTFT {self.ttft_s * 1000:.0f} ms")
        prompt = f"prompt {self.prompt_tokens or 0} tok"
        if self.cached_tokens:
            prompt += f" ({self.cached_tokens} cached)"
        if self.prefill_tps is not None:
            prompt += f" @ {self.prefill_tps:.1f} tok/s"
        parts.append(prompt)
        gen = f"generated {self.generated_tokens} tok"
        if self.reasoning_tokens:
            gen += f" ({self.reasoning_tokens} reasoning)"
        if self.decode_tps is not None:
            gen += f" @ {self.decode_tps:.1f} tok/s"
        parts.append(gen)
        parts += self._extras()
        if self.finish_reason:
            parts.append(f"finish: {self.finish_reason}")
        return " · ".join(parts)

    def line(self) -> str:
        """The short line under a reply in the chat app, and its status bar's."""
        parts = []
        if self.ttft_s is not None:
            parts.append(f"TTFT {self.ttft_s * 1000:,.0f} ms")
        if self.decode_tps:
            parts.append(f"{self.decode_tps:.1f} tok/s")
        if self.prompt_tokens:  # unknown for a reply stopped before the engine said
            prompt = f"prompt {self.prompt_tokens}"
            if self.cached_tokens:
                prompt += f" ({self.cached_tokens} cached)"
            parts.append(prompt)
        parts.append(f"{self.generated_tokens} generated" + (
            f" ({self.reasoning_tokens} reasoning)" if self.reasoning_tokens else ""))
        parts += self._extras()
        if self.finish_reason not in (None, "stop"):
            parts.append(str(self.finish_reason))
        return " · ".join(parts)

    def _extras(self) -> list[str]:
        """What happened besides the usual: context shifts, guesses, preemptions."""
        extras = []
        if self.context_shifts:
            extras.append(f"context shifted {self.context_shifts}×")
        if self.draft_tokens:
            extras.append(f"drafts accepted {self.accepted_tokens}/{self.draft_tokens}")
        if self.preemptions:
            extras.append(f"preempted {self.preemptions}×")
        return extras


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of one engine, for /metrics and status bars. Counters only grow."""

    n_slots: int
    active: int  # slots with a request (processing its prompt or generating)
    waiting: int  # requests queued for a slot
    kv_cells_used: int  # tokens whose KV the slots hold, finished requests' prefixes included
    kv_cells_total: int
    steps: int  # llama_decode calls
    tokens_evaluated: int  # prompt tokens decoded, cached ones excluded
    tokens_generated: int
    requests_finished: int
    preemptions: int = 0  # requests whose KV was dropped to make room, and later rebuilt
    # context checkpoints restored (a recurrent state gone back to a prompt's earlier
    # point), and the prompt tokens they kept from being read again
    checkpoints_restored: int = 0
    checkpoint_tokens: int = 0
    # slots' sequences saved in RAM when another request took their slot, and put back for
    # a prompt that came back (with the prompt tokens they kept from being read again);
    # the bytes kept now (engine/prompt_cache.py)
    prompts_saved: int = 0
    prompts_restored: int = 0
    restored_tokens: int = 0
    saved_bytes: int = 0
    decode_seconds: float = 0.0  # spent inside llama_decode
    step_seconds: float = 0.0  # spent in steps: filling the batch, llama_decode, sampling
    threads: int = 0  # CPU threads llama.cpp decodes with now (0: not known)

    @property
    def engine_overhead(self) -> float | None:
        """The share of step time the engine spends outside llama.cpp's decode."""
        if not self.step_seconds:
            return None
        return 1 - self.decode_seconds / self.step_seconds
