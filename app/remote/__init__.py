"""The team library on S3 storage: push, pull and verify a remote (docs/remote-format.md)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")
WORKERS = 4  # transfers at once: measured, 4 threads download 1.6x faster than one (scripts/remote_bench.py)


def in_order(fn: Callable[[T], R], items: Sequence[T], workers: int, name: str, take: Callable[[int, R], None]) -> None:
    """`fn` over `items` on `workers` threads; `take(k, result)` gets each result in item order. When
    `fn` or `take` raises (an error, a Cancel raised from a progress callback), the items not started
    are never started and the running ones finish before it propagates: no transfer outlives the call."""
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix=f"kvgraft-{name}") as pool:
        futures = [pool.submit(fn, item) for item in items]
        try:
            for k, fut in enumerate(futures):
                take(k, fut.result())
        finally:
            for fut in futures:
                fut.cancel()
