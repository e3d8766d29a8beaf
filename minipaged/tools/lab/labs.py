"""The labs: for each, its starter file in labs/, the engine's pieces the participant
rewrites (their solution), the properties that grade them, and how the engine then
serves with them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from minipaged import paging
from minipaged.scheduler import Scheduler
from minipaged.tools.lab import (
    aging_lab,
    automata_lab,
    batcher_props,
    clock_lab,
    compressed_lab,
    directory_lab,
    drum_lab,
    fair_lab,
    kernel_props,
    paging_props,
    speculation_lab,
    working_set_lab,
)
from minipaged.tools.lab.grading import Property

# the starters, at the top of the repository (minipaged/tools/lab/ is three below)
LABS_DIR = Path(__file__).resolve().parents[3] / "labs"


@dataclass(frozen=True, slots=True)
class Lab:
    number: int
    title: str
    starter: str  # file name in labs/
    minutes: int  # for a first-timer, hints read as needed
    needs: str  # prerequisites
    # name -> the engine's own object the participant rewrites
    solution: Callable[[], dict]
    properties: list[Property]
    engine: dict  # EngineConfig options of the run with the participant's piece
    samples: bool = True  # does the run include n > 1 (forks)?
    max_tokens: int = 12  # per sequence of the run
    note: str = ""  # said before the run
    seconds: int = 10  # each property's time limit (a loop in the participant's code)
    meeting: str = ""  # the meeting of the series (docs/series.md) it builds on
    # the engine run after the properties hold: run(pieces, llm, pictures) -> lines to
    # print, a RuntimeError when the participant's engine fails or differs; None: the
    # plugged run of engine_run.serve (labs 1-5), with `engine`, `samples` and
    # `max_tokens`
    run: Callable | None = None

    @property
    def starter_path(self) -> Path:
        return LABS_DIR / self.starter

    @property
    def hints_path(self) -> Path:
        """The lab's hints, one `## ` section each, from the idea to the code (`lab hint
        N`)."""
        return LABS_DIR / "hints" / f"lab{self.number}.md"

    def pieces(self):
        """The engine's own pieces, as a participant's module would hold them
        (--solution)."""
        return SimpleNamespace(**self.solution())


# small enough that frames run out
TIGHT = dict(block_size=4, num_blocks=24, max_num_seqs=8)

LABS = {
    lab.number: lab
    for lab in [
        Lab(
            1,
            "demand paging: the frame allocator and the page table's append",
            "lab1_demand_paging.py",
            25,
            "notebook 02 (page tables)",
            lambda: {
                "BlockAllocator": paging.BlockAllocator,
                "BlockTable": paging.BlockTable,
            },
            paging_props.LAB1,
            dict(
                TIGHT, enable_prefix_caching=False
            ),  # samples: their append copies on write
            meeting="2, paging (page tables, demand paging)",
        ),
        Lab(
            2,
            "fork and copy-on-write",
            "lab2_fork_cow.py",
            25,
            "lab 1; notebook 04 (sharing)",
            lambda: {
                "BlockAllocator": paging.BlockAllocator,
                "BlockTable": paging.BlockTable,
            },
            paging_props.LAB2,
            dict(TIGHT, enable_prefix_caching=False),
            meeting="4, fork() and copy-on-write",
        ),
        Lab(
            3,
            "the prefix cache: hash chain, lookup, release",
            "lab3_prefix_cache.py",
            30,
            "lab 1; notebook 04 (sharing, the prefix cache part)",
            lambda: {
                "block_hash": paging.block_hash,
                "PrefixCache": paging.PrefixCache,
            },
            paging_props.LAB3,
            dict(TIGHT, enable_prefix_caching=True),
            meeting="4, fork() and copy-on-write (the prefix cache)",
        ),
        Lab(
            4,
            "the continuous batcher: one step's decisions",
            "lab4_batcher.py",
            35,
            "notebook 05 (batching); labs 1-2 help",
            lambda: {"Scheduler": Scheduler},
            batcher_props.LAB4,
            dict(TIGHT, enable_prefix_caching=False),
            meeting="5, time sharing (continuous batching)",
        ),
        Lab(
            5,
            "the kernel's page-table lookup (CUDA, run on the CPU)",
            "lab5_kernel.cu",
            30,
            "notebook 03 (kernel); a C++ compiler (g++ or clang++)",
            kernel_props.solution,
            kernel_props.LAB5,
            kernel_props.ENGINE,
            max_tokens=kernel_props.MAX_TOKENS,
            note=(
                "every decode step reads K and V through your lookup, in the emulated"
                " kernel (prompts go through the NumPy reference: emulated, they would"
                " take a minute)"
            ),
            meeting="3, address translation in the hot loop",
            run=kernel_props.serve,
        ),
        Lab(
            6,
            "CLOCK page replacement for the prefix cache",
            "lab6_clock.py",
            25,
            "notebook 09 (page replacement); lab 3 helps",
            clock_lab.solution,
            clock_lab.PROPERTIES,
            clock_lab.ENGINE,
            samples=False,
            meeting="9, page replacement",
            run=clock_lab.serve_lab6,
        ),
        Lab(
            7,
            "shortest job first with aging: the waiting order",
            "lab7_aging.py",
            25,
            "notebook 11 (scheduling)",
            aging_lab.solution,
            aging_lab.PROPERTIES,
            aging_lab.ENGINE,
            samples=False,
            meeting="11, scheduling short and long jobs",
            run=aging_lab.serve_lab7,
        ),
        Lab(
            8,
            "working-set admission: no thrashing",
            "lab8_working_set.py",
            30,
            "notebook 10 (thrashing)",
            working_set_lab.solution,
            working_set_lab.WORKING_SET,
            working_set_lab.ENGINE,
            samples=False,
            meeting="10, thrashing and the working set",
            run=working_set_lab.run,
        ),
        Lab(
            9,
            "speculative decoding: the n-gram proposer and the page table's rollback",
            "lab9_speculation.py",
            30,
            "notebook 08 (speculative decoding); labs 1-2 help",
            speculation_lab.solution,
            speculation_lab.SPECULATION,
            speculation_lab.ENGINE,
            samples=False,
            meeting="8, speculative execution, and undoing it",
            run=speculation_lab.run,
        ),
        Lab(
            10,
            "fair queuing: the virtual token counter's order",
            "lab10_fair_queuing.py",
            25,
            "notebook 14 (fair queuing); lab 7 helps",
            fair_lab.solution,
            fair_lab.PROPERTIES,
            fair_lab.ENGINE,
            samples=False,
            meeting="14, fair queuing",
            run=fair_lab.serve_lab10,
        ),
        Lab(
            11,
            "compressed memory: the int8 codec of the KV cache",
            "lab11_compressed_memory.py",
            25,
            "notebook 15 (compressed memory)",
            compressed_lab.solution,
            compressed_lab.PROPERTIES,
            compressed_lab.ENGINE,
            samples=False,
            meeting="15, compressed memory",
            run=compressed_lab.serve_lab11,
        ),
        Lab(
            12,
            "the drum: the tier's store and load behind the KV pool",
            "lab12_drum.py",
            25,
            "notebook 12 (the drum); lab 3 helps",
            drum_lab.solution,
            drum_lab.PROPERTIES,
            drum_lab.ENGINE,
            samples=False,
            meeting="12, the drum: a slower tier behind memory",
            run=drum_lab.serve_lab12,
        ),
        Lab(
            13,
            "the directory: which replica holds which block, and LARD's route",
            "lab13_directory.py",
            30,
            "notebook 17 (routing); lab 3 helps",
            directory_lab.solution,
            directory_lab.PROPERTIES,
            directory_lab.ENGINE,
            samples=False,
            meeting="17, locality-aware request distribution and the directory",
            run=directory_lab.serve_lab13,
        ),
        Lab(
            14,
            "the subset construction: closure and move, the DFA's step",
            "lab14_subsets.py",
            25,
            "notebook 16 (automata)",
            automata_lab.solution,
            automata_lab.PROPERTIES,
            automata_lab.ENGINE,
            samples=False,
            seconds=5,
            meeting="16, automata: from a regex to a mask",
            run=automata_lab.serve_lab14,
        ),
    ]
}
