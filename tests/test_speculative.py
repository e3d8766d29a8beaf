"""Speculative decoding: the options, the proposers, the page table's rollback, the
acceptance rule (greedy exact, sampled equal in distribution to the model's), and the
engine's outputs with speculation equal to those without, over the options it meets."""

from __future__ import annotations

import numpy as np
import pytest

from minipaged import LLM, SamplingParams
from minipaged.paging import BlockManager
from minipaged.sampling import distribution, verify
from minipaged.speculative import SpeculativeConfig, ngram_propose

NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_max": 3,
    "prompt_lookup_min": 1,
}
DRAFT = {"method": "draft_layers", "num_speculative_tokens": 3, "num_draft_layers": 2}


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    from checkpoints import write_checkpoint

    return LLM(
        str(
            write_checkpoint(
                tmp_path_factory.mktemp("spec"), layers=4, max_positions=256
            )
        ),
        device="cpu",
        num_blocks=64,
        block_size=4,
    )


# ---- the option ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, message",
    [
        ({"method": "eagle", "num_speculative_tokens": 2}, "method must be one of"),
        ({"method": "ngram"}, "num_speculative_tokens, an integer from 1 to 16"),
        ({"method": "ngram", "num_speculative_tokens": 17}, "from 1 to 16"),
        ({"method": "ngram", "num_speculative_tokens": True}, "from 1 to 16"),
        (
            {
                "method": "ngram",
                "num_speculative_tokens": 2,
                "prompt_lookup_min": 4,
                "prompt_lookup_max": 2,
            },
            "prompt_lookup_min=4 is above prompt_lookup_max=2",
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 0},
            "prompt_lookup_min must be",
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "draft_model": "x"},
            "unknown keys \\['draft_model'\\]",
        ),
        (
            {
                "method": "draft_layers",
                "num_speculative_tokens": 2,
                "prompt_lookup_max": 3,
            },
            "of method 'ngram' only",
        ),
        (
            {
                "method": "draft_layers",
                "num_speculative_tokens": 2,
                "num_draft_layers": 0,
            },
            "num_draft_layers must be",
        ),
        ("ngram", "must be a dict"),
    ],
)
def test_a_bad_speculative_config_says_what_is_wrong(llm, options, message):
    with pytest.raises(ValueError, match=message):
        llm.new_engine(speculative_config=options)


def test_lookup_sizes_default_as_in_vllm():
    assert (
        SpeculativeConfig("ngram", 2).prompt_lookup_min,
        SpeculativeConfig("ngram", 2).prompt_lookup_max,
    ) == (5, 5)
    config = SpeculativeConfig("ngram", 2, prompt_lookup_max=3)
    assert (config.prompt_lookup_min, config.prompt_lookup_max) == (3, 3)


def test_combinations_that_cannot_speculate_are_refused(llm):
    with pytest.raises(ValueError, match="needs allocator='paged'"):
        llm.new_engine(speculative_config=NGRAM, allocator="contiguous-max")
    with pytest.raises(ValueError, match="needs scheduler='continuous'"):
        llm.new_engine(speculative_config=NGRAM, scheduler="static")
    with pytest.raises(ValueError, match="the model has 4 layers"):
        llm.new_engine(speculative_config=DRAFT | {"num_draft_layers": 4})
    engine = llm.new_engine(speculative_config=NGRAM)
    with pytest.raises(
        ValueError, match="beam search .* cannot run with speculative_config"
    ):
        engine.add_request(
            "b", {"prompt_token_ids": [5, 6]}, SamplingParams(beam_width=2)
        )
    assert not engine.has_unfinished_requests()


# ---- the n-gram proposer -------------------------------------------------------------


def test_ngram_proposes_what_followed_the_latest_longest_match():
    ids = [1, 2, 3, 9, 1, 2, 3, 7, 8, 4, 1, 2, 3]
    assert ngram_propose(ids, 2, 1, 3) == [7, 8]  # the latest earlier "1 2 3"
    assert ngram_propose(ids, 9, 1, 3) == [7, 8, 4, 1, 2, 3]  # as many as there are
    # n = 1: the token after the last 6
    assert ngram_propose([5, 6, 7, 6], 2, 1, 1) == [
        7,
        6,
    ]
    assert ngram_propose([5, 6, 7, 6], 2, 2, 3) == []  # no earlier "7 6"
    assert ngram_propose([4], 3, 1, 3) == []


