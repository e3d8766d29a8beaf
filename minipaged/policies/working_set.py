"""Thrashing and the working set: admit a request only while everyone's working set
fits.

Denning ("The working set model for program behavior", CACM 1968): a program's working
set is the pages it touched in the last window of time; load control runs only as many
programs as have their working sets in memory, else all of them page and none progress
(thrashing).
"""

from __future__ import annotations

from minipaged.paging import check_size


class WorkingSet:
    """A sequence's working set is every frame it holds (each step's attention reads
    them all) plus the frames it will take in the next `admission_window` steps, one
    token a step, up to its final length (prompt + max_tokens: what is known). Admission
    promises that growth to the running requests and to the one it admits. A contiguous
    chunk's room is reserved: 0.
    """

    name = "working-set"

    def __init__(self, admission_window: int = 16):
        self.window = check_size("admission_window", admission_window, minimum=1)

    def growth(self, request, blocks, final_len: int) -> int:
        length = max((len(s.token_ids) for s in request.live), default=final_len)
        grown = min(length + self.window, final_len)
        return request.width * (
            blocks.frames_to_admit(grown, final_len)
            - blocks.frames_to_admit(length, final_len)
        )
