# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 8. Speculative decoding: guess, check, roll back
#
# **What you will see** (about 20 minutes):
# - speculative execution, as a CPU does it past a branch, applied to tokens: a cheap proposer
#   guesses the next few tokens, the model checks all of them in **one** forward, and what
#   follows the first wrong guess is thrown away;
# - the n-gram proposer ("prompt lookup") guessing an answer that copies its prompt, and the
#   same guesser failing on free chat;
# - the page table during such a step: slots taken for the guesses, then **rolled back** past
#   the first wrong one, with the frames that became empty returned, and the prefix cache
#   never told about a block of guesses;
# - greedy answers identical with and without speculation, and sampled ones that keep the
#   model's own distribution (rejection sampling, Leviathan et al. 2023).

# %%
import numpy as np
from IPython.display import Markdown, display

from minipaged import LLM, SamplingParams
from minipaged.paging import BlockManager
from minipaged.sampling import distribution, verify
from minipaged.speculative import ngram_propose
from minipaged.tools.viz import FrameMap, PageTableView

llm = LLM(block_size=8, num_blocks=128)
print(f"{llm.model_name} on {llm.device}, loaded in {llm.load_seconds:.1f} s")

# %% [markdown]
# ## Branch prediction for tokens
#
# A decode step computes one token per sequence, and on a small batch it is bound by reading
# the weights, not by arithmetic: checking five tokens in one forward costs little more than
# computing one. A processor meets the same situation at a branch. It does not wait for the
# condition; it predicts the branch, runs ahead speculatively, and if the prediction was wrong
# it discards the work done on the mispredicted path and restarts from the branch.
#
# Speculative decoding (Leviathan et al., ICML 2023; Chen et al., 2023) does this with tokens:
# a **proposer** guesses `k` tokens, the model computes its logits at the last real token and
# at each guess in one forward, the guesses are **accepted** up to the first one the model
# would not have chosen, and the model's own token at that place is kept too. A step thus
# emits between 1 and `k + 1` tokens, never a token the model would not have produced.
#
# The cheapest proposer needs no model at all. When an answer copies its prompt (a rewrite, a
# summary, an edit of some code), the last few tokens have usually occurred before, and what
# followed them then is a good guess for what follows now: `ngram_propose(token_ids, k,
# min_n, max_n)` looks for the latest earlier occurrence of the last `n` tokens, longest `n`
# first.

# %%
TEXT = (
    "The Atlas computer, built at the University of Manchester in 1962, was the first machine "
    "with virtual memory. Its designers split memory into pages of 512 words and kept a table "
    "that mapped each page to a frame of core memory."
)
rewrite_ids = llm.tokenizer.encode_chat(
    [{"role": "user", "content": f"Repeat this text word for word:\n\n{TEXT}"}]
)
greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
answer = (
    llm.generate([{"prompt_token_ids": rewrite_ids}], greedy, use_tqdm=False)[0]
    .outputs[0]
    .token_ids
)

rows = []
for i in range(
    0, 24, 3
):  # what would the proposer guess after the first i tokens of the answer?
    guess = ngram_propose(rewrite_ids + answer[:i], 4, 1, 3)
    right = next(
        (j for j, (g, t) in enumerate(zip(guess, answer[i:])) if g != t), len(guess)
    )
    rows.append(
        f"| {i} | {llm.tokenizer.decode(guess)!r} | {llm.tokenizer.decode(answer[i : i + 4])!r} | {right} |"
    )
display(
    Markdown(
        "| answer tokens so far | n-gram guess (4 tokens) | what the model said | guesses right |\n"
        "| --- | --- | --- | --- |\n" + "\n".join(rows)
    )
)

# %% [markdown]
# ## One step: the guesses ride in the batch
#
# `LLM(speculative_config={"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max":
# 3, "prompt_lookup_min": 1})` is vLLM's option, and `llm.new_engine` takes it too. Each step,
# after the scheduler has given every running sequence the slot for its last token, it takes
# up to `k` more slots per sequence for guesses (only from free frames: a guess never preempts
# anyone). The proposer fills them, and the runner sends each speculating sequence as a row of
# `1 + guesses` tokens, the same shape as a chunk of a prompt, beside ordinary decodes and
# prefills. The `StepReport` says how many guesses the step checked and how many were right.

# %%
NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_max": 3,
    "prompt_lookup_min": 1,
}
engine = llm.new_engine(block_size=8, num_blocks=128, speculative_config=NGRAM)
engine.add_request("rewrite", {"prompt_token_ids": rewrite_ids}, greedy)
for _ in range(8):
    report = engine.step()
    print(f"{report.ran}: {report.guessed} guessed, {report.accepted} accepted")
while engine.has_unfinished_requests():
    engine.step()

