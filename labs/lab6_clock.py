"""Lab 6: CLOCK page replacement. You write the prefix cache's replacement policy: which parked
frame leaves when the pool needs one, by Corbato's second chance (meeting 9, docs/09_replacement.md).

Grade it (then it serves the model):  python -m minipaged.lab check 6 my_clock.py
Hints, one step at a time:            python -m minipaged.lab hint 6
"""

from __future__ import annotations

from collections import OrderedDict


class Clock:
    """CLOCK, or second chance (Corbato 1968): the cached frames stand in a ring in the order
    their content entered, each with a referenced bit, set while a sequence reads the frame
    (so set when it is parked). The hand clears set bits as it passes and stops at the first
    parked frame whose bit is clear: LRU's effect at FIFO's cost, no list reordered per hit.

    The prefix cache calls the four methods below; its state, set up for you:

        self.ring   an OrderedDict: frame -> its referenced bit (True / False), the frames in
                    ring order, the hand at the front (next(iter(self.ring)) is the frame the
                    hand points at). move_to_end(frame) puts a frame last: just behind the hand.
    """
    name = "clock"

    def __init__(self):
        """An empty ring (written for you)."""
        self.ring: OrderedDict[int, bool] = OrderedDict()  # frame -> referenced; the hand at the front

    def entered(self, frame: int, block: int) -> None:
        """A block's content (hash `block`) entered `frame`, which a sequence is reading: the
        frame joins the ring, last (just behind the hand), with its bit set."""
        raise NotImplementedError("lab 6: write Clock.entered (stuck? python -m minipaged.lab hint 6)")

    def parked(self, frame: int) -> None:
        """The last sequence reading `frame` let go: it is parked (it may be chosen now). It was
        read until now, so its bit is set; it keeps its place in the ring."""
        raise NotImplementedError("lab 6: write Clock.parked (stuck? python -m minipaged.lab hint 6)")

    def left(self, frame: int) -> None:
        """`frame` left the cache (chosen by victim, or forgotten): it leaves the ring."""
        raise NotImplementedError("lab 6: write Clock.left (stuck? python -m minipaged.lab hint 6)")

    def victim(self, parked: OrderedDict) -> int:
        """The frame to give up, one of `parked` (the parked frames; the others are in use and
        may not be chosen). The hand looks at the frame in front: a parked frame with its bit
        clear is the victim (return it; the cache then calls left). Any other frame is passed:
        its bit is cleared and it goes last in the ring, and the hand looks at the next one.
        (Do not remove the victim here: left does.)"""
        raise NotImplementedError("lab 6: write Clock.victim (stuck? python -m minipaged.lab hint 6)")
