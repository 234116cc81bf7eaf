"""Shared thread pools for per-byte work that releases the GIL (hashing, int8 quantising).

A worker's message is hashed and quantised in independent pieces on :data:`WORKER_THREADS`
threads (its cores are otherwise idle while it communicates); a server shard does the same
work on its own one thread, since the server's parallelism is its shards.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")
WORKER_THREADS = max(1, min(4, os.cpu_count() or 1))

_pools: dict[int, ThreadPoolExecutor] = {}
_lock = threading.Lock()


def parallel_map(fn: Callable[[T], R], items: Iterable[T], threads: int) -> list[R]:
    """``[fn(x) for x in items]``, on ``threads`` shared threads when ``threads`` > 1."""
    if threads <= 1:
        return [fn(x) for x in items]
    with _lock:
        if threads not in _pools:
            _pools[threads] = ThreadPoolExecutor(threads, thread_name_prefix="heloco-bytes")
        pool = _pools[threads]
    return list(pool.map(fn, items))