# %% [markdown]
# ## The page table during the step, and its rollback
#
# In the page table the guesses are tokens like any other, with one difference: they may be
# wrong. So `BlockManager.append_guess_slots` places them as `append_slot` places a token (a
# new frame when the last is full; a **copy** of the last frame first when another sequence
# shares it, so that a guess never writes where someone else reads) but does not name their
# blocks for the prefix cache. After the forward, `BlockManager.settle_guesses(seq, accepted)`
# keeps the accepted ones, names the blocks they filled, and rolls the table back past them:
# frames that held only rejected guesses go back to the free list. The page table of a
# mispredicted path is undone exactly as a processor flushes its pipeline.
#
# Here by hand, on a pool of 12 frames of 4 slots: a sequence of 10 tokens takes guess slots
# for 5 tokens, then the model accepts 2 of them.

# %%
manager = BlockManager(num_blocks=12, block_size=4)
manager.allocate("s", list(range(100, 110)))  # 10 tokens: 3 frames, the last half full
taken, copies = manager.append_guess_slots("s", 5)
display(PageTableView(manager, ["s"]), FrameMap(manager, per_row=12))
print(PageTableView(manager, ["s"]))

# %%
free_before = manager.num_free_frames
manager.settle_guesses("s", [110, 111])  # the first two guesses were right
display(PageTableView(manager, ["s"]), FrameMap(manager, per_row=12))
display(
    Markdown(
        f"The guesses took {taken} slots; the table held {10 + taken} slots in "
        f"{manager.frames_for(10 + taken)} frames. With {2} accepted it holds {manager.num_tokens('s')} tokens "
        f"in {len(manager.block_table('s'))} frames: the rollback returned "
        f"{manager.num_free_frames - free_before} frame(s) to the free list."
    )
)

# %% [markdown]
# The prefix cache (notebook 4) names a full block by its tokens, so that another prompt with
# the same beginning maps the frame instead of computing it. A block of guesses must never be
# named: if a guess is rejected, the frame would hold K and V of tokens that nobody said, under
# a name that a later prompt could match. `cached_frames` shows what a new prompt would find.

# %%
cache = BlockManager(num_blocks=8, block_size=2)
cache.allocate("t", [1, 2, 3])  # block [1, 2] is full and named
cache.append_guess_slots("t", 3)  # guesses fill block [3, ?] and start another
print(
    "during the step, a prompt 1 2 3 4 finds",
    cache.cached_frames([1, 2, 3, 4]),
    "(only the prompt's block)",
)
cache.settle_guesses("t", [4])  # the guess 4 was right: block [3, 4] is named now
print(
    "after it, the same prompt finds",
    cache.cached_frames([1, 2, 3, 4]),
    "=",
    cache.block_table("t"),
)

# %% [markdown]
# ## The same answers, and what the guessing buys
#
# Greedy decoding with speculation gives exactly the tokens of greedy decoding without it: a
# guess is kept only when it is the model's argmax. What changes is how many forwards the answer
# takes. We run the rewrite prompt and a free chat question both ways.

# %%
import time

chat_ids = llm.tokenizer.encode_chat(
    [{"role": "user", "content": "Write a short story about a dragon."}]
)


def run(spec, prompt_ids):
    """(tokens, steps, seconds, guessed, accepted) of one greedy request."""
    engine = llm.new_engine(block_size=8, num_blocks=128, speculative_config=spec)
    engine.add_request("r", {"prompt_token_ids": prompt_ids}, greedy)
    steps, guessed, accepted, start = 0, 0, 0, time.perf_counter()
    while engine.has_unfinished_requests():
        report = engine.step()
        steps, guessed, accepted = (
            steps + 1,
            guessed + report.guessed,
            accepted + report.accepted,
        )
        tokens = report.finished[0].outputs[0].token_ids if report.finished else None
    return tokens, steps, time.perf_counter() - start, guessed, accepted


lines = [
    "| prompt | decoding | forwards | tokens per forward | accepted guesses | tok/s |",
    "| --- | --- | --- | --- | --- | --- |",
]
for name, ids in (("rewrite", rewrite_ids), ("chat", chat_ids)):
    plain, spec = run(None, ids), run(NGRAM, ids)
    assert spec[0] == plain[0]  # the very same tokens
    for label, (tokens, steps, seconds, guessed, accepted) in (
        ("plain", plain),
        ("n-gram, k=4", spec),
    ):
        rate = f"{accepted}/{guessed}" if guessed else "-"
        lines.append(
            f"| {name} | {label} | {steps} | {len(tokens) / steps:.2f} | {rate} | {len(tokens) / seconds:.1f} |"
        )
display(Markdown("\n".join(lines)))

