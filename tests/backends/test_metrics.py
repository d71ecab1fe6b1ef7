import pytest

from localinfer.backends.metrics import RequestStats


def _stats() -> RequestStats:
    # submitted at 10.0, slot at 10.5, tokens at 11.0, 11.1, 11.3, 11.6
    return RequestStats(submitted_at=10.0, started_at=10.5, token_times=[11.0, 11.1, 11.3, 11.6],
                        prompt_tokens=120, cached_tokens=20, finish_reason="length")


def test_definitions():
    s = _stats()
    assert s.queue_time == pytest.approx(0.5)
    assert s.ttft == pytest.approx(1.0)
    assert s.e2el == pytest.approx(1.6)
    assert s.itls == pytest.approx([0.1, 0.2, 0.3])
    assert s.tpot == pytest.approx((1.6 - 1.0) / 3)
    assert s.decode_tps == pytest.approx(3 / 0.6)
    assert s.prefill_tps == pytest.approx(100 / 0.5)  # cached tokens are not evaluated
    assert sum(s.itls) == pytest.approx(s.e2el - s.ttft)


def test_ttft_is_the_first_token_the_client_was_shown():
    """A reply whose first tokens a parser held (a call's opening JSON) was shown from its
    third token: TTFT counts to it; prefill and the decode pace still from the first."""
    s = _stats()
    s.shown_from = 2
    assert s.ttft == pytest.approx(1.3)
    assert s.prefill_tps == pytest.approx(100 / 0.5)
    assert s.tpot == pytest.approx((1.6 - 1.0) / 3) and s.decode_tps == pytest.approx(3 / 0.6)
    s.shown_from = 9  # (never past the last token)
    assert s.ttft == pytest.approx(1.6)


def test_no_tokens_and_one_token_have_no_rates():
    empty = RequestStats(submitted_at=1.0, started_at=1.0)
    assert empty.ttft is None and empty.e2el is None and empty.decode_tps is None
    one = RequestStats(submitted_at=1.0, started_at=1.0, token_times=[1.5], prompt_tokens=5)
    assert one.ttft == pytest.approx(0.5)
    assert one.tpot is None and one.decode_tps is None
    assert one.prefill_tps == pytest.approx(10.0)


def test_summary_line_shows_cached_tokens_and_rates():
    line = _stats().summary()
    assert "TTFT 1000 ms" in line
    assert "prompt 120 tok (20 cached) @ 200.0 tok/s" in line
    assert "generated 4 tok @ 5.0 tok/s" in line
    assert "finish: length" in line


def test_figures_survive_the_openai_timings_and_a_stored_chat():
    """The chat app on a server read back TTFT and rates only: the draft, context-shift and
    preemption counts and the durations were lost between the engine and the screen."""
    from localinfer.backends.metrics import Figures

    stats = _stats()
    stats.context_shifts, stats.draft_tokens, stats.accepted_tokens, stats.preemptions = 1, 9, 6, 2
    figures = stats.figures()
    back = Figures.from_timings(figures.to_timings(), figures.finish_reason)
    for name, value in figures.to_dict().items():
        assert getattr(back, name) == (pytest.approx(value, abs=1e-6)
                                       if isinstance(value, float) else value), name
    assert Figures.from_dict(figures.to_dict()) == figures
    assert Figures.from_dict({"ttft_s": 0.2, "an older key": 1}) == Figures(ttft_s=0.2)
    line = figures.line()
    assert "context shifted 1×" in line and "drafts accepted 6/9" in line
    assert "preempted 2×" in line and line.startswith("TTFT 1,000 ms · 5.0 tok/s")
    durations = figures.ollama_durations()
    assert durations["prompt_eval_duration"] == 500_000_000
    assert durations["eval_duration"] == pytest.approx(600_000_000, abs=2)
