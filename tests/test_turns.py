"""Turns on the device: concurrent queries' forward passes alternate, first come first served."""

from __future__ import annotations

import threading

from quail.engine.turns import Turns


def test_waiting_queries_take_turns_in_arrival_order():
    turns, order = Turns(), []
    first_in = threading.Event()
    release = threading.Event()

    def query(name: str, passes: int) -> None:
        for _ in range(passes):
            with turns.turn():
                order.append(name)
                if name == "long" and len(order) == 1:
                    first_in.set()
                    release.wait(10)

    long = threading.Thread(target=query, args=("long", 3))
    long.start()
    assert first_in.wait(10)
    short = threading.Thread(target=query, args=("short", 1))
    short.start()
    while not turns._waiting:  # the short query waits behind the long one's first pass
        threading.Event().wait(0.01)
    release.set()
    long.join(10)
    short.join(10)
    assert order == ["long", "short", "long", "long"], "the short query's pass came before the long one's next"
