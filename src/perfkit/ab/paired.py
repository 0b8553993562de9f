"""Paired launches (``perfkit ab --paired``): an A and a B launch run side by side, their requests
in turn (A's cold request, B's, A's first warm one, …; never overlapping). :class:`Alternation`
is the turnstile; :func:`run_pair` runs the two launches on two threads. Why and what it costs:
docs/choosing-n-m.md, "Paired launches".
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator


class Alternation:
    """Two sides' requests in turn: ``first``'s request 0, ``second``'s request 0, ``first``'s
    request 1, … A side that has ended (its launch failed, or it ran all its requests) no longer
    holds the other up.

    Args:
        first, second: the side names (e.g. "A", "B"); ``first`` goes first.
    """

    def __init__(self, first: str, second: str) -> None:
        self._cv = threading.Condition()
        self._other = {first: second, second: first}
        self._turn = first
        self._ended: set[str] = set()
        #: (side, request index) in the order the requests ran
        self.log: list[tuple[str, int]] = []

    @contextlib.contextmanager
    def turn(self, side: str, i: int) -> Iterator[None]:
        """Wait until it is ``side``'s turn (or the other side has ended), run the block, pass
        the turn on. Raises KeyError for a side that is not one of the two."""
        other = self._other[side]
        with self._cv:
            self._cv.wait_for(lambda: self._turn == side or other in self._ended)
            self.log.append((side, i))
        try:
            yield
        finally:
            with self._cv:
                self._turn = other
                self._cv.notify_all()

    def end(self, side: str) -> None:
        """``side`` sends no more requests: the other runs on alone."""
        with self._cv:
            self._ended.add(side)
            self._turn = self._other[side]
            self._cv.notify_all()


def run_pair(
    first: str, second: str, measure: Callable[[str, Callable[[int], Any]], Any]
) -> tuple[dict[str, Any], list[tuple[str, int]]]:
    """Run ``measure(side, turn)`` for both sides at once, on two threads, their requests in
    turn (``turn(i)`` is the context manager a launch enters around its request ``i``,
    :func:`perfkit.measuring.launch_rows.measure_launch`'s ``turn``).

    Returns:
        ({side: what its ``measure`` returned}, the (side, request index) order they ran in).

    Raises:
        Whatever a ``measure`` raised (the first side's first), after both threads ended;
        KeyboardInterrupt as the main thread received it (the launches' own teardown ends
        their engines: each runs inside its ``measure``).
    """
    alt = Alternation(first, second)
    results: dict[str, Any] = {}
    errors: dict[str, BaseException] = {}

    def work(side: str) -> None:
        try:
            results[side] = measure(side, lambda i: alt.turn(side, i))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors[side] = exc
        finally:
            alt.end(side)

    threads = [threading.Thread(target=work, args=(s,), name=f"ab-{s}", daemon=True) for s in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(timeout=0.5)  # wakes for Ctrl-C / SIGTERM (raised in this thread)
    for s in (first, second):
        if s in errors:
            raise errors[s]
    return results, alt.log
