import pytest

from localinfer.backends.engine.stop import StopMatcher


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


CODE = "total = 0\n    for x in xs:\n\n        total += x\nprint(total)\n"


@pytest.mark.parametrize("size", [1, 2, 3, len(CODE)])
def test_a_line_less_indented_ends_the_reply_before_it(size):
    """llama-server's n_indent for code completion, however the text is cut into pieces: the
    first line is the cursor's and free; a blank line is no line; the newline before the
    less indented line is not emitted, nor anything after."""
    pieces = [CODE[i:i + size] for i in range(0, len(CODE), size)]
    m = StopMatcher([], min_indent=4)
    out = "".join(m.feed(p) for p in pieces) + m.flush()
    assert out == "total = 0\n    for x in xs:\n\n        total += x" and m.stopped
    m = StopMatcher([], min_indent=5)
    assert "".join(m.feed(p) for p in pieces) + m.flush() == "total = 0"
    m = StopMatcher(["+="], min_indent=4)  # a stop string before the line: it wins
    assert "".join(m.feed(p) for p in pieces) + m.flush() == CODE[:CODE.index("+=")]


def test_whitespace_after_the_last_newline_goes_out_at_the_end():
    m = StopMatcher([], min_indent=4)
    out = [m.feed("a = 1\n  "), m.feed("  ")]
    assert out == ["a = 1", ""] and not m.stopped  # held: its indentation is not known
    assert m.flush() == "\n    "
