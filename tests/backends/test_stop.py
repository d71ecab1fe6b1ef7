from localinfer.backends.stop import StopMatcher


def _run(stops, pieces):
    m = StopMatcher(stops)
    out = [m.feed(p) for p in pieces]
    return out, m.flush(), m.stopped


def test_stop_split_across_pieces_is_never_emitted():
    out, tail, stopped = _run(["</end>"], ["Hello </", "en", "d> more"])
    assert out == ["Hello ", "", ""]
    assert stopped and tail == ""


def test_partial_match_that_fails_is_released():
    out, tail, stopped = _run(["STOP"], ["a ST", "ART b"])
    assert "".join(out) + tail == "a START b"
    assert out[0] == "a "  # "ST" held back until it proved harmless
    assert not stopped


def test_held_text_is_flushed_at_the_end():
    out, tail, stopped = _run(["###"], ["x #", "#"])
    assert "".join(out) == "x " and tail == "##" and not stopped


def test_earliest_of_several_stops_wins():
    out, _, stopped = _run(["b", "cd"], ["a", "cdb"])
    assert "".join(out) == "a" and stopped


def test_no_stops_passes_through():
    out, tail, stopped = _run([], ["a", "b"])
    assert out == ["a", "b"] and tail == "" and not stopped
