"""Lab 8's cases: a file as a participant writes it from the hints, and the catalogue of
plausible mistakes, each caught by the property it names (tests/test_labs.py)."""

WRITTEN = """
from minipaged import policies


class WorkingSet(policies.WorkingSet):
    def growth(self, request, blocks, final_len):
        length = max((len(seq.token_ids) for seq in request.live), default=final_len)
        grown = min(length + self.window, final_len)
        now = blocks.frames_to_admit(length, final_len)
        later = blocks.frames_to_admit(grown, final_len)
        return request.width * (later - now)
"""

NEXT = "growth is the frames the next `window` tokens take, beyond the frames held now"
CAP = "growth stops at the request's final length (prompt + max_tokens)"
WIDTH = "growth counts every live sample of the request (its width)"
CHUNK = "a contiguous chunk, reserved whole at admission, promises no growth"
PAYOFF = (
    "a burst that makes greedy admission thrash runs with far fewer preemptions, to"
    " the end"
)

# (the mistake, in a few words; text of WRITTEN; what replaces it; the property that
# must catch it)
MISTAKES = [
    (
        "always 0, which is greedy admission",
        "return request.width * (later - now)",
        "return 0",
        PAYOFF,
    ),
    (
        "the frames after the window, not the growth",
        "return request.width * (later - now)",
        "return request.width * later",
        NEXT,
    ),
    (
        "the window counted in frames, not tokens",
        "grown = min(length + self.window, final_len)",
        "grown = min(length + self.window * blocks.block_size, final_len)",
        NEXT,
    ),
    (
        "the window's own frames, wherever the sequence is in its frame",
        "return request.width * (later - now)",
        "return request.width * -(-(grown - length) // blocks.block_size)",
        NEXT,
    ),
    (
        "counted from the prompt, not the tokens now",
        "length = max((len(seq.token_ids) for seq in request.live), default=final_len)",
        "length = len(request.prompt_token_ids)",
        NEXT,
    ),
    (
        "no cap at the final length",
        "grown = min(length + self.window, final_len)",
        "grown = length + self.window",
        CAP,
    ),
    (
        "ignoring the width",
        "return request.width * (later - now)",
        "return later - now",
        WIDTH,
    ),
    (
        "every sample, finished ones too",
        "return request.width * (later - now)",
        "return request.params.n * (later - now)",
        WIDTH,
    ),
    (
        "frames_for instead of frames_to_admit",
        "return request.width * (later - now)",
        "return request.width * (blocks.frames_for(grown) - blocks.frames_for(length))",
        CHUNK,
    ),
    (
        "half the window",
        "grown = min(length + self.window, final_len)",
        "grown = min(length + self.window // 2, final_len)",
        NEXT,
    ),
    (
        "growth hands its work to the engine's own (super())",
        "        length = max(",
        (
            "        return super().growth(request, blocks, final_len)\n"
            "        length = max("
        ),
        NEXT,
    ),
]

# the line that opens a method body: the loop, crash and exit tests put a statement
# after it
BREAK_AT = "    def growth(self, request, blocks, final_len):\n"