# ---- rollback in the page table ------------------------------------------------------


def test_guess_slots_roll_back_and_return_the_frames_they_took():
    manager = BlockManager(num_blocks=8, block_size=4)
    manager.allocate("s", [1, 2, 3, 4, 5, 6])
    manager.append_slot("s", 7)  # 7 tokens: frames 2, a slot left in the last
    free = manager.num_free_frames
    assert manager.append_guess_slots("s", 6) == (6, [])  # 13 slots: two more frames
    assert manager.num_tokens("s") == 13 and manager.num_free_frames == free - 2
    manager.settle_guesses("s", [8])  # one right: 8 tokens, the rest rolled back
    assert manager.num_tokens("s") == 8 and manager.num_guesses("s") == 0
    assert len(manager.block_table("s")) == 2 and manager.num_free_frames == free
    manager.rollback("s", 3)  # back into block 0: frame 1 freed
    assert manager.num_tokens("s") == 3 and len(manager.block_table("s")) == 1
    assert manager.num_free_frames == free + 1
    with pytest.raises(ValueError, match="cannot keep 9"):
        manager.rollback("s", 9)


def test_guesses_are_never_named_for_the_prefix_cache_until_accepted():
    manager = BlockManager(num_blocks=8, block_size=2)
    manager.allocate("s", [1, 2, 3])  # block [1, 2] named; 3 in a partial block
    manager.append_guess_slots("s", 3)  # guesses fill block [3, g] and half of the next
    assert manager.cached_frames([1, 2, 3, 4]) == manager.block_table("s")[:1]
    manager.settle_guesses("s", [4])  # 4 was right: block [3, 4] is named now
    assert manager.cached_frames([1, 2, 3, 4]) == manager.block_table("s")[:2]
    manager.append_guess_slots("s", 2)
    manager.settle_guesses("s", [])  # all wrong: nothing more named, frame freed
    assert manager.num_tokens("s") == 4 and len(manager.block_table("s")) == 2
    assert manager.cached_frames([1, 2, 3, 4, 5, 6]) == manager.block_table("s")
    manager.rollback("s", 3)  # a named block cut short is forgotten
    assert manager.cached_frames([1, 2, 3, 4]) == manager.block_table("s")[:1]


def test_a_guess_never_writes_into_a_shared_frame():
    manager = BlockManager(num_blocks=8, block_size=4)
    manager.allocate("parent", [1, 2, 3])
    manager.fork("parent", "child")  # they share the partial frame
    shared = manager.block_table("parent")[0]
    taken, cows = manager.append_guess_slots("child", 1)
    assert (
        taken == 1
        and cows == [(shared, manager.block_table("child")[0])]
        and manager.block_table("child")[0] != shared
    )
    assert manager.table_view("parent").ref_counts == [1]
    # rolled back: the private copy stays the child's
    manager.settle_guesses("child", [])
    assert (
        manager.num_tokens("child") == 3 and manager.block_table("child")[0] != shared
    )


def test_guess_slots_stop_where_the_frames_run_out_without_changing_anything_else():
    manager = BlockManager(num_blocks=2, block_size=2)
    manager.allocate("s", [1, 2, 3])
    # only the slot left in the last frame
    assert manager.append_guess_slots("s", 5) == (
        1,
        [],
    )
    assert manager.num_free_frames == 0 and manager.num_tokens("s") == 4
    manager.settle_guesses("s", [])
    assert manager.num_tokens("s") == 3


# ---- acceptance: greedy exact, sampled the model's own distribution ------------------


def test_greedy_acceptance_keeps_guesses_up_to_the_first_wrong_one_then_the_argmax():
    logits = np.array(
        [[0, 5, 0, 0], [0, 0, 5, 0], [5, 0, 0, 0], [0, 0, 0, 5]], dtype=np.float32
    )
    greedy = SamplingParams(temperature=0)
    assert verify(logits, [1, 2, 0], greedy, None) == [
        1,
        2,
        0,
        3,
    ]  # all right, and one more
    # the second wrong: corrected
    assert verify(logits, [1, 3, 0], greedy, None) == [
        1,
        2,
    ]
    assert verify(logits, [0, 2, 0], greedy, None) == [1]


