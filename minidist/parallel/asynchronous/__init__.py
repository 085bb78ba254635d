"""Asynchronous and infrequent synchronisation: replicas that do not wait for one another (chapter 29, lab 20).

Property: the average of replicas that each moved downhill still moves downhill, and sparse updates rarely
collide, so synchronisation can be made rarer (``local_sgd``: Local SGD and DiLoCo average parameters every H
steps), lock-free (``hogwild``: workers write shared parameters without locks) or stale (``async_sgd``: a
parameter server applies each gradient as it arrives, so no worker waits for the slowest). These run on plain
numpy models outside ``train``; the lowest of the strategy packages, they import nothing else of ``parallel``.

Read by lab 20 (asynchrony and local SGD).
"""

from minidist.parallel.asynchronous.async_sgd import AsyncResult, Logistic, train_async, train_sync
from minidist.parallel.asynchronous.hogwild import HogwildResult, SparseLogistic, train_hogwild
from minidist.parallel.asynchronous.local_sgd import DiLoCo, LocalResult, LocalSGD, evaluate, train_local

__all__ = ["AsyncResult", "DiLoCo", "HogwildResult", "LocalResult", "LocalSGD", "Logistic", "SparseLogistic",
           "evaluate", "train_async", "train_hogwild", "train_local", "train_sync"]
