"""The outbox: a decode turn's chunks reach each event loop in one call, in the order emitted."""

from __future__ import annotations

import asyncio

from server.engines.hf.outbox import flush, one_wakeup, send


class _Loop:
    """Records call_soon_threadsafe calls and runs them when asked (as the loop's thread would)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def call_soon_threadsafe(self, fn, *args) -> None:
        self.calls.append((fn, args))

    def run(self) -> None:
        for fn, args in self.calls:
            fn(*args)


def test_inside_one_wakeup_each_loop_is_woken_once_with_every_chunk_in_order():
    a, b = _Loop(), _Loop()
    qa1, qa2, qb = asyncio.Queue(), asyncio.Queue(), asyncio.Queue()
    with one_wakeup():
        send(a, qa1, "a1-first")
        send(b, qb, "b-first")
        send(a, qa2, "a2-first")
        send(a, qa1, "a1-second")
        assert not a.calls and not b.calls  # held until the turn ends
    assert len(a.calls) == 1 and len(b.calls) == 1
    a.run()
    b.run()
    assert [qa1.get_nowait(), qa1.get_nowait()] == ["a1-first", "a1-second"]
    assert qa2.get_nowait() == "a2-first" and qb.get_nowait() == "b-first"


def test_outside_one_wakeup_a_chunk_goes_at_once_and_a_closed_loop_does_not_break_the_turn():
    loop, q = _Loop(), asyncio.Queue()
    send(loop, q, "now")
    assert len(loop.calls) == 1

    class Closed:
        def call_soon_threadsafe(self, fn, *args):
            raise RuntimeError("Event loop is closed")

    with one_wakeup():
        send(Closed(), asyncio.Queue(), "lost")
        send(loop, q, "kept")
    assert len(loop.calls) == 2  # the open loop still got its chunk
    send(loop, q, "after")  # and the thread is back to sending at once
    assert len(loop.calls) == 3


def test_a_flush_inside_one_wakeup_sends_what_is_held_and_holds_on():
    loop, q = _Loop(), asyncio.Queue()
    with one_wakeup():
        send(loop, q, "token")
        send(loop, q, "last chunk")
        flush()  # a request ended: its client hears it before its KV is cached
        assert len(loop.calls) == 1
        send(loop, q, "next request's token")
        assert len(loop.calls) == 1  # held again
    assert len(loop.calls) == 2
    loop.run()
    assert [q.get_nowait() for _ in range(3)] == ["token", "last chunk", "next request's token"]
