"""Write each notebook's closing "## Lab" cell (its .py and its .ipynb) from
minipaged.tools.lab.LABS:
`.venv/bin/python scripts/lab_cells.py` after a lab is added or its minutes change."""

import sys
from pathlib import Path

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# after the line above: the script runs from a checkout without minipaged installed
from minipaged.tools.lab.labs import LABS  # noqa: E402

# notebook -> [(lab, what, the participant's file name)]
PLAN = {
    "02_page_tables": [
        (
            1,
            (
                "the frame allocator and the page table's `append_slot`: a frame only"
                " when the last one is full."
            ),
            "my_paging.py",
        )
    ],
    "03_kernel": [
        (
            5,
            (
                "the page-table lookup inside the kernel (`struct PagedRows`), in CUDA"
                " that the CPU emulation runs."
            ),
            "my_kernel.cu",
        )
    ],
    "04_sharing": [
        (2, "reference counts, `fork` and copy-on-write.", "my_fork.py"),
        (3, "the prefix cache: the hash chain, lookup and release.", "my_cache.py"),
    ],
    "05_batching": [
        (
            4,
            "one step of the continuous batcher: decode slots, preemption, admission.",
            "my_batcher.py",
        )
    ],
    "08_speculative": [
        (
            9,
            "the n-gram proposer and the page table's rollback of rejected guesses.",
            "my_speculation.py",
        )
    ],
    "09_replacement": [
        (
            6,
            "CLOCK, the second-chance replacement of the prefix cache's parked frames.",
            "my_clock.py",
        )
    ],
    "10_thrashing": [
        (
            8,
            (
                "working-set admission: a request joins only while everyone's working"
                " set fits."
            ),
            "my_working_set.py",
        )
    ],
    "11_scheduling": [
        (
            7,
            (
                "shortest job first with aging: the waiting order that bounds a long"
                " job's wait."
            ),
            "my_aging.py",
        )
    ],
    "12_drum": [
        (
            12,
            (
                "the drum: the tier's store and load, where an evicted block waits and"
                " how it comes back."
            ),
            "my_drum.py",
        )
    ],
    "14_fair_queuing": [
        (10, "fair queuing: the virtual token counter's waiting order.", "my_fair.py")
    ],
    "15_compressed_memory": [
        (
            11,
            "the int8 codec of the KV cache: a scale per row, codes, and back.",
            "my_codec.py",
        )
    ],
    "16_automata": [
        (
            14,
            (
                "the subset construction's step: the closure of a set of NFA states and"
                " its move on a character."
            ),
            "my_subsets.py",
        )
    ],
    "17_routing": [
        (
            13,
            (
                "the router's directory: which replica holds which block, from their"
                " KV events, and LARD's route."
            ),
            "my_directory.py",
        )
    ],
}


def cell_text(entries) -> str:
    labs = [n for n, _, _ in entries]
    which = (
        f"lab {labs[0]}" if len(labs) == 1 else "labs " + " and ".join(map(str, labs))
    )
    lines = [
        "## Lab",
        "",
        (
            f"Now write it yourself ({which}, [labs/README.md](../labs/README.md)). In"
            " a terminal, at the top of"
        ),
        (
            "the repository, with the project's environment active (`source"
            " .venv/bin/activate`), copy the"
        ),
        "starter, fill in the bodies, and grade it:",
        "",
    ]
    for n, what, mine in entries:
        lab = LABS[n]
        lines += [
            f"- **Lab {n}** (about {lab.minutes} minutes): {what}",
            "",
            "  ```",
            f"  cp labs/{lab.starter} {mine}",
            f"  python -m minipaged.lab check {n} {mine}",
            "  ```",
            "",
        ]
    hint = " or ".join(f"`python -m minipaged.lab hint {n}`" for n in labs)
    lines += [
        (
            "The check names each property your code breaks, on an input that shows it."
            " Once they all"
        ),
        (
            "hold, it runs SmolLM2 with your code plugged in, next to the engine's own,"
            " and draws the"
        ),
        (
            f"lab's picture. Stuck? {hint} shows the next hint, one at a time, from the"
            " idea to the code."
        ),
    ]
    return "\n".join(lines)


for stem, entries in PLAN.items():
    script, notebook = (
        ROOT / "notebooks" / f"{stem}.py",
        ROOT / "notebooks" / f"{stem}.ipynb",
    )
    if not script.exists() or not all(
        n in LABS and LABS[n].starter_path.exists() for n, _, _ in entries
    ):
        print("skip", stem)
        continue
    text = cell_text(entries)
    for path in (script, notebook):
        nb = (
            jupytext.read(path)
            if path.suffix == ".py"
            else nbformat.read(path, as_version=4)
        )
        last = nb.cells[-1]
        if last.cell_type == "markdown" and last.source.startswith("## Lab"):
            last.source = text
        else:
            nb.cells.append(nbformat.v4.new_markdown_cell(text))
        if path.suffix == ".py":
            jupytext.write(nb, path, fmt="py:percent")
        else:
            nbformat.write(nb, path)
    print("wrote", stem)
