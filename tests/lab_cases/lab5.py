"""Lab 5's cases: the starter with the lookup written as the hints lead to it, and the
catalogue
of plausible mistakes, each caught by the property it names (tests/test_labs.py)."""

from pathlib import Path

LOOKUP = (
    "        return cache;  // wrong on purpose: every position reads the first row of"
    " frame 0"
)
WRITTEN = (
    (Path(__file__).resolve().parents[2] / "labs/lab5_kernel.cu")
    .read_text()
    .replace(
        LOOKUP,
        """\
        const long long frame = block_table[pos / block_size];
        const long long slot = frame * block_size + pos % block_size;
        return cache + (slot * num_kv_heads + kv_head) * HEAD_DIM;""",
    )
)

LOOKS_UP = (
    "rows[pos] is the row of kv_head in slot block_table[pos / block_size] * block_size"
    " + pos % block_size"
)

# (the mistake, in a few words; text of WRITTEN; what replaces it; the property that
# must catch it)
MISTAKES = [
    (
        "the block's index and the offset swapped",
        "block_table[pos / block_size]",
        "block_table[pos % block_size]",
        LOOKS_UP,
    ),
    (
        "the frame id in int: frame * block_size overflows a huge pool",
        "const long long frame",
        "const int frame",
        LOOKS_UP,
    ),
    ("the slot in int", "const long long slot", "const int slot", LOOKS_UP),
    (
        "kv_head forgotten",
        "(slot * num_kv_heads + kv_head) * HEAD_DIM",
        "slot * num_kv_heads * HEAD_DIM",
        LOOKS_UP,
    ),
    (
        "the num_kv_heads stride forgotten",
        "(slot * num_kv_heads + kv_head) * HEAD_DIM",
        "(slot + kv_head) * HEAD_DIM",
        LOOKS_UP,
    ),
    (
        "HEAD_DIM forgotten: an offset in rows, not elements",
        "(slot * num_kv_heads + kv_head) * HEAD_DIM",
        "slot * num_kv_heads + kv_head",
        LOOKS_UP,
    ),
    (
        "block_size hard-coded to 16",
        "frame * block_size + pos % block_size",
        "frame * 16 + pos % 16",
        LOOKS_UP,
    ),
    (
        "the sequence's first frame for every position",
        "block_table[pos / block_size]",
        "block_table[0]",
        LOOKS_UP,
    ),
    (
        "the frame taken as the slot (no offset inside the block)",
        "frame * block_size + pos % block_size",
        "frame * block_size",
        LOOKS_UP,
    ),
]

# the line that opens the lookup's body: the loop, crash and exit tests put a statement
# after it
BREAK_AT = "operator[](int pos) const {\n"
