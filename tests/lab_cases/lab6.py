"""Lab 6's cases: a Clock as a participant writes it from the hints, and the catalogue
of plausible mistakes, each caught by the property it names (tests/test_labs.py)."""

WRITTEN = """
from collections import OrderedDict


class Clock:
    name = "clock"

    def __init__(self):
        self.ring = OrderedDict()

    def entered(self, frame, block):
        self.ring[frame] = True

    def parked(self, frame):
        self.ring[frame] = True

    def left(self, frame):
        del self.ring[frame]

    def victim(self, parked):
        while True:
            frame = next(iter(self.ring))
            if frame in parked and not self.ring[frame]:
                return frame
            self.ring[frame] = False
            self.ring.move_to_end(frame)
"""

SECOND_CHANCE = (
    "a referenced frame gets a second chance: the hand clears its bit and moves on"
)
ENTRY_ORDER = "the hand goes round the ring in the order the frames' contents entered"
PARKED_ONLY = "only parked frames are chosen: the hand passes over frames in use"
LEFT = "left(frame) takes the frame out of the ring: entering again, it stands last"
TRACE = (
    "on a chat trace your CLOCK hits as often as the engine's: above FIFO, below LRU,"
    " never above MIN"
)

# (the mistake, in a few words; text of WRITTEN; what replaces it; the property that
# must catch it)
MISTAKES = [
    (
        "the bit never read: the first parked frame in the ring (FIFO)",
        "            if frame in parked and not self.ring[frame]:\n",
        "            if frame in parked:\n",
        SECOND_CHANCE,
    ),
    (
        "pinned frames chosen: a clear bit is enough",
        "if frame in parked and not self.ring[frame]:",
        "if not self.ring[frame]:",
        PARKED_ONLY,
    ),
    (
        "the bit cleared but the hand not moved on",
        "            self.ring.move_to_end(frame)\n",
        "",
        SECOND_CHANCE,
    ),
    (
        "parking moves the frame to the end of the ring (LRU's list, not a clock)",
        "    def parked(self, frame):\n        self.ring[frame] = True\n",
        (
            "    def parked(self, frame):\n        self.ring[frame] = True\n       "
            " self.ring.move_to_end(frame)\n"
        ),
        ENTRY_ORDER,
    ),
    (
        "left() keeps the frame in the ring",
        "        del self.ring[frame]\n",
        "        pass\n",
        LEFT,
    ),
    (
        "parking does not set the bit (only entering does)",
        "    def parked(self, frame):\n        self.ring[frame] = True\n",
        "    def parked(self, frame):\n        pass\n",
        SECOND_CHANCE,
    ),
    (
        "a new frame enters at the hand (the front), not behind it",
        "    def entered(self, frame, block):\n        self.ring[frame] = True\n",
        (
            "    def entered(self, frame, block):\n        self.ring[frame] = True\n   "
            "     self.ring.move_to_end(frame, last=False)\n"
        ),
        ENTRY_ORDER,
    ),
    (
        (
            "the parked frames' own order (least recently parked first) instead of the"
            " ring"
        ),
        "        while True:\n",
        "        return next(iter(parked))\n        while True:\n",
        ENTRY_ORDER,
    ),
    (
        "victim takes the frame out of the ring itself (then left() finds it gone)",
        (
            "            if frame in parked and not self.ring[frame]:\n               "
            " return frame\n"
        ),
        (
            "            if frame in parked and not self.ring[frame]:\n               "
            " del self.ring[frame]\n                return frame\n"
        ),
        ENTRY_ORDER,
    ),
]

# the line that opens a method body: the loop, crash and exit tests put a statement
# after it
BREAK_AT = "    def victim(self, parked):\n"
