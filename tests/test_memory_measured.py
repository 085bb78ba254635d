"""The ledger measures: what it books is what a rank process really holds, and the flavours of data
parallelism rank the same way in both.

tracemalloc counts every buffer a rank allocates after it starts. Around a training step on dp = 4 it
sees a rank's real peak; numpy's own tracemalloc domain, between steps, sees the model state it keeps.
The ledger books weights, gradient buckets or shards and optimizer state from the arrays the strategy
allocates, when it allocates them, so its model state must be what the process holds. Its peak leaves
out what ``minidist.parallel.memory.NOT_BOOKED`` lists (numpy's temporaries, a gradient before it is copied
into its bucket, a collective's copies, the Python objects around the arrays), so it may only fall short of
the real peak, by a bounded amount. Buckets are an eighth of the model, as in a real
run (25 MB buckets, gigabytes of weights): ZeRO-2 keeps one or two of them besides its gradient shard.
With the default 25 MB bucket the toy model is one bucket, which ZeRO-2 holds beside its shard from the
backward's first gradient until it is reduced: then it needs more than ZeRO-1, and both sides say so.
"""

from __future__ import annotations

import minidist as md
from minidist.parallel import ParallelConfig
from minidist.parallel.measured import NOT_BOOKED, measure_held

CFG = md.GPTConfig(vocab_size=64, seq_len=8, d_model=64, n_layers=4, n_heads=4, dtype="float64")
BUCKET = 2**17  # bytes: the model's 1.7 MB of float64 weights make about 13 buckets
FLAVOURS = {"DP": {}, "ZeRO-1": {"zero_stage": 1}, "ZeRO-2": {"zero_stage": 2}, "ZeRO-3": {"zero_stage": 3},
            "FSDP": {"fsdp": True}}


def test_the_ledger_books_what_a_rank_really_holds_and_ranks_the_flavours_alike():
    runs = {name: measure_held(CFG, ParallelConfig(dp=4, bucket_bytes=BUCKET, **f)) for name, f in FLAVOURS.items()}
    for r in range(4):
        m = {name: res[r] for name, res in runs.items()}
        for name, x in m.items():
            # model state: the arrays the ledger booked are the arrays numpy holds between steps
            assert abs(x["ledger_state"] - x["arrays"]) <= 0.10 * x["arrays"], (name, x)
            # the peak: what the ledger leaves out only adds, and stays a bounded part of the real peak
            assert x["ledger_peak"] <= x["peak"], (name, x, NOT_BOOKED)
            assert x["peak"] - x["objects"] - x["ledger_peak"] <= 0.10 * x["peak"], (name, x, NOT_BOOKED)
        for key in ("peak", "ledger_peak"):  # ZeRO-1 < DP, ZeRO-2 < ZeRO-1, ZeRO-3 and FSDP < ZeRO-2
            ratio = {name: x[key] / m["DP"][key] for name, x in m.items()}
            assert ratio["ZeRO-1"] < 1 and ratio["ZeRO-2"] < ratio["ZeRO-1"], (key, ratio)
            assert max(ratio["ZeRO-3"], ratio["FSDP"]) < ratio["ZeRO-2"], (key, ratio)


def test_with_one_bucket_for_the_whole_model_the_ledger_still_ranks_the_flavours_as_the_process():
    # ZeRO-2 allocates the bucket at the backward's first gradient and holds it, full, beside its gradient
    # shard until it is reduced: a whole gradient plus a shard, more than ZeRO-1's standing whole gradient
    runs = {name: measure_held(CFG, ParallelConfig(dp=4, **f)) for name, f in FLAVOURS.items()}
    for r in range(4):
        m = {name: res[r] for name, res in runs.items()}
        for name, x in m.items():
            assert abs(x["ledger_state"] - x["arrays"]) <= 0.10 * x["arrays"], (name, x)
            assert x["ledger_peak"] <= x["peak"], (name, x, NOT_BOOKED)
        for key in ("peak", "ledger_peak"):  # ZeRO-3 and FSDP < ZeRO-1 < ZeRO-2 < DP
            ratio = {name: x[key] / m["DP"][key] for name, x in m.items()}
            assert max(ratio["ZeRO-3"], ratio["FSDP"]) < ratio["ZeRO-1"] < ratio["ZeRO-2"] < 1, (key, ratio)
