"""The semantic tier: nearest cached prompt within the same scope, then a lexical check.

Vectors live in the ``cache_entries.embedding`` BLOB column (float32), which
stays the source of truth. Searches run over a numpy matrix per scope
(model + system prompt + earlier turns + sampling parameters), loaded lazily
from the database and kept in step by the cache's writer. At this scale
(entries are capped by ``cache_max_entries``, a scope rarely holds more than a
few thousand) one matrix-vector product per lookup takes well under a
millisecond, so no vector extension is needed — this Python's sqlite3 cannot
load one anyway.

Embeddings place "What is 2+2?" and "What is 2+3?" close together, so a
candidate above the threshold must also agree with the query on its numbers,
units of measure and negation (see :func:`compatible`); near misses of that
kind are the false hits a cache must not serve.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from typing import NamedTuple

import numpy as np

MAX_TEXT_CHARS = 2000  # longer prompts are not matched semantically: small differences drown in them
CANDIDATES = 4

_NUMBER = re.compile(r"\d+(?:[.,:/]\d+)*")
_NUMBER_WORDS = {
    w: str(i)
    for i, w in enumerate(
        [
            "zero",
            "one",
            "two",
            "three",
            "four",
            "five",
            "six",
            "seven",
            "eight",
            "nine",
            "ten",
            "eleven",
            "twelve",
            "thirteen",
            "fourteen",
            "fifteen",
            "sixteen",
            "seventeen",
            "eighteen",
            "nineteen",
            "twenty",
        ]
    )
} | {
    "thirty": "30",
    "forty": "40",
    "fifty": "50",
    "sixty": "60",
    "seventy": "70",
    "eighty": "80",
    "ninety": "90",
    "hundred": "100",
    "thousand": "1000",
    "million": "1000000",
    "billion": "1000000000",
    "first": "1",
    "second": "2",
    "third": "3",
    "fourth": "4",
    "fifth": "5",
    "sixth": "6",
    "seventh": "7",
    "eighth": "8",
    "ninth": "9",
    "tenth": "10",
    "half": "half",
    "double": "double",
    "twice": "twice",
    "last": "last",
}
_NEGATION = {
    "not",
    "no",
    "never",
    "without",
    "none",
    "nobody",
    "nothing",
    "neither",
    "nor",
    "cannot",
    "except",
    "unless",
    "isnt",
    "arent",
    "wasnt",
    "werent",
    "dont",
    "doesnt",
    "didnt",
    "wont",
    "cant",
    "couldnt",
    "wouldnt",
    "shouldnt",
    "hasnt",
    "havent",
    "hadnt",
    "mustnt",
    "neednt",
}
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")
_TOKEN = re.compile(r"[A-Za-z][A-Za-z0-9'-]*")
_SENTENCE = re.compile(r"(?<=[.!?:;])\s+|\n+")


def _words(text: str) -> list[str]:
    """Lower-case words; a possessive 's is dropped, other apostrophes are removed (don't → dont)."""
    return [w[:-2] if w.endswith("'s") else w.replace("'", "") for w in _WORD.findall(text.lower().replace("\u2019", "'"))]


def _names(text: str) -> frozenset[str]:
    """Capitalized words that do not start a sentence, and acronyms: the named things of a prompt."""
    names = set()
    for sentence in _SENTENCE.split(text):
        for i, tok in enumerate(_TOKEN.findall(sentence)):
            if tok == "I" or tok.startswith("I'"):
                continue
            if (i > 0 and tok[0].isupper()) or (len(tok) > 1 and tok.isupper()):
                names.add(tok.lower())
    return frozenset(names)


class Signature(NamedTuple):
    """What a prompt says that its embedding barely sees."""

    numbers: frozenset[tuple[str, int]]
    """Each number (digits, or a number word as digits) with how often it occurs."""
    negations: int
    """How many negation words it uses."""
    names: frozenset[str]
    """Named things (capitalized words, acronyms), lower-cased; unit names are left to ``units``."""
    words: frozenset[str]
    units: frozenset[str]
    """Units of measure and currencies named, as canonical symbols (``kilometres`` and ``km`` are ``km``)."""
    quantities: frozenset[tuple[tuple[str, str], int]]
    """Each (number, unit) written together (``5 km``, ``five kilometres``, ``$5``), with how often it occurs."""


def signature(text: str) -> Signature:
    """The :class:`Signature` of a prompt."""
    words = _words(text)
    numbers = Counter(n.replace(",", "") for n in _NUMBER.findall(text))
    numbers.update(_NUMBER_WORDS[w] for w in words if w in _NUMBER_WORDS)
    negations = sum(1 for w in words if w in _NEGATION)
    units, quantities = _measures(text)
    names = frozenset(n for n in _names(text) if n not in _UNIT)  # `Celsius`, `GB`: compared as units
    return Signature(frozenset(numbers.items()), negations, names, frozenset(words), units, quantities)


def compatible(query: str, candidate: str) -> bool:
    """Whether two similar prompts may share an answer.

    Sentence embeddings are known to be nearly blind to numbers, negation,
    antonyms, units and swapped roles, so beyond the similarity threshold the
    two prompts must have the same numbers and as many negations, name the same
    units of measure with the same quantity on each (`5 km` / `5 miles`,
    `5 km and 3 miles` / `3 km and 5 miles` differ; `5 km` / `five kilometres`
    do not), name the same things (case-insensitively), use no pair of
    opposites (a listed antonym, or one word that is the other with an
    opposite prefix: enable/disable, upload/download), and, when they use the
    very same words, put the same word after each direction word
    (`from English to German` / `from German to English`).
    """
    q, c = signature(query), signature(candidate)
    if q.numbers != c.numbers or q.negations != c.negations:
        return False
    if q.units != c.units or q.quantities != c.quantities:
        return False
    if not (all(_in(n, c.words) for n in q.names) and all(_in(n, q.words) for n in c.names)):
        return False
    if _opposites(q.words - c.words, c.words - q.words):
        return False
    # the same words in another order around a direction word: roles swapped (`miles to km` / `km to miles`)
    return q.words != c.words or _directions(query) == _directions(candidate)


#: Canonical unit symbol: its spellings. Ambiguous short forms (``m``, ``g``, ``l``, ``h``) count only right after a number.
_UNIT_SPELLINGS = {
    "km": "km kms kilometre kilometres kilometer kilometers",
    "m": "metre metres meter meters",
    "cm": "cm centimetre centimetres centimeter centimeters",
    "mm": "mm millimetre millimetres millimeter millimeters",
    "mile": "mile miles mi",
    "yard": "yard yards yd yds",
    "foot": "foot feet ft",
    "inch": "inch inches",
    "kg": "kg kgs kilogram kilograms kilo kilos",
    "g": "gram grams gramme grammes",
    "mg": "mg milligram milligrams",
    "lb": "lb lbs pound pounds",
    "oz": "oz ounce ounces",
    "ton": "ton tons",
    "tonne": "tonne tonnes",
    "l": "litre litres liter liters",
    "ml": "ml millilitre millilitres milliliter milliliters",
    "gallon": "gallon gallons gal",
    "quart": "quart quarts",
    "pint": "pint pints",
    "cup": "cup cups",
    "tbsp": "tbsp tablespoon tablespoons",
    "tsp": "tsp teaspoon teaspoons",
    "ms": "ms millisecond milliseconds",
    "s": "sec secs seconds",
    "minute": "minute minutes mins",
    "hour": "hour hours hr hrs",
    "day": "day days",
    "week": "week weeks",
    "month": "month months",
    "year": "year years yr yrs",
    "decade": "decade decades",
    "century": "century centuries",
    "celsius": "celsius centigrade °c",
    "fahrenheit": "fahrenheit °f",
    "kelvin": "kelvin",
    "degree": "degree degrees °",
    "mph": "mph",
    "kph": "kph km/h kmh",
    "acre": "acre acres",
    "hectare": "hectare hectares",
    "bit": "bit bits",
    "byte": "byte bytes",
    "kb": "kb kilobyte kilobytes",
    "mb": "mb megabyte megabytes",
    "gb": "gb gigabyte gigabytes",
    "tb": "tb terabyte terabytes",
    "kib": "kib kibibyte kibibytes",
    "mib": "mib mebibyte mebibytes",
    "gib": "gib gibibyte gibibytes",
    "tib": "tib tebibyte tebibytes",
    "w": "watt watts",
    "kw": "kw kilowatt kilowatts",
    "kwh": "kwh",
    "v": "volt volts",
    "a": "amp amps ampere amperes",
    "kcal": "kcal calorie calories cal",
    "j": "joule joules",
    "percent": "percent percentage %",
    "usd": "$ usd dollar dollars",
    "eur": "€ eur euro euros",
    "gbp": "£ gbp",
    "jpy": "¥ jpy yen",
    "cent": "cent cents",
}
_UNIT = {spelling: unit for unit, spellings in _UNIT_SPELLINGS.items() for spelling in spellings.split()}
_UNIT_AFTER_NUMBER = {
    "m": "m",
    "g": "g",
    "l": "l",
    "h": "hour",
    "s": "s",
    "min": "minute",
    "c": "celsius",
    "f": "fahrenheit",
    "k": "kelvin",
    "w": "w",
    "v": "v",
    "b": "byte",
}
_CURRENCY = frozenset({"usd", "eur", "gbp", "jpy"})
_TEMPERATURE = frozenset({"celsius", "fahrenheit", "kelvin"})
_MEASURE_TOKEN = re.compile(r"\d+(?:[.,]\d+)*|[a-z]+(?:/[a-z]+)?|°\s?[cf]?|[$€£¥%]")
_DIGITS = re.compile(r"\d")


def _measures(text: str) -> tuple[frozenset[str], frozenset[tuple[tuple[str, str], int]]]:
    """The units a prompt names and the (number, unit) pairs it writes: `5 km`, `5km`, `five kilometres`, `$5`."""
    tokens = [t.replace(" ", "") for t in _MEASURE_TOKEN.findall(text.lower().replace("\u2019", "'"))]
    units: set[str] = set()
    quantities: Counter[tuple[str, str]] = Counter()
    previous = ""  # the number just before, if the token before was one
    for i, tok in enumerate(tokens):
        number = tok.replace(",", "") if _DIGITS.match(tok) else _NUMBER_WORDS.get(tok, "")
        if number:
            if i and _UNIT.get(tokens[i - 1]) in _CURRENCY:
                quantities[(number, _UNIT[tokens[i - 1]])] += 1  # $5, €20
            previous = number
            continue
        unit = _UNIT.get(tok) or (_UNIT_AFTER_NUMBER.get(tok) if previous and _DIGITS.match(tokens[i - 1]) else None)
        if unit == "degree" and i + 1 < len(tokens) and _UNIT.get(tokens[i + 1]) in _TEMPERATURE:
            continue  # `degrees Celsius` is Celsius: the number belongs to the scale
        if unit:
            units.add(unit)
            if previous:
                quantities[(previous, unit)] += 1
        previous = ""
    return frozenset(units), frozenset(quantities.items())


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
_DIRECTION = {"to", "from", "into", "than", "vs", "versus", "over", "onto", "toward", "towards"}
_FILLER = {"a", "an", "the", "my", "your", "our", "this", "that", "these", "those", "some"}


def _opposites(only_q: frozenset[str], only_c: frozenset[str]) -> bool:
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


def _directions(text: str) -> list[tuple[str, str]]:
    words = _words(text)
    out = []
    for i, w in enumerate(words):
        if w in _DIRECTION:
            nxt = next((v for v in words[i + 1 :] if v not in _FILLER), "")
            out.append((w, nxt))
    return out


def _in(name: str, words: frozenset[str]) -> bool:
    return all(part in words for part in _words(name))


class _Scope:
    """One scope's unit vectors in a buffer that grows by doubling, so an insert is amortised O(1)."""

    def __init__(self, dim: int, ids: list[int], vectors: list[np.ndarray], texts: list[str]):
        capacity = max(16, len(ids))
        self.buf = np.zeros((capacity, dim), dtype=np.float32)
        self.ids = np.zeros(capacity, dtype=np.int64)
        self.n = len(ids)
        if vectors:
            self.buf[: self.n] = np.vstack(vectors)
            self.ids[: self.n] = ids
        self.texts = list(texts)

    @property
    def vectors(self) -> np.ndarray:
        return self.buf[: self.n]

    def put(self, entry_id: int, vector: np.ndarray, text: str) -> None:
        found = np.flatnonzero(self.ids[: self.n] == entry_id)
        if len(found):
            row = int(found[0])
            self.buf[row], self.texts[row] = vector, text
            return
        if self.n == len(self.ids):
            self.buf = np.concatenate([self.buf, np.zeros_like(self.buf)])
            self.ids = np.concatenate([self.ids, np.zeros_like(self.ids)])
        self.buf[self.n], self.ids[self.n] = vector, entry_id
        self.texts.append(text)
        self.n += 1

    def drop(self, entry_ids: np.ndarray) -> None:
        keep = ~np.isin(self.ids[: self.n], entry_ids)
        if keep.all():
            return
        kept = int(keep.sum())
        self.buf[:kept] = self.buf[: self.n][keep]
        self.ids[:kept] = self.ids[: self.n][keep]
        self.texts = [t for t, k in zip(self.texts, keep, strict=True) if k]
        self.n = kept


