"""The structured-output seam, with a hand-written backend: a sequence with a constraint
takes only the tokens it allows, each sample its own state, through batching,
preemption, speculation and min_tokens; a request without one is unchanged beside it."""

from __future__ import annotations

import numpy as np
import pytest

from minipaged import LLM, SamplingParams
from minipaged.sampling import StructuredOutputsParams

EOS = 2


class Parity:
    """A toy automaton: `regex` "even:K" (or "odd:K") allows K tokens of that parity
    (never the end-of-sequence id), then only the end. Its state is the count of tokens
    taken.
    """

    def __init__(self, vocab_size: int, rule: str, taken: int = 0, log=None):
        self.vocab_size, self.rule, self.taken = vocab_size, rule, taken
        self.log = log if log is not None else []

    def allowed(self):
        parity, count = self.rule.split(":")
        mask = np.zeros(self.vocab_size, dtype=bool)
        if self.taken >= int(count):
            mask[EOS] = True
        else:
            mask[0 if parity == "even" else 1 :: 2] = True
            mask[EOS] = False
        return mask

    def advance(self, token: int) -> None:
        self.log.append(token)
        self.taken += 1

    def fork(self):
        return Parity(self.vocab_size, self.rule, self.taken, self.log)


class ParityBackend:
    name = "parity"

    def __init__(self):
        self.compiled = []

    def compile(self, spec: StructuredOutputsParams):
        if not spec.regex.startswith(("even:", "odd:")):
            raise ValueError(
                "structured_outputs.regex: the parity backend takes 'even:K' or"
                f" 'odd:K', got {spec.regex!r}"
            )
        self.compiled.append(spec.regex)
        return Parity(VOCAB, spec.regex)


VOCAB = 0


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from checkpoints import write_checkpoint

    return str(
        write_checkpoint(tmp_path_factory.mktemp("seam"), layers=2, max_positions=256)
    )


def make(checkpoint, **options):
    global VOCAB
    backend = ParityBackend()
    llm = LLM(checkpoint, device="cpu", structured_outputs_backend=backend, **options)
    VOCAB = llm.engine.model.config.vocab_size
    return llm, backend


def held(rule: str, **fields) -> SamplingParams:
    return SamplingParams(
        structured_outputs=StructuredOutputsParams(regex=rule), **fields
    )


def test_a_held_answer_takes_only_allowed_tokens_and_ends_where_the_automaton_says(
    checkpoint,
):
    llm, backend = make(checkpoint, num_blocks=64, block_size=4)
    out = llm.generate(["the cat sat"], held("odd:5", temperature=0, max_tokens=20))[
        0
    ].outputs[0]
    assert len(out.token_ids) == 6 and out.finish_reason == "stop"
    assert all(t % 2 == 1 for t in out.token_ids[:5]) and out.token_ids[5] == EOS
    assert backend.compiled == ["odd:5"]


def test_each_sample_walks_its_own_state_and_a_free_request_beside_it_is_unchanged(
    checkpoint,
):
    llm, _ = make(checkpoint, num_blocks=64, block_size=4)
    free = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    alone = llm.generate(["a dog ran"], free)[0].outputs[0].token_ids
    outs = llm.generate(
        ["the cat sat", "a dog ran"],
        [held("even:4", n=3, temperature=1.0, seed=7, max_tokens=10), free],
    )
    for sample in outs[0].outputs:
        assert [t % 2 for t in sample.token_ids[:4]] == [0] * 4 and sample.token_ids[
            4:
        ] == [EOS]
    assert outs[1].outputs[0].token_ids == alone


def test_a_preempted_held_request_resumes_at_its_state(checkpoint):
    # 4 requests of up to 24 tokens preempt
    llm, _ = make(checkpoint, num_blocks=10, block_size=4)
    outs = llm.generate(
        ["the cat sat on the mat"] * 4, held("odd:14", temperature=0, max_tokens=20)
    )
    for out in outs:
        ids = out.outputs[0].token_ids
        assert all(t % 2 for t in ids[:14]) and ids[14:] == [EOS], ids


def test_speculation_checks_each_guess_against_the_automaton(checkpoint):
    plain, _ = make(checkpoint, num_blocks=64, block_size=4)
    spec, _ = make(
        checkpoint,
        num_blocks=64,
        block_size=4,
        speculative_config={
            "method": "ngram",
            "num_speculative_tokens": 3,
            "prompt_lookup_max": 2,
        },
    )
    prompts = ["the cat sat the cat sat the cat", "a dog ran a dog ran"]
    params = held("odd:12", temperature=0, max_tokens=16)
    assert [o.outputs[0].token_ids for o in spec.generate(prompts, params)] == [
        o.outputs[0].token_ids for o in plain.generate(prompts, params)
    ]


def test_the_automaton_outranks_min_tokens_when_only_the_end_is_allowed(checkpoint):
    llm, _ = make(checkpoint, num_blocks=64, block_size=4)
    out = llm.generate(
        ["the cat"], held("even:2", temperature=0, max_tokens=10, min_tokens=6)
    )[0].outputs[0]
    assert (
        len(out.token_ids) == 3
        and out.token_ids[-1] == EOS
        and out.finish_reason == "stop"
    )


def test_bad_constraints_are_refused_by_name_and_the_batch_carries_on(checkpoint):
    llm, _ = make(checkpoint, num_blocks=64, block_size=4)
    with pytest.raises(ValueError, match="request '0'.*parity backend takes"):
        llm.engine.add_request("0", "the cat", held("prime:3"))
    with pytest.raises(ValueError, match="beam_width > 1"):
        held("odd:3", beam_width=2, n=1)
    with pytest.raises(ValueError, match="exactly one of"):
        StructuredOutputsParams(regex="a", choice=["b"])
    with pytest.raises(ValueError, match="context-free grammar"):
        StructuredOutputsParams(grammar="root ::= 'a'")
    out = llm.generate(["the cat"], held("odd:2", temperature=0, max_tokens=5))[
        0
    ].outputs[0]
    assert out.finish_reason == "stop" and len(out.token_ids) == 3


def test_the_backend_option_is_checked_when_the_engine_is_built(checkpoint):
    with pytest.raises(
        ValueError, match="structured_outputs_backend must be one of \\('automata',\\)"
    ):
        LLM(
            checkpoint,
            device="cpu",
            num_blocks=16,
            structured_outputs_backend="xgrammar",
        )