def total_variation(samples: np.ndarray, probs: np.ndarray) -> float:
    counts = np.bincount(samples, minlength=len(probs)) / len(samples)
    return 0.5 * float(np.abs(counts - probs).sum())


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=3),
        SamplingParams(temperature=1.3, top_p=0.8),
    ],
)
@pytest.mark.parametrize("proposer", ["likely", "unlikely", "sampled"])
def test_rejection_sampling_emits_the_models_distribution(params, proposer):
    """Vocabulary of 5, 20,000 draws: the first emitted token follows p(.| context), the
    second (when the first guess was accepted) p(.| context, guess). The bound 0.02 is
    about four times the expected total variation of 20,000 draws; accepting every guess
    fails it (below).
    """
    rng = np.random.default_rng(0)
    logits = np.array(
        [[2.0, 1.0, 0.5, -1.0, 0.0], [0.0, 1.5, -0.5, 1.0, 0.3], [1, 1, 1, 1, 1]],
        dtype=np.float32,
    )
    p0, p1 = distribution(logits[0], params), distribution(logits[1], params)
    q = np.array([[0.1, 0.2, 0.3, 0.2, 0.2], [0.5, 0.1, 0.1, 0.2, 0.1]])
    guess = {"likely": 0, "unlikely": 3, "sampled": None}[proposer]
    first, second = [], []
    for _ in range(20_000):
        if guess is None:  # a proposer that samples its guesses from q
            draft = [int(rng.choice(5, p=q[0])), int(rng.choice(5, p=q[1]))]
            out = verify(logits, draft, params, rng, draft_probs=q)
        else:
            draft = [guess, 1]
            out = verify(logits, draft, params, rng)
        first.append(out[0])
        if out[0] == draft[0]:
            second.append(out[1])
    assert total_variation(np.array(first), p0) < 0.02
    if guess is not None and p0[guess] > 0.05:
        assert total_variation(np.array(second), p1) < 0.03


def test_the_distribution_test_can_fail():
    """Accepting every guess (no rejection) emits the guess, not the model's choice."""
    params, rng = SamplingParams(temperature=1.0), np.random.default_rng(0)
    logits = np.array([[2.0, 1.0, 0.5, -1.0, 0.0], [1, 1, 1, 1, 1]], dtype=np.float32)
    wrong = [
        0 if rng.random() < 0.5 else verify(logits, [0], params, rng)[0]
        for _ in range(20_000)
    ]
    assert total_variation(np.array(wrong), distribution(logits[0], params)) > 0.1


# ---- the engine: the same outputs with and without speculation -----------------------


def run(engine, requests, abort_at=None):
    """Outputs by request id; requests are (id, prompt ids, params); abort_at: {id:
    step}. The preemptions it saw are left in engine.preempted_modes."""
    for rid, prompt, params in requests:
        engine.add_request(rid, {"prompt_token_ids": prompt}, params)
    outs, step, engine.preempted_modes = {}, 0, set()
    while engine.has_unfinished_requests():
        for rid, when in (abort_at or {}).items():
            if when == step and rid in engine.requests:
                outs[rid] = engine.abort_request(rid)
        if not engine.has_unfinished_requests():
            break
        report = engine.step()
        engine.preempted_modes |= {mode for _, mode in report.preempted}
        for out in report.finished:
            outs[out.request_id] = out
        step += 1
    assert engine.blocks.num_free_frames == engine.blocks.num_frames  # nothing leaked
    return outs


def requests_for(vocab: int, seed: int, n: int = 1):
    rng = np.random.default_rng(seed)
    loop = rng.integers(5, vocab, 4).tolist()
    prompts = [
        loop * 3 + rng.integers(5, vocab, 2).tolist(),
        rng.integers(5, vocab, 7).tolist(),
        loop + loop[:2],
        rng.integers(5, vocab, 3).tolist() * 4,
    ]
    return [
        (
            f"r{i}",
            p,
            SamplingParams(
                temperature=0, max_tokens=int(rng.integers(8, 40)), n=n, ignore_eos=True
            ),
        )
        for i, p in enumerate(prompts)
    ]


