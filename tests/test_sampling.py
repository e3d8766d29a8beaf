"""The sampler: greedy is argmax, filters keep the right tokens, draws follow the
distribution."""

import numpy as np
import pytest

from minipaged.sampling import SamplingParams, make_generator, sample, sample_row


def test_greedy_is_argmax_per_row():
    logits = np.random.default_rng(0).standard_normal((5, 300)).astype(np.float32)
    params = [SamplingParams(temperature=0)] * 5
    assert sample(logits, params, [None] * 5) == logits.argmax(axis=1).tolist()


def test_top_k_1_and_tiny_top_p_are_greedy():
    logits = np.random.default_rng(1).standard_normal(50_000).astype(np.float32)
    gen = np.random.default_rng(0)
    assert (
        sample_row(logits, SamplingParams(temperature=1.0, top_k=1), gen)
        == logits.argmax()
    )
    assert (
        sample_row(logits, SamplingParams(temperature=1.0, top_p=1e-9), gen)
        == logits.argmax()
    )


@pytest.mark.parametrize(
    "params, allowed",
    [
        (SamplingParams(temperature=1.0), {0, 1, 2, 3}),
        (SamplingParams(temperature=1.0, top_k=2), {0, 1}),
        (
            SamplingParams(temperature=1.0, top_p=0.75),
            {0, 1},
        ),  # 0.5 + 0.25 reaches 0.75
        (SamplingParams(temperature=1.0, top_p=0.8), {0, 1, 2}),
    ],
)
def test_draws_follow_the_filtered_distribution(params, allowed):
    probs = np.array([0.5, 0.25, 0.15, 0.10])
    logits = np.log(probs).astype(np.float32)
    gen = np.random.default_rng(0)
    counts = np.bincount(
        [sample_row(logits, params, gen) for _ in range(4000)], minlength=4
    )
    assert set(np.flatnonzero(counts)) == allowed
    expected = np.where([i in allowed for i in range(4)], probs, 0)
    expected /= expected.sum()
    assert np.abs(counts / 4000 - expected).max() < 0.03  # ~4 sigma at these counts


def test_temperature_sharpens():
    logits = np.log(np.array([0.6, 0.4])).astype(np.float32)
    gen = np.random.default_rng(0)
    cold = sum(
        sample_row(logits, SamplingParams(temperature=0.25), gen) == 0
        for _ in range(2000)
    )
    assert cold / 2000 > 0.8  # 0.6^4 / (0.6^4 + 0.4^4) = 0.835


def test_flat_distribution_with_top_p_falls_back_to_a_full_sort():
    # top-p 0.5 needs 2500 tokens: more than the head
    logits = np.zeros(5000, dtype=np.float32)
    gen = np.random.default_rng(0)
    draws = [
        sample_row(logits, SamplingParams(temperature=1.0, top_p=0.5), gen)
        for _ in range(300)
    ]
    assert len(set(draws)) > 200


def test_seeded_generators_repeat_by_position():
    """A seeded stream draws the same at the same (sample, position), otherwise not."""
    p = SamplingParams(temperature=1.0, seed=3)
    a = [make_generator(p, 1).at(7).random() for _ in range(2)]
    assert a[0] == a[1]
    assert (
        make_generator(p, 0).at(7).random() != a[0]
        and make_generator(p, 1).at(8).random() != a[0]
    )
    unseeded = make_generator(SamplingParams(temperature=1.0), 1)
    # one fresh stream, drawn twice
    assert unseeded.at(7).random() != unseeded.at(7).random()
