"""The one wait function of cptest: `retry(fn, timeout_s)` on the monotonic clock.

Every wait in cptest (readiness, process exit, GPU memory settling) goes through `retry`, so every
wait has a deadline, reports how long it took, and says what it was waiting for when it gives up
(NixOS test driver, `retry`). The last try is flagged so `fn` can gather diagnostics only then.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from cptest.errors import RunError

T = TypeVar("T")


class Abort(Exception):
    """Raised by `fn` to stop retrying at once (the awaited thing can no longer happen).

    `retry` re-raises it unchanged; e.g. the engine exited while we waited for its readiness.
    """


def retry(
    fn: Callable[[bool], T | None],
    timeout_s: float,
    interval_s: float = 0.5,
    what: str = "condition",
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[T, float]:
    """Call `fn(last_try)` until it returns a value that is neither None nor False.

    Returns `(value, elapsed_s)`. A try that raises an `Exception` counts as a failed try and its
    error is kept; `Abort` is re-raised at once. `fn` is always called at least once, and once more
    with `last_try=True` at (or after) the deadline. Raises `RunError` naming `what`, the elapsed time,
    the number of tries and the last error when the deadline passes.
    """
    start = clock()
    deadline = start + max(timeout_s, 0.0)
    tries = 0
    last_error: str | None = None
    while True:
        now = clock()
        last = now >= deadline
        tries += 1
        try:
            value = fn(last)
        except Abort:
            raise
        except Exception as e:  # a failed try; keep why for the final message
            last_error = f"{type(e).__name__}: {e}"
            value = None
        if value is not None and value is not False:
            return value, clock() - start
        if last:
            break
        remaining = deadline - clock()
        sleep(max(min(interval_s, remaining), 0.0))
    elapsed = clock() - start
    msg = f"gave up {what} after {elapsed:.1f} s ({tries} tries)"
    if last_error:
        msg += f"; last error: {last_error}"
    raise RunError(msg)
