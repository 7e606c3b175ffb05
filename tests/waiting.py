"""Waiting on a condition instead of sleeping a fixed time: a test goes on the moment the
condition holds, and one that times out says what it was waiting for and what it saw last."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_until(what: str, check: Callable[[], T], timeout_s: float = 60.0, every_s: float = 0.2) -> T:
    """Call ``check`` until it returns something truthy, and return that.

    :param what: what is waited for, as the timeout's message says it ("the stream to catch up").
    :raises AssertionError: not within ``timeout_s``, naming ``what`` and the last value seen.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what} (last seen: {found!r})")
        time.sleep(every_s)
