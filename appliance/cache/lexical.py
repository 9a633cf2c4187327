"""The lexical check: whether a cached prompt close to the query in embedding space may share its answer.

Embeddings place "What is 2+2?" and "What is 2+3?" close together, so a candidate above the similarity threshold
must also agree with the query on its numbers, units of measure (:mod:`appliance.cache.measures`), negation, the
things it names, opposite words (:mod:`appliance.cache.opposites`) and the roles around direction words (see
:func:`compatible`); near misses of that kind are the false hits a cache must not serve.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import NamedTuple

from appliance.cache.measures import NUMBER_WORDS, UNIT_OF_SPELLING, measures
from appliance.cache.opposites import opposites

_NUMBER = re.compile(r"\d+(?:[.,:/]\d+)*")
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
    numbers.update(NUMBER_WORDS[w] for w in words if w in NUMBER_WORDS)
    negations = sum(1 for w in words if w in _NEGATION)
    units, quantities = measures(text)
    names = frozenset(n for n in _names(text) if n not in UNIT_OF_SPELLING)  # `Celsius`, `GB`: compared as units
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
    if opposites(q.words - c.words, c.words - q.words):
        return False
    # the same words in another order around a direction word: roles swapped (`miles to km` / `km to miles`)
    return q.words != c.words or _directions(query) == _directions(candidate)


_DIRECTION = {"to", "from", "into", "than", "vs", "versus", "over", "onto", "toward", "towards"}
_FILLER = {"a", "an", "the", "my", "your", "our", "this", "that", "these", "those", "some"}


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
