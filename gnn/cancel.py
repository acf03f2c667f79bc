"""Work another thread may stop: the service answers on worker threads, and a client that hangs up, a DELETE of a
background search or SIGTERM sets a flag that the work itself must notice.

The long loops of one prediction (a pipeline's layout, the simulator's graphs, the network's layers, a timeline's
ranks) call ``check()`` every so often, so a stop lands within a fraction of a second even inside one large plan,
without every function between the request and the loop taking a flag:

    with stop_when(event.is_set):
        predictor.predict_columns(specs, hardware)    # raises Cancelled at the next check once event is set

The flag is the calling thread's: featurisation worker processes do not see it (the service stops between their
chunks, which are small).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

_local = threading.local()


class Cancelled(RuntimeError):
    """Work told to stop: its client went away, it was cancelled, or the service is shutting down."""


@contextlib.contextmanager
def stop_when(should_stop: Callable[[], bool] | None):
    """Within this block, on this thread, ``check()`` raises Cancelled once ``should_stop()`` answers True (and
    once any enclosing block's does). None: no new condition."""
    previous = getattr(_local, "should_stop", None)
    if should_stop is None:
        yield
        return
    _local.should_stop = should_stop if previous is None else (lambda: should_stop() or previous())
    try:
        yield
    finally:
        _local.should_stop = previous


def stopping() -> bool:
    """Whether this thread's work has been told to stop."""
    should_stop = getattr(_local, "should_stop", None)
    return should_stop is not None and bool(should_stop())


def check(what: str = "the work") -> None:
    """Raise Cancelled if this thread's work has been told to stop (about a microsecond when it has not)."""
    if stopping():
        raise Cancelled(f"{what} was stopped before it finished")
