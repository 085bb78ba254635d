"""Data for the small models of the labs: a generated toy corpus, a character tokenizer, batches.

``tokens, tok = md.data.load_tokens()`` gives the default corpus encoded with its tokenizer.
"""

from __future__ import annotations

import numpy as np

from minidist.data.batches import batches, get_batch, train_val_split, unigram_entropy
from minidist.data.corpus import ALPHABET, SplitMix64, generate, load_corpus
from minidist.data.tokenizer import CharTokenizer


def default_tokenizer() -> CharTokenizer:
    """The character tokenizer for every corpus :func:`generate` can produce (41 symbols)."""
    return CharTokenizer(ALPHABET)


def load_tokens(n_chars: int = 200_000, seed: int = 0) -> tuple[np.ndarray, CharTokenizer]:
    """The default corpus encoded as int64 ids, with the tokenizer that encoded it."""
    tok = default_tokenizer()
    return tok.encode(load_corpus(n_chars, seed)), tok


__all__ = ["ALPHABET", "CharTokenizer", "SplitMix64", "batches", "default_tokenizer", "generate", "get_batch",
           "load_corpus", "load_tokens", "train_val_split", "unigram_entropy"]
