"""Pairs of opposite words: two prompts that differ by one of them ask different questions.

A listed antonym (``fast`` / ``slow``, ``buy`` / ``sell``) or one stem under opposite prefixes (``enable`` /
``disable``, ``upload`` / ``download``) sits close to its opposite in embedding space; the lexical check
(:mod:`appliance.cache.lexical`) refuses a cached answer across such a pair.
"""

from __future__ import annotations

_ANTONYMS = [
    ("open", "opened", "opening", "opens"),
    ("close", "closed", "closing", "closes", "shut"),
    ("before", "prior"),
    ("after",),
    ("advantage", "advantages", "pros", "benefit", "benefits"),
    ("disadvantage", "disadvantages", "cons", "drawbacks", "downsides", "risks"),
    ("fast", "faster", "fastest", "quick", "quickest"),
    ("slow", "slower", "slowest"),
    ("happy", "cheerful", "joyful"),
    ("sad", "unhappy", "gloomy"),
    ("win", "won", "wins", "winner"),
    ("lose", "lost", "loses", "loser"),
    ("large", "larger", "largest", "big", "bigger", "biggest"),
    ("small", "smaller", "smallest", "little", "tiny"),
    ("old", "older", "oldest"),
    ("new", "newer", "newest", "young", "younger", "youngest"),
    ("minimum", "min", "lowest"),
    ("maximum", "max", "highest"),
    ("average", "median", "mean"),
    ("minimum", "min", "lowest", "maximum", "max", "highest"),
    ("add", "adding", "create"),
    ("remove", "removing", "delete", "deleting"),
    ("start", "starting", "begin", "beginning", "opening"),
    ("end", "ending", "stop", "finish", "closing", "final"),
    ("accept", "accepting", "approve"),
    ("decline", "declining", "reject", "rejecting", "refuse"),
    ("high", "higher"),
    ("low", "lower"),
    ("hot", "warm", "hotter"),
    ("cold", "cool", "colder"),
    ("buy", "buying", "purchase"),
    ("sell", "selling"),
    ("best", "better"),
    ("worst", "worse"),
    ("more", "most", "many"),
    ("less", "least", "fewer", "few"),
    ("first", "earliest"),
    ("last", "latest"),
    ("left",),
    ("right",),
    ("north", "northern"),
    ("south", "southern"),
    ("east", "eastern"),
    ("west", "western"),
    ("up", "upper"),
    ("down", "lower"),
    ("in", "inside", "into"),
    ("out", "outside"),
    ("on",),
    ("off",),
    ("true",),
    ("false",),
    ("always",),
    ("never", "sometimes"),
    ("all", "every"),
    ("none",),
    ("same", "similar", "similarity", "similarities"),
    ("different", "difference", "differences"),
    ("cheap", "cheapest", "cheaper"),
    ("expensive", "costly", "pricier"),
    ("early", "earlier"),
    ("late", "later"),
    ("long", "longer", "longest"),
    ("short", "shorter", "shortest"),
    ("boiling", "boil"),
    ("freezing", "freeze", "melting"),
    ("husband", "father", "man", "men", "boy", "male"),
    ("wife", "mother", "woman", "women", "girl", "female"),
    ("input",),
    ("output",),
    ("send", "sending"),
    ("receive", "receiving"),
    ("push",),
    ("pull",),
    ("give",),
    ("take",),
    ("import", "importing"),
    ("export", "exporting"),
    ("light",),
    ("dark",),
    ("above", "over"),
    ("below", "under"),
    ("strong", "stronger"),
    ("weak", "weaker"),
    ("rich",),
    ("poor",),
    ("safe", "safest", "safer"),
    ("dangerous", "unsafe", "risky"),
    ("legal", "allowed"),
    ("illegal", "forbidden", "banned"),
    ("plus", "sum"),
    ("minus", "difference"),
    ("multiply", "times", "product"),
    ("divide", "divided", "quotient"),
]
_OPPOSITE_OF: dict[str, set[str]] = {}
for _i in range(0, len(_ANTONYMS), 2):
    _a, _b = _ANTONYMS[_i], _ANTONYMS[_i + 1]
    for _w in _a:
        _OPPOSITE_OF.setdefault(_w, set()).update(_b)
    for _w in _b:
        _OPPOSITE_OF.setdefault(_w, set()).update(_a)
_PREFIXES = (
    "",
    "un",
    "dis",
    "de",
    "in",
    "im",
    "ir",
    "il",
    "non",
    "en",
    "em",
    "ex",
    "up",
    "down",
    "a",
    "anti",
    "pre",
    "post",
    "over",
    "under",
    "as",
    "des",
)


def opposites(only_q: frozenset[str], only_c: frozenset[str]) -> bool:
    """Whether a word only the query uses is the opposite of a word only the candidate uses."""
    for w in only_q:
        if _OPPOSITE_OF.get(w, set()) & only_c:
            return True
        for v in only_c:
            if _prefixed_pair(w, v):
                return True
    return False


def _prefixed_pair(a: str, b: str) -> bool:
    """enable/disable, lock/unlock, upload/download, ascending/descending: one stem, opposite prefixes."""
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    if n < 4 or n < min(len(a), len(b)) // 2:
        return False
    return a[: len(a) - n] in _PREFIXES and b[: len(b) - n] in _PREFIXES and a != b
