"""Incremental detokenization: UTF-8 split across tokens, stop strings across tokens."""

from __future__ import annotations

from appliance.drivers.llamacpp.text import TextStream


def run(pieces: list[bytes], stops: list[str]) -> tuple[str, bool]:
    ts = TextStream(stops)
    out = []
    for p in pieces:
        text, hit = ts.feed(p)
        out.append(text)
        if hit:
            return "".join(out), True
    out.append(ts.flush())
    return "".join(out), False


def test_multibyte_split_across_tokens():
    euro = "€".encode()
    ts = TextStream([])
    assert ts.feed(euro[:1]) == ("", False)
    assert ts.feed(euro[1:2]) == ("", False)
    assert ts.feed(euro[2:] + b"!") == ("€!", False)


def test_stop_spanning_tokens_is_never_emitted():
    ts = TextStream(["END"])
    emitted = []
    for p in [b"hello E", b"N", b"D tail"]:
        text, hit = ts.feed(p)
        emitted.append(text)
        if hit:
            break
    assert hit
    assert "".join(emitted) == "hello "
    assert all("E" not in e for e in emitted)


def test_held_prefix_released_when_it_does_not_become_a_stop():
    assert run([b"a E", b"N", b"x"], ["END"]) == ("a ENx", False)


def test_flush_releases_held_text():
    assert run([b"abc E"], ["END"]) == ("abc E", False)


def test_earliest_of_several_stops():
    assert run([b"one two three"], ["three", "two"]) == ("one ", True)


def test_stop_inside_multibyte_stream():
    s = "naïve→stop".encode()
    assert run([s[:3], s[3:7], s[7:]], ["→"]) == ("naïve", True)


def test_invalid_bytes_become_replacement_char():
    assert run([b"\xff", b"a"], []) == ("\ufffda", False)


def test_lstrip_drops_leading_whitespace_only():
    ts = TextStream([], lstrip=True)
    assert ts.feed(b" ") == ("", False)
    assert ts.feed(b" Paris is") == ("Paris is", False)
    assert ts.feed(b" big") == (" big", False)


def test_the_stop_string_that_ended_the_text_is_named():
    spanning = TextStream(["STOP", "END"])
    assert spanning.feed(b"abc EN") == ("abc ", False) and spanning.matched is None
    assert spanning.feed(b"D and STOP") == ("", True)
    assert spanning.matched == "END"  # the earliest stop in the text, not the first listed
    earliest = TextStream(["END", "STOP"])
    assert earliest.feed(b"x STOP then END") == ("x ", True) and earliest.matched == "STOP"
    plain = TextStream(["STOP"])
    assert plain.feed(b"no stop here") == ("no stop here", False)
    assert plain.flush() == "" and plain.matched is None
