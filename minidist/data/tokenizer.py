"""A character tokenizer: one token id per character, the simplest exact inverse pair.

``decode(encode(s)) == s`` for any string over the alphabet, which keeps the loss of a tiny model
easy to read: nats per character.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


class CharTokenizer:
    """Maps each character of a fixed alphabet to its index in the sorted alphabet."""

    def __init__(self, alphabet: Iterable[str]) -> None:
        chars = sorted(set(alphabet))
        if not chars or any(len(c) != 1 for c in chars):
            raise ValueError("CharTokenizer: the alphabet must be a non-empty set of single characters")
        self.chars: list[str] = chars
        self._index = {c: i for i, c in enumerate(chars)}
        self._table = np.array(chars)

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        """The tokenizer whose alphabet is exactly the characters that occur in ``text``."""
        return cls(text)

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        """Token ids (int64, shape (len(text),)); raises on a character outside the alphabet."""
        try:
            return np.fromiter((self._index[c] for c in text), dtype=np.int64, count=len(text))
        except KeyError as err:
            raise ValueError(f"CharTokenizer.encode: character {err.args[0]!r} is not in the alphabet") from None

    def decode(self, ids) -> str:
        """The string for a 1-D sequence of ids."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 1:
            raise ValueError(f"CharTokenizer.decode: expected a 1-D sequence of ids, got shape {ids.shape}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"CharTokenizer.decode: ids must lie in [0, {self.vocab_size}), "
                             f"got range [{ids.min()}, {ids.max()}]")
        return "".join(self._table[ids].tolist())

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"
