"""Units of measure in a prompt: which ones it names and which quantity it puts on each.

Embeddings hardly tell `5 km` from `5 miles`, so the lexical check (:mod:`appliance.cache.lexical`) compares the
units and quantities this module reads. Every unit has one canonical symbol for all its spellings (``kilometres``,
``km`` and ``kms`` are ``km``), and a number may be written in digits or as a word (``five kilometres``).
"""

from __future__ import annotations

import re
from collections import Counter

NUMBER_WORDS = {
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
UNIT_OF_SPELLING = {spelling: unit for unit, spellings in _UNIT_SPELLINGS.items() for spelling in spellings.split()}
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


def measures(text: str) -> tuple[frozenset[str], frozenset[tuple[tuple[str, str], int]]]:
    """The units a prompt names and the (number, unit) pairs it writes: `5 km`, `5km`, `five kilometres`, `$5`."""
    tokens = [t.replace(" ", "") for t in _MEASURE_TOKEN.findall(text.lower().replace("\u2019", "'"))]
    units: set[str] = set()
    quantities: Counter[tuple[str, str]] = Counter()
    previous = ""  # the number just before, if the token before was one
    for i, tok in enumerate(tokens):
        number = tok.replace(",", "") if _DIGITS.match(tok) else NUMBER_WORDS.get(tok, "")
        if number:
            if i and UNIT_OF_SPELLING.get(tokens[i - 1]) in _CURRENCY:
                quantities[(number, UNIT_OF_SPELLING[tokens[i - 1]])] += 1  # $5, €20
            previous = number
            continue
        unit = UNIT_OF_SPELLING.get(tok) or (_UNIT_AFTER_NUMBER.get(tok) if previous and _DIGITS.match(tokens[i - 1]) else None)
        if unit == "degree" and i + 1 < len(tokens) and UNIT_OF_SPELLING.get(tokens[i + 1]) in _TEMPERATURE:
            continue  # `degrees Celsius` is Celsius: the number belongs to the scale
        if unit:
            units.add(unit)
            if previous:
                quantities[(previous, unit)] += 1
        previous = ""
    return frozenset(units), frozenset(quantities.items())
