"""Lab 9's cases: a file as a participant writes it from the hints, and the catalogue of
plausible mistakes, each caught by the property it names (tests/test_labs.py)."""

WRITTEN = """
from minipaged import paging


def ngram_propose(token_ids, k, min_n, max_n):
    length = len(token_ids)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = token_ids[length - n:]
        for start in range(length - n - 1, -1, -1):
            if token_ids[start:start + n] == suffix:
                return token_ids[start + n:start + n + k]
    return []


class BlockTable(paging.BlockTable):
    def truncate(self, num_tokens):
        size = self.allocator.block_size
        self.guesses = max(0, num_tokens - len(self.token_ids))
        del self.token_ids[num_tokens:]
        keep = (num_tokens + size - 1) // size
        while len(self.frames) > keep:
            self.allocator.free(self.frames.pop())
        del self.block_hashes[num_tokens // size:]
"""

LATEST = (
    "ngram_propose guesses what followed the latest earlier occurrence of the last n"
    " tokens"
)
LONGEST = "ngram_propose tries the longest n first, from max_n down to min_n"
AT_MOST_K = "ngram_propose returns at most k tokens (fewer where the sequence ends)"
NONE = "ngram_propose returns [] when no n from max_n down to min_n occurred before"
FREES = (
    "truncate frees the frames that hold only dropped slots, and keeps a frame still"
    " partly used"
)
SHARED = (
    "truncate gives a shared frame back only for this table (another still maps it)"
)
COUNT = "truncate keeps num_tokens slots: the tokens first, then the guesses"
GROWS = "a table rolled back reads back its tokens and grows again from there"

# (the mistake, in a few words; text of WRITTEN; what replaces it; the property that
# must catch it)
MISTAKES = [
    (
        "the earliest occurrence, not the latest",
        "for start in range(length - n - 1, -1, -1):",
        "for start in range(0, length - n):",
        LATEST,
    ),
    (
        "the matched suffix itself counts as an occurrence",
        "for start in range(length - n - 1, -1, -1):",
        "for start in range(length - n, -1, -1):",
        LATEST,
    ),
    (
        "the match itself returned, not what followed it",
        "return token_ids[start + n:start + n + k]",
        "return token_ids[start:start + k]",
        LATEST,
    ),
    (
        "the shortest n first",
        "for n in range(min(max_n, length - 1), min_n - 1, -1):",
        "for n in range(min_n, min(max_n, length - 1) + 1):",
        LONGEST,
    ),
    (
        "everything after the match, not k tokens",
        "return token_ids[start + n:start + n + k]",
        "return token_ids[start + n:]",
        AT_MOST_K,
    ),
    (
        "k counted from the match's start",
        "return token_ids[start + n:start + n + k]",
        "return token_ids[start + n:start + k]",
        AT_MOST_K,
    ),
    (
        "min_n ignored: down to n = 1",
        "for n in range(min(max_n, length - 1), min_n - 1, -1):",
        "for n in range(min(max_n, length - 1), 0, -1):",
        NONE,
    ),
    (
        "rollback frees no frame",
        "            self.allocator.free(self.frames.pop())\n",
        "            self.frames.pop()\n",
        FREES,
    ),
    (
        "the frame still partly used is freed too",
        "keep = (num_tokens + size - 1) // size",
        "keep = num_tokens // size",
        FREES,
    ),
    (
        "one frame too many kept",
        "keep = (num_tokens + size - 1) // size",
        "keep = num_tokens // size + 1",
        FREES,
    ),
    (
        "a shared frame sent to the free list without its ref count",
        "            self.allocator.free(self.frames.pop())\n",
        (
            "            frame = self.frames.pop()\n           "
            " self.allocator.ref_counts[frame] = 0\n           "
            " self.allocator.free_frames.append(frame)\n"
        ),
        SHARED,
    ),
    (
        "guessed slots kept no matter what",
        "self.guesses = max(0, num_tokens - len(self.token_ids))",
        "self.guesses = 0",
        COUNT,
    ),
    (
        "one token too many dropped",
        "del self.token_ids[num_tokens:]",
        "del self.token_ids[num_tokens - 1:]",
        COUNT,
    ),
    (
        "guesses never touched",
        "self.guesses = max(0, num_tokens - len(self.token_ids))",
        "pass",
        COUNT,
    ),
    (
        "block names not cut back",
        "        del self.block_hashes[num_tokens // size:]\n",
        "",
        GROWS,
    ),
    (
        "truncate hands its work to the engine's own (super())",
        "        size = self.allocator.block_size\n",
        (
            "        return super().truncate(num_tokens)\n"
            "        size = self.allocator.block_size\n"
        ),
        FREES,
    ),
    (
        "ngram_propose is the engine's own, imported and called",
        "    length = len(token_ids)\n",
        (
            "    from minipaged.speculative.ngram import ngram_propose as engines\n"
            "    return engines(token_ids, k, min_n, max_n)\n"
            "    length = len(token_ids)\n"
        ),
        LATEST,
    ),
]

# the line that opens a method body: the loop, crash and exit tests put a statement
# after it
BREAK_AT = "    def truncate(self, num_tokens):\n"
