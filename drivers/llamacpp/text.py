"""Incremental detokenization with stop strings.

Tokens arrive as byte pieces; multi-byte UTF-8 characters may be split across
tokens, so bytes go through an incremental decoder that holds incomplete
sequences back. Stop strings may span tokens: text that could still turn into
a stop string is held back until it can't, and the stop string itself is never
emitted; :attr:`TextStream.matched` names the one that ended the text.
"""

from __future__ import annotations

import codecs

_Utf8Decoder = codecs.getincrementaldecoder("utf-8")


class TextStream:
    __slots__ = ("_dec", "_stops", "_held", "_lstrip", "matched")

    def __init__(self, stops: list[str], *, lstrip: bool = False) -> None:
        self._dec = _Utf8Decoder("replace")
        self._stops = stops
        self._held = ""
        self._lstrip = lstrip  # drop leading whitespace (after a "Assistant:" style prompt)
        self.matched: str | None = None  # the stop string that ended the text, once one has

    def feed(self, piece: bytes) -> tuple[str, bool]:
        """Add one token's bytes; return (text safe to emit, stop string hit)."""
        text = self._dec.decode(piece)
        if self._lstrip:
            text = text.lstrip()
            if not text:
                return "", False
            self._lstrip = False
        if not self._stops:
            return text, False
        if not text:
            return "", False
        buf = self._held + text
        cut = -1
        for s in self._stops:
            i = buf.find(s)
            if i >= 0 and (cut < 0 or i < cut):
                cut, self.matched = i, s
        if cut >= 0:
            self._held = ""
            return buf[:cut], True
        keep = 0  # longest tail of buf that is a proper prefix of some stop string
        for s in self._stops:
            for k in range(min(len(s) - 1, len(buf)), keep, -1):
                if buf.endswith(s[:k]):
                    keep = k
                    break
        if keep:
            self._held = buf[-keep:]
            return buf[:-keep], False
        self._held = ""
        return buf, False

    def flush(self) -> str:
        """End of generation (not by a stop string): release everything held."""
        buf = self._held + self._dec.decode(b"", True)
        self._held = ""
        found = [(i, s) for i, s in ((buf.find(s), s) for s in self._stops) if i >= 0]
        if not found:
            return buf
        cut, self.matched = min(found, key=lambda hit: hit[0])
        return buf[:cut]
