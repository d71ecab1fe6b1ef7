"""The one definition of request timings, used by the CLI, TUI, API and benchmarks.

All times are seconds on one monotonic clock, taken by the engine thread:

- submitted_at: the request entered the engine's queue
- started_at: a slot took it and prompt processing began
- token_times: the moment each generated token was sampled (the end-of-generation
  token included, since computing it cost a decode step)

From those, with n generated tokens:
- queue time = started_at − submitted_at
- TTFT       = first token − submitted_at
- ITL        = gaps between consecutive tokens
- E2EL       = last token − submitted_at
- TPOT       = (E2EL − TTFT) / (n − 1)
- prefill tok/s = prompt tokens evaluated (cached ones excluded) / (first token − started_at)
- decode tok/s  = (n − 1) / (E2EL − TTFT)
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["EngineStats", "RequestStats"]


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
        return self.token_times[0] - self.submitted_at if self.token_times else None

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

    def summary(self) -> str:
        """One line for humans: the stats line after each reply."""
        parts = []
        if self.ttft is not None:
            parts.append(f"TTFT {self.ttft * 1000:.0f} ms")
        prompt = f"prompt {self.prompt_tokens} tok"
        if self.cached_tokens:
            prompt += f" ({self.cached_tokens} cached)"
        if self.prefill_tps is not None:
            prompt += f" @ {self.prefill_tps:.1f} tok/s"
        parts.append(prompt)
        gen = f"generated {self.generated_tokens} tok"
        if self.decode_tps is not None:
            gen += f" @ {self.decode_tps:.1f} tok/s"
        parts.append(gen)
        if self.context_shifts:
            parts.append(f"context shifted {self.context_shifts}×")
        if self.draft_tokens:
            parts.append(f"drafts accepted {self.accepted_tokens}/{self.draft_tokens}")
        if self.finish_reason:
            parts.append(f"finish: {self.finish_reason}")
        return " · ".join(parts)

    def to_dict(self) -> dict[str, float | int | str | None]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "generated_tokens": self.generated_tokens,
            "queue_time_s": self.queue_time,
            "ttft_s": self.ttft,
            "tpot_s": self.tpot,
            "e2el_s": self.e2el,
            "prefill_tps": self.prefill_tps,
            "decode_tps": self.decode_tps,
            "finish_reason": self.finish_reason,
            "context_shifts": self.context_shifts,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "preemptions": self.preemptions,
        }


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
    decode_seconds: float = 0.0  # spent inside llama_decode
    step_seconds: float = 0.0  # spent in steps: filling the batch, llama_decode, sampling
    threads: int = 0  # CPU threads llama.cpp decodes with now (0: not known)

    @property
    def engine_overhead(self) -> float | None:
        """The share of step time the engine spends outside llama.cpp's decode."""
        if not self.step_seconds:
            return None
        return 1 - self.decode_seconds / self.step_seconds
