"""Lab 5's cases: the starter with the lookup written as the hints lead to it, and the catalogue
of plausible mistakes, each caught by the property it names (tests/test_labs.py)."""

from pathlib import Path

LOOKUP = "        return cache;  // wrong on purpose: every position reads the first row of frame 0"
WRITTEN = (Path(__file__).resolve().parents[2] / "labs/lab5_kernel.cu").read_text().replace(LOOKUP, """\
        const long long frame = block_table[pos / block_size];
        const long long slot = frame * block_size + pos % block_size;
        return cache + (slot * num_kv_heads + kv_head) * HEAD_DIM;""")

# (the mistake, in a few words; text of WRITTEN; what replaces it; the property that must catch it)
MISTAKES = [
    ('FILL', 'block_table[pos / block_size]', 'block_table[pos % block_size]', 'rows[pos] is the row of kv_head in slot block_table[pos / block_size] * block_size + pos % block_size'),
    ('FILL', '(slot * num_kv_heads + kv_head) * HEAD_DIM', 'slot * num_kv_heads * HEAD_DIM', 'rows[pos] is the row of kv_head in slot block_table[pos / block_size] * block_size + pos % block_size'),
]

# the line that opens the lookup's body: the loop, crash and exit tests put a statement after it
BREAK_AT = "operator[](int pos) const {\n"
