"""A toy language generated from a seed: small, structured, identical on every machine.

A language model only has something to learn if the text has structure beyond letter counts.
This corpus mixes four kinds of sentences, each with a rule a model can discover:

* agreement: ``the red fox sees a small bird.`` / ``the foxes see ...`` (a plural subject takes
  a plural verb, and determiners match the noun);
* arithmetic facts: ``7 + 5 = 12.`` and ``9 - 4 = 5.`` (the answer is a function of the question);
* counting: ``count 3 4 5 6.`` (each number is the previous one plus one);
* comparisons: ``is 8 more than 3? yes.`` (the answer follows from the two numbers).

The random choices come from splitmix64, a tiny generator written out below, not numpy's: the
text must be bitwise identical across numpy versions and processes because every rank of a
data-parallel run reads the same corpus. Nothing is downloaded.
"""

from __future__ import annotations

from functools import lru_cache

_MASK = (1 << 64) - 1


class SplitMix64:
    """The splitmix64 generator (Steele, Lea, Flood 2014): 64-bit state, one add and two multiplies."""

    def __init__(self, seed: int) -> None:
        self.state = seed & _MASK

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        """An integer in [0, n); the modulo bias is below 2**-50 for the small n used here."""
        return self.next() % n

    def choice(self, items):
        return items[self.below(len(items))]


_ADJECTIVES = ["red", "small", "old", "quick", "green", "tall", "quiet", "happy"]
# (singular, plural)
_NOUNS = [("fox", "foxes"), ("cat", "cats"), ("bird", "birds"), ("dog", "dogs"), ("child", "children"),
          ("farmer", "farmers"), ("mouse", "mice"), ("teacher", "teachers")]
# (third person singular, plural)
_VERBS = [("sees", "see"), ("likes", "like"), ("follows", "follow"), ("finds", "find"),
          ("watches", "watch"), ("helps", "help")]
_PLACES = ["in the garden", "near the river", "on the hill", "at home", "in the barn"]


def _noun_phrase(rng: SplitMix64) -> tuple[str, bool]:
    noun = rng.choice(_NOUNS)
    plural = rng.below(2) == 1
    det = rng.choice(["the", "some", "two"] if plural else ["the", "a", "one"])
    words = [det]
    if rng.below(2):
        words.append(rng.choice(_ADJECTIVES))
    words.append(noun[1] if plural else noun[0])
    return " ".join(words), plural


def _agreement(rng: SplitMix64) -> str:
    subject, plural = _noun_phrase(rng)
    verb = rng.choice(_VERBS)[1 if plural else 0]
    obj, _ = _noun_phrase(rng)
    tail = " " + rng.choice(_PLACES) if rng.below(3) == 0 else ""
    return f"{subject} {verb} {obj}{tail}."


def _arithmetic(rng: SplitMix64) -> str:
    a, b = rng.below(10), rng.below(10)
    if rng.below(2):
        return f"{a} + {b} = {a + b}."
    a, b = max(a, b), min(a, b)  # keep answers non-negative
    return f"{a} - {b} = {a - b}."


def _counting(rng: SplitMix64) -> str:
    start, n = rng.below(10), 3 + rng.below(4)
    return "count " + " ".join(str(start + i) for i in range(n)) + "."


def _comparison(rng: SplitMix64) -> str:
    a, b = rng.below(10), rng.below(10)
    return f"is {a} more than {b}? {'yes' if a > b else 'no'}."


#: Every character the generator can emit (the default tokenizer's alphabet).
ALPHABET: str = "".join(sorted(set(
    "".join(_ADJECTIVES) + "".join(a + b for a, b in _NOUNS) + "".join(a + b for a, b in _VERBS) + "".join(_PLACES)
    + "the a some two one count is more than yes no" + "0123456789" + " .+-=?\n"
)))

_KINDS = [_agreement, _agreement, _arithmetic, _counting, _comparison]


def generate(n_chars: int = 200_000, seed: int = 0) -> str:
    """Text of at least ``n_chars`` characters, one sentence per line, a pure function of ``seed``."""
    if n_chars < 0:
        raise ValueError(f"generate: n_chars must be >= 0, got {n_chars}")
    rng = SplitMix64(seed)
    lines, size = [], 0
    while size < n_chars:
        line = rng.choice(_KINDS)(rng)
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines) + "\n"


@lru_cache(maxsize=4)
def load_corpus(n_chars: int = 200_000, seed: int = 0) -> str:
    """The default corpus (about 200 KB), generated once per process and cached."""
    return generate(n_chars, seed)
