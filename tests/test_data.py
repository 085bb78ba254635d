"""The toy corpus, the character tokenizer and the batch iterator."""

import hashlib
import subprocess
import sys

import numpy as np
import pytest

import minidist.data as data


def test_corpus_is_a_pure_function_of_the_seed():
    a, b = data.generate(20_000, seed=3), data.generate(20_000, seed=3)
    assert a == b
    assert data.generate(20_000, seed=4) != a
    assert len(data.load_corpus()) >= 200_000


def test_corpus_is_identical_in_another_process():
    code = "import hashlib, minidist.data as d; print(hashlib.sha256(d.load_corpus().encode()).hexdigest())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == hashlib.sha256(data.load_corpus().encode()).hexdigest()


def test_corpus_facts_are_true():
    # The structure a model should learn is really there: every arithmetic and comparison line is correct.
    lines = data.load_corpus().splitlines()
    checked = 0
    for line in lines:
        if " = " in line:
            lhs, rhs = line.rstrip(".").split(" = ")
            assert eval(lhs) == int(rhs), line  # only digits and + - here
            checked += 1
        elif line.startswith("is "):
            a, _, _, b, ans = line.rstrip(".").replace("?", "").split()[1:]
            assert (int(a) > int(b)) == (ans == "yes"), line
            checked += 1
        elif line.startswith("count "):
            nums = [int(x) for x in line.rstrip(".").split()[1:]]
            assert np.all(np.diff(nums) == 1), line
            checked += 1
    assert checked > len(lines) // 3


def test_tokenizer_round_trip_and_errors():
    tok = data.default_tokenizer()
    text = data.load_corpus()[:5000]
    ids = tok.encode(text)
    assert ids.dtype == np.int64 and ids.shape == (5000,)
    assert ids.min() >= 0 and ids.max() < tok.vocab_size
    assert tok.decode(ids) == text
    assert set(data.load_corpus()) <= set(tok.chars)
    with pytest.raises(ValueError, match="not in the alphabet"):
        tok.encode("hello Z")
    with pytest.raises(ValueError, match=r"\[0, 41\)"):
        tok.decode([0, 41])
    assert data.CharTokenizer.from_text("cab").decode([0, 1, 2]) == "abc"


def test_get_batch_shapes_and_shift():
    tokens = np.arange(1000)
    x, y = data.get_batch(tokens, 4, 16, np.random.default_rng(0))
    assert x.shape == y.shape == (4, 16) and x.dtype == np.int64
    np.testing.assert_array_equal(y[:, :-1], x[:, 1:])
    np.testing.assert_array_equal(y, x + 1)  # on arange the next token is the id plus one
    with pytest.raises(ValueError, match="seq_len"):
        data.get_batch(tokens[:10], 2, 10, np.random.default_rng(0))


def test_batches_are_deterministic_per_seed():
    tokens, _ = data.load_tokens()
    a = list(data.batches(tokens, 2, 8, seed=7, steps=3))
    b = list(data.batches(tokens, 2, 8, seed=7, steps=3))
    c = list(data.batches(tokens, 2, 8, seed=8, steps=3))
    assert len(a) == 3
    for (xa, ya), (xb, yb) in zip(a, b):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    assert any(not np.array_equal(xa, xc) for (xa, _), (xc, _) in zip(a, c))


def test_unigram_entropy():
    assert data.unigram_entropy(np.array([3, 3, 3])) == 0.0
    assert data.unigram_entropy(np.arange(8)) == pytest.approx(np.log(8))
    tokens, tok = data.load_tokens()
    h = data.unigram_entropy(tokens)
    assert 2.0 < h < np.log(tok.vocab_size)


def test_train_val_split():
    tr, va = data.train_val_split(np.arange(100), 0.1)
    assert len(tr) == 90 and len(va) == 10 and va[0] == 90