Loader = Callable[[str], Iterable[tuple[int, bytes, str]]]


class SemanticIndex:
    """Per-scope matrices of unit vectors, loaded on first use through ``loader(scope)``."""

    def __init__(self, loader: Loader, dim: int):
        self._loader = loader
        self.dim = dim
        self._scopes: dict[str, _Scope] = {}
        self._lock = threading.RLock()

    def _scope(self, scope: str) -> _Scope:
        s = self._scopes.get(scope)
        if s is None:
            ids, vectors, texts = [], [], []
            for entry_id, blob, text in self._loader(scope):
                vec = np.frombuffer(blob, dtype=np.float32)
                if vec.shape[0] != self.dim:
                    continue
                ids.append(entry_id)
                vectors.append(vec)
                texts.append(text or "")
            s = _Scope(self.dim, ids, vectors, texts)
            self._scopes[scope] = s
        return s

    def search(self, scope: str, vector: np.ndarray, threshold: float, text: str) -> tuple[int, float] | None:
        """The best entry at or above ``threshold`` that passes :func:`compatible`, as (id, similarity)."""
        with self._lock:
            s = self._scope(scope)
            if not s.n:
                return None
            sims = s.vectors @ vector.astype(np.float32)
            order = np.argsort(-sims)[:CANDIDATES]
            for i in order:
                sim = float(sims[i])
                if sim < threshold:
                    return None
                if compatible(text, s.texts[i]):
                    return int(s.ids[i]), sim
        return None

    def add(self, scope: str, entry_id: int, vector: np.ndarray, text: str) -> None:
        """Record a stored entry in a loaded scope (unloaded scopes read it from the database later)."""
        with self._lock:
            s = self._scopes.get(scope)
            if s is not None:
                s.put(entry_id, vector.astype(np.float32).reshape(-1), text)

    def remove(self, entry_ids: Iterable[int]) -> None:
        drop = np.fromiter(entry_ids, dtype=np.int64)
        if not len(drop):
            return
        with self._lock:
            for s in self._scopes.values():
                if s.n:
                    s.drop(drop)

    def clear(self) -> None:
        with self._lock:
            self._scopes.clear()

    def vectors_loaded(self) -> int:
        with self._lock:
            return sum(s.n for s in self._scopes.values())