def same_tokens(got, want):
    for rid, out in want.items():
        assert [(c.token_ids, c.text, c.finish_reason) for c in got[rid].outputs] == [
            (c.token_ids, c.text, c.finish_reason) for c in out.outputs
        ], rid


OPTIONS = {
    "plain": {},
    "prefix-cache-tiny-blocks": {"block_size": 1, "num_blocks": 256},
    "no-prefix-cache": {"enable_prefix_caching": False, "block_size": 2},
    "tight-recompute": {"num_blocks": 24, "block_size": 2, "max_model_len": 28},
    "tight-swap": {
        "num_blocks": 24,
        "block_size": 2,
        "max_model_len": 28,
        "preemption_mode": "swap",
    },
    "chunked-prefill": {
        "enable_chunked_prefill": True,
        "max_num_batched_tokens": 6,
        "block_size": 2,
    },
}


@pytest.mark.parametrize(
    "spec",
    [NGRAM, DRAFT, NGRAM | {"num_speculative_tokens": 8}],
    ids=["ngram", "draft", "ngram-k8"],
)
@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_greedy_outputs_are_the_same_with_and_without_speculation(llm, spec, name):
    options = {"num_blocks": 64, "block_size": 4} | OPTIONS[name]
    vocab = llm.model.config.vocab_size
    reqs = requests_for(vocab, 0) + [
        (
            f"n{rid}",
            prompt,
            SamplingParams(
                temperature=0, n=2, max_tokens=p.max_tokens, ignore_eos=True
            ),
        )
        for rid, prompt, p in requests_for(vocab, 1)[:2]
    ]  # n = 2: forked samples
    if name.startswith("tight"):
        reqs = [
            (
                rid,
                p[:10],
                SamplingParams(
                    temperature=0, n=params.n, max_tokens=12, ignore_eos=True
                ),
            )
            for rid, p, params in reqs
        ]
    want = run(llm.new_engine(**options), reqs)
    engine = llm.new_engine(speculative_config=spec, **options)
    got = run(engine, reqs)
    same_tokens(got, want)
    assert (
        engine.lookahead.num_accepted > 0
        and engine.lookahead.num_guessed > engine.lookahead.num_accepted
    )  # guesses right and wrong
    if name.startswith("tight"):
        assert engine.preempted_modes == {options.get("preemption_mode", "recompute")}


def test_stops_and_limits_inside_an_accepted_run_cut_as_without_speculation(llm):
    """Stop strings, stop token ids and max_tokens set at every position of the
    reference output:
    wherever the accepted run of guesses crosses them, the output ends exactly there."""
    vocab = llm.model.config.vocab_size
    rid, prompt, params = requests_for(vocab, 0)[0]
    ref = run(llm.new_engine(), [(rid, prompt, params)])[rid].outputs[0]
    words = llm.tokenizer.decode(ref.token_ids).split()
    reqs = []
    for i in range(1, min(len(ref.token_ids), 16)):
        reqs.append(
            (
                f"len{i}",
                prompt,
                SamplingParams(temperature=0, max_tokens=i, ignore_eos=True),
            )
        )
        reqs.append(
            (
                f"id{i}",
                prompt,
                SamplingParams(
                    temperature=0,
                    max_tokens=40,
                    stop_token_ids=[ref.token_ids[i]],
                    ignore_eos=True,
                ),
            )
        )
        if i < len(words):
            reqs.append(
                (
                    f"stop{i}",
                    prompt,
                    SamplingParams(
                        temperature=0, max_tokens=40, stop=[words[i]], ignore_eos=True
                    ),
                )
            )
    want = run(llm.new_engine(), reqs)
    for spec in (NGRAM, DRAFT, "oracle"):
        engine = llm.new_engine(speculative_config=NGRAM if spec == "oracle" else spec)
        # guesses the reference itself, one in four wrong: runs end everywhere
        if spec == "oracle":
            engine.lookahead.proposer = Oracle(
                len(prompt), ref.token_ids + [0] * 40, wrong_every=4
            )
        same_tokens(run(engine, reqs), want)
        assert engine.lookahead.num_accepted > (
            0 if spec != "oracle" else 0.3 * engine.lookahead.num_guessed
        )