# %% [markdown]
# Where the answer copies its prompt, many guesses are right and each forward yields several
# tokens. In free chat the last tokens rarely occurred before, the proposer often has nothing
# to guess, and when it guesses it is mostly wrong: each wrong guess costs a row of the forward
# and a slot, and buys nothing. On a CPU with NumPy a forward of five tokens costs noticeably
# more than a forward of one (the arithmetic is not free here, as it nearly is on a GPU at small
# batch), so the wall-clock gain is smaller than the tokens per forward suggest, and it can be
# a loss. The measured figures of `python -m minipaged.bench speculative` are in
# `bench/results/2026-12-01-cpu-2core-numpy-speculative/`.
#
# ## Sampling: the model's distribution, exactly
#
# With temperature above 0, accepting a guess only when it equals the sampled token would
# waste most guesses, and accepting it always would change what the model says. Rejection
# sampling does neither: guess `x`, proposed with probability `q(x)`, is accepted with
# probability `min(1, p(x) / q(x))`; the first rejected one is replaced by a draw from
# `max(0, p - q)`, renormalised. Each emitted token is then distributed exactly as `p`, the
# model's distribution after temperature, top-k and top-p (`minipaged.sampling.verify`). A
# proposer that is sure of its guess has `q(x) = 1`: its guess is kept with probability `p(x)`.
#
# On a vocabulary of 5 tokens, with a guess that the model finds unlikely:

# %%
params, rng = SamplingParams(temperature=1.0), np.random.default_rng(0)
logits = np.array(
    [[2.0, 1.0, 0.5, -1.0, 0.0], [0.0, 1.5, -0.5, 1.0, 0.3]], dtype=np.float32
)
p = distribution(logits[0], params)
first = np.array([verify(logits, [3], params, rng)[0] for _ in range(20_000)])
always = np.where(
    rng.random(20_000) < 0.5, 3, first
)  # a wrong rule: keep the guess half the time
lines = [
    "| token | model p | emitted, rejection sampling | emitted, keeping the guess half the time |",
    "| --- | --- | --- | --- |",
]
for t in range(5):
    lines.append(
        f"| {t} | {p[t]:.3f} | {np.mean(first == t):.3f} | {np.mean(always == t):.3f} |"
    )
display(Markdown("\n".join(lines)))

# %% [markdown]
# ## Exercises

# %% [markdown]
# **Exercise 1.** Guess further ahead: run the rewrite prompt with `num_speculative_tokens` 2 and 8.
# How do the tokens per forward and the share of accepted guesses move?

# %% [markdown]
# <details><summary>Solution 1</summary>
#
# ```python
# for k in (2, 8):
#     tokens, steps, seconds, guessed, accepted = run(NGRAM | {"num_speculative_tokens": k}, rewrite_ids)
#     print(f"k={k}: {len(tokens) / steps:.2f} tokens per forward, {accepted}/{guessed} guesses accepted")
# # More guesses give more tokens per forward where the text is copied, but a smaller share of
# # them is right: the further ahead, the likelier the copy has diverged.
# ```
#
# </details>

# %% [markdown]
# **Exercise 2.** A draft model with no second checkpoint: `{"method": "draft_layers",
# "num_speculative_tokens": 2, "num_draft_layers": L}` guesses with the model's own first `L`
# layers and its head. Measure the share of accepted guesses on the rewrite prompt for `L` = 6
# and 26. Why are the first layers such a poor draft?

# %% [markdown]
# <details><summary>Solution 2</summary>
#
# ```python
# for layers in (6, 26):
#     spec = {"method": "draft_layers", "num_speculative_tokens": 2, "num_draft_layers": layers}
#     tokens, steps, seconds, guessed, accepted = run(spec, rewrite_ids)
#     print(f"L={layers}: {accepted}/{guessed} accepted, {len(tokens) / seconds:.1f} tok/s")
# # The head was trained on the last layer's output only: an early layer's hidden state is not
# # yet the next token's embedding, so its argmax is rarely the model's. Drafts that work are
# # trained for it (a small model of the same family, or early-exit heads as in LayerSkip).
# ```
#
# </details>

# %% [markdown]
# **Exercise 3.** A guess must never write into a frame that another sequence maps. Fork a
# sequence whose last frame is half full, take one guess slot for the child, and look at the
# copy-on-write pair `append_guess_slots` returns and at the parent's reference counts.

# %% [markdown]
# <details><summary>Solution 3</summary>
#
# ```python
# shared = BlockManager(num_blocks=8, block_size=4)
# shared.allocate("parent", [1, 2, 3])
# shared.fork("parent", "child")
# taken, copies = shared.append_guess_slots("child", 1)
# print(copies, shared.block_table("parent"), shared.block_table("child"), shared.table_view("parent").ref_counts)
# # One pair (parent's frame -> a new frame): the child's guess goes into its own copy, and the
# # parent's frame is back to reference count 1.
# ```
#
# </details>

# %% [markdown]
# ## Lab
#
# Now write it yourself (lab 9, [labs/README.md](../labs/README.md)). In a terminal, at the top of
# the repository, with the project's environment active (`source .venv/bin/activate`), copy the
# starter, fill in the bodies, and grade it:
#
# - **Lab 9** (about 30 minutes): the n-gram proposer and the page table's rollback of rejected guesses.
#
#   ```
#   cp labs/lab9_speculation.py my_speculation.py
#   python -m minipaged.lab check 9 my_speculation.py
#   ```
#
# The check names each property your code breaks, on an input that shows it. Once they all
# hold, it runs SmolLM2 with your code plugged in, next to the engine's own, and draws the
# lab's picture. Stuck? `python -m minipaged.lab hint 9` shows the next hint, one at a time, from the idea to the code.
