"""Threads around the pass: numpy's BLAS held to one thread, and work started beside the
main thread."""
from __future__ import annotations

import functools
import threading
from typing import Callable


@functools.cache
def _blas_controller():
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def blas_one_thread():
    """A context in which numpy's BLAS (OpenBLAS, MKL) runs on one thread, restored on leaving.

    The pass interleaves torch's OpenMP work with small numpy reductions per layer; OpenBLAS's worker
    threads keep spinning for a while after each call and take the cores torch's threads need next.
    Measured on 2 cores (DeiT-Ti, bench/bench_analysis.py): the pass is about a quarter faster with
    numpy's BLAS on one thread, and numpy's per-layer products are too small to gain from more."""
    return _blas_controller().limit(limits=1, user_api="blas")


def in_background(function: Callable, *args) -> Callable[[], object]:
    """Start ``function(*args)`` on a thread of its own; the callable returned waits for it and gives its
    result, or raises what it raised. A new thread per call (60 µs), not a pool: a pool's workers do not
    survive the fork a ZeroGPU Space runs the pass in."""
    outcome: dict[str, object] = {}

    def work() -> None:
        try:
            outcome["value"] = function(*args)
        except BaseException as exc:  # handed to the caller of `result`
            outcome["error"] = exc

    thread = threading.Thread(target=work, name="vit-inspect-" + getattr(function, "__name__", "work"), daemon=True)
    thread.start()

    def result() -> object:
        thread.join()
        if "error" in outcome:
            raise outcome["error"]  # type: ignore[misc]
        return outcome["value"]
    return result
