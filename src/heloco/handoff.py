"""Tensors handed to ``torch.distributed`` collectives, held until the backend lets go of them.

Why: a collective's work object keeps its tensors for a moment after the collective is
complete (gloo frees it on its worker thread once that thread gets round to it; other
backends' threads may do the same). If the tensor's Python object dies first, torch hands the
Python object over to the C++ tensor (PyObject preservation), and the backend thread later
needs the GIL to free it. Once the interpreter has begun to finalise, a thread that asks for
the GIL is ended with ``pthread_exit``; its unwind through a ``noexcept`` destructor calls
``std::terminate``: "terminate called without an active exception", an island rank aborting
at exit after a clean run (seen under CPU load, with the worker thread scheduled late).

So every tensor heloco hands to a collective is held here until nothing but this module and
the views heloco made of it refers to it (then freeing it runs on the calling thread, which
holds the GIL), and :func:`settle` waits, with the GIL released, until that is true of all of
them, before the island is left.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

SETTLE_S = 10.0  # how long leaving the island waits for the backend to drop its references
POLL_S = 0.001  # the wait's step; the GIL is released in between


@dataclass
class _Held:
    """One handed tensor and weak references to the views of it heloco gave out."""

    tensor: torch.Tensor
    views: list[weakref.ref[torch.Tensor]] = field(default_factory=list)

    def released(self) -> bool:
        """Nothing else holds the tensor: only this entry (1) and each live view (1 each)."""
        live = sum(1 for v in self.views if v() is not None)
        return uses(self.tensor) <= 1 + live


def uses(tensor: torch.Tensor) -> int:
    """References to the tensor's C++ object: its Python object, views, backend work items."""
    return int(tensor._use_count())  # type: ignore[attr-defined]


_held: list[_Held] = []
_lock = threading.Lock()


def _prune() -> int:
    """Drop the entries the backend has let go of; the number still held."""
    with _lock:
        _held[:] = [h for h in _held if not h.released()]
        return len(_held)


def keep(tensor: torch.Tensor, views: Iterable[torch.Tensor] = ()) -> None:
    """Hold ``tensor`` (handed to a collective) until the backend has dropped it; ``views``
    are views of it that the caller hands on (they keep it alive without the backend)."""
    _prune()
    entry = _Held(tensor, [weakref.ref(v) for v in views])
    with _lock:
        _held.append(entry)


def held() -> int:
    """How many handed tensors the backend (or a view made elsewhere) still holds."""
    return _prune()


def settle(timeout_s: float = SETTLE_S) -> bool:
    """Wait until the backend holds none of the handed tensors (True), or ``timeout_s``
    passed (False: something else keeps one, e.g. a view of a dispatch kept by the caller).
    The GIL is released while waiting, so a backend thread that needs it can finish."""
    deadline = time.monotonic() + timeout_s
    while _prune():
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True