class Oracle:
    """A proposer that knows the greedy output (a test's stand-in for a perfect
    guesser), and spoils every `wrong_every`-th guess it makes."""

    def __init__(self, prompt_len: int, output: list[int], wrong_every: int):
        self.prompt_len, self.output, self.wrong_every, self.made = (
            prompt_len,
            output,
            wrong_every,
            0,
        )

    def propose(self, rows) -> list[list[int]]:
        drafts = []
        for s in rows:
            done = len(s.seq.token_ids) - self.prompt_len
            draft = self.output[done : done + s.extra_slots]
            for i in range(len(draft)):
                self.made += 1
                if self.made % self.wrong_every == 0:
                    draft[i] = (draft[i] + 1) % 60
            drafts.append(draft)
        return drafts


def test_aborts_while_speculating_free_everything_and_keep_prefixes(llm):
    vocab = llm.model.config.vocab_size
    reqs = requests_for(vocab, 2)
    want = run(llm.new_engine(), reqs)
    engine = llm.new_engine(speculative_config=NGRAM)
    got = run(engine, reqs, abort_at={"r0": 3, "r2": 5})
    for rid, out in got.items():
        tokens, full = out.outputs[0].token_ids, want[rid].outputs[0].token_ids
        assert tokens == full[: len(tokens)]
        assert (out.outputs[0].finish_reason == "abort") == (rid in ("r0", "r2"))


def test_seeded_sampling_with_speculation_is_reproducible_and_follows_the_model(llm):
    """The same seed gives the same tokens with speculation; over 300 seeds, the third
    output
    token (drawn after guesses were checked) has the same distribution as without it."""
    prompt = requests_for(llm.model.config.vocab_size, 0)[0][1]

    def third_tokens(spec):
        engine = llm.new_engine(num_blocks=256, block_size=4, speculative_config=spec)
        reqs = [
            (
                f"s{i}",
                prompt,
                SamplingParams(temperature=0.8, max_tokens=4, seed=i, ignore_eos=True),
            )
            for i in range(300)
        ]
        return (
            np.array(
                [out.outputs[0].token_ids[2] for out in run(engine, reqs).values()]
            ),
            engine,
        )

    plain, _ = third_tokens(None)
    speculated, engine = third_tokens(NGRAM)
    assert engine.lookahead.num_guessed > 0
    again, _ = third_tokens(NGRAM)
    assert (again == speculated).all()
    # the common tokens: each share within sampling noise
    top = np.argsort(-np.bincount(plain))[:5]
    for token in top:
        a, b = np.mean(plain == token), np.mean(speculated == token)
        assert abs(a - b) < 4 * np.sqrt(max(a, 0.02) * (1 - a) * 2 / 300), (token, a, b)


def test_the_benchmark_reports_each_proposer_and_checks_the_outputs(llm, capsys):
    """`python -m minipaged.bench speculative --json` on the tiny model: every
    configuration of both workloads, greedy outputs identical to plain decoding, plain
    at 1 token per forward.
    """
    import json

    from minipaged.tools.bench import cli

    cli.main(
        [
            "speculative",
            "--model",
            str(llm.folder),
            "--device",
            "cpu",
            "--k",
            "2",
            "4",
            "--draft-layers",
            "2",
            "--max-tokens",
            "12",
            "--repeats",
            "2",
            "--json",
        ]
    )
    result = json.loads(capsys.readouterr().out)
    assert sorted(result["workloads"]) == ["chat", "rewrite"]
    for workload in result["workloads"].values():
        runs = workload["runs"]
        assert list(runs) == ["plain", "ngram k=2", "ngram k=4", "draft_layers L=2 k=2"]
        assert (
            runs["plain"]["tokens_per_forward"] == 1
            and runs["plain"]["acceptance_rate"] is None
        )
        for label, r in runs.items():
            assert r["identical_to_plain"], label
            assert len(r["seconds_all"]) == 2 and r["tokens"] == 4 * 12
            assert r["tokens_per_forward"] == pytest.approx(
                r["tokens"] / (r["tokens"] - r["accepted"])
            )
