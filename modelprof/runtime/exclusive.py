"""One profile of a model at a time: a second thread that profiles the same model waits until
the first has put it back (profiling sets its mode, restores its state and takes other threads'
calls for foreign use). A wait that would close a cycle (two ``compare`` calls over the same
models in opposite orders) is refused with a ``ModelProfError`` instead of deadlocking.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from modelprof.errors import ModelProfError

__all__ = ["exclusive", "waiting_for"]

_cond = threading.Condition()
_holders: dict[int, tuple[int, int]] = {}  # id(model) -> (thread id, depth)
_waiting: dict[int, int] = {}  # thread id -> id(model) it waits for


@contextlib.contextmanager
def exclusive(model: Any) -> Iterator[None]:
    """Hold ``model`` for this thread for the block, waiting while another thread holds it."""
    me, key = threading.get_ident(), id(model)
    with _cond:
        while key in _holders and _holders[key][0] != me:
            if _closes_a_cycle(me, key):
                raise ModelProfError(
                    f"another thread is profiling {type(model).__name__} and waits for a model "
                    "this thread is profiling: profiling it here would wait forever. Profile "
                    "the models in the same order in both threads, or one thread at a time"
                )
            _waiting[me] = key
            try:
                _cond.wait()
            finally:
                del _waiting[me]
        _holders[key] = (me, _holders.get(key, (me, 0))[1] + 1)
    try:
        yield
    finally:
        with _cond:
            owner, depth = _holders.pop(key)
            if depth > 1:
                _holders[key] = (owner, depth - 1)
            _cond.notify_all()


def _closes_a_cycle(me: int, key: int) -> bool:
    """Whether the holder of ``key`` waits, through other threads, for a model ``me`` holds."""
    seen: set[int] = set()
    owner = _holders[key][0]
    while owner not in seen:
        if owner == me:
            return True
        seen.add(owner)
        wanted = _waiting.get(owner)
        if wanted is None or wanted not in _holders:
            return False
        owner = _holders[wanted][0]
    return False


def waiting_for(model: Any) -> int:
    """How many threads wait to profile ``model`` now."""
    with _cond:
        return sum(1 for k in _waiting.values() if k == id(model))
