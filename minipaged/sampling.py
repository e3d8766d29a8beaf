"""How the next token is chosen: `SamplingParams` (vLLM's names) and the sampler.

The last stop of each step: logits of the rows that need a token become token ids
(`sample`). Beam search is not a sampler: the engine keeps the best beams (beam.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# a temperature this small is greedy (vLLM's _SAMPLING_EPS): logits / 1e-40 overflow
GREEDY_BELOW = 1e-5
# the per-token stop check of one request stays cheap for all
MAX_STOP_STRINGS, MAX_STOP_LEN = (
    16,
    256,
)


@dataclass(slots=True)
class StructuredOutputsParams:
    """vLLM's structured output: exactly one of a JSON schema (`json`, a dict or its
    JSON text), any JSON object (`json_object=True`), a regular expression (`regex`) or
    one of some strings (`choice`); the answer is held to it token by token
    (minipaged/structured, meeting 16).
    """

    json: dict | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    json_object: bool | None = None
    # vLLM's context-free grammar: refused here (a pushdown automaton)
    grammar: str | None = None

    def __post_init__(self):
        given = [
            name
            for name in ("json", "regex", "choice", "json_object", "grammar")
            if getattr(self, name) not in (None, False)
        ]
        if len(given) != 1:
            raise ValueError(
                "structured_outputs takes exactly one of json, regex, choice and"
                f" json_object, got {', '.join(given) or 'none'}"
            )
        if self.grammar is not None:
            raise ValueError(
                "structured_outputs.grammar (a context-free grammar) is not supported:"
                " minipaged's automata are finite-state (a regex, a JSON schema, a"
                " choice); use one of those"
            )
        if self.regex is not None and not isinstance(self.regex, str):
            raise ValueError(
                f"structured_outputs.regex must be a string, got {self.regex!r:.80}"
            )
        if self.choice is not None and (
            not isinstance(self.choice, (list, tuple))
            or not self.choice
            or not all(isinstance(c, str) and c for c in self.choice)
        ):
            raise ValueError(
                "structured_outputs.choice must be a list of non-empty strings, got"
                f" {self.choice!r:.80}"
            )
        if self.json is not None and not isinstance(self.json, (dict, str)):
            raise ValueError(
                "structured_outputs.json must be a JSON schema (an object or its"
                f" text), got {self.json!r:.80}"
            )

    def key(self) -> str:
        """One string per constraint: equal constraints share one compiled automaton."""
        import json

        return json.dumps(
            [self.json, self.regex, self.choice, bool(self.json_object)], sort_keys=True
        )


@dataclass(slots=True)
class SamplingParams:
    n: int = 1  # parallel samples of the same prompt
    temperature: float = 1.0  # 0 (or under GREEDY_BELOW) = greedy
    top_k: int = -1  # -1 = all tokens
    top_p: float = 1.0  # nucleus: smallest set of tokens with this much probability
    max_tokens: int = 16
    stop: list[str] = field(default_factory=list)  # stop strings (not in the output)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    beam_width: int = 1  # > 1: beam search (deterministic); returns the n best beams
    # vLLM's controls of the logits, applied in vLLM's order (adjust): 0, 1, 0, 0, {}
    # are off
    # in [-2, 2]: subtracted once from a token already in the output
    presence_penalty: float = 0.0
    # in [-2, 2]: subtracted per time a token is in the output
    frequency_penalty: float = 0.0
    # > 0: divides (logit > 0) or multiplies a token of prompt or output
    repetition_penalty: float = 1.0
    # in [0, 1]: drops tokens less likely than min_p times the likeliest
    min_p: float = 0.0
    # neither an end-of-sequence nor a stop token before this many tokens
    min_tokens: int = 0
    # token id -> added to its logit, in [-100, 100]
    logit_bias: dict[int, float] = field(default_factory=dict)
    logprobs: int | None = (
        # per output token: its log probability and the `logprobs` likeliest (-1: all)
        None
    )
    # the same for each prompt token after the first (read by the prefill)
    prompt_logprobs: int | None = None
    # the answer held to a regex, schema, choice
    structured_outputs: StructuredOutputsParams | dict | None = None

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Check every field's type and range (ValueError naming the field); the engine
        calls it again at add_request, so a field changed after construction is checked
        too.
        """
        self.stop = (
            [self.stop]
            if isinstance(self.stop, str)
            else []
            if self.stop is None
            else self.stop
        )
        self.stop_token_ids = int_list(
            [] if self.stop_token_ids is None else self.stop_token_ids, "stop_token_ids"
        )
        for name, low in [
            ("n", 1),
            ("max_tokens", 1),
            ("beam_width", 1),
            ("top_k", -1),
            ("min_tokens", 0),
        ]:
            check_int(name, getattr(self, name), low)
        check_real("temperature", self.temperature, 0, "(0 = greedy)")
        check_real("top_p", self.top_p, 0, "and at most 1")
        for name, low, high in [
            ("presence_penalty", -2, 2),
            ("frequency_penalty", -2, 2),
            ("min_p", 0, 1),
        ]:
            check_range(name, getattr(self, name), low, high)
        if (
            not is_number(self.repetition_penalty)
            or not 0 < self.repetition_penalty < np.inf
        ):
            raise ValueError(
                "repetition_penalty must be a number greater than zero (1 = off), "
                f"got {self.repetition_penalty!r}"
            )
        self.logit_bias = check_logit_bias(
            {} if self.logit_bias is None else self.logit_bias
        )
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), -1)
        if self.seed is not None:
            check_int("seed", self.seed, 0)
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        if self.structured_outputs is not None and not isinstance(
            self.structured_outputs, StructuredOutputsParams
        ):
            raise ValueError(
                "structured_outputs must be StructuredOutputsParams (or a dict of its"
                f" fields), got {self.structured_outputs!r:.80}"
            )
        if not isinstance(self.ignore_eos, (bool, np.bool_)):
            raise ValueError(
                f"ignore_eos must be True or False, got {self.ignore_eos!r}"
            )
        if not isinstance(self.stop, (list, tuple)) or not all(
            isinstance(s, str) and s for s in self.stop
        ):
            raise ValueError(
                "stop must be a string or a list of non-empty strings, got"
                f" {self.stop!r:.80}"
            )
        if len(self.stop) > MAX_STOP_STRINGS or any(
            len(s) > MAX_STOP_LEN for s in self.stop
        ):
            raise ValueError(
                f"stop takes at most {MAX_STOP_STRINGS} strings of at most"
                f" {MAX_STOP_LEN} characters (each is checked after every token), got"
                f" {len(self.stop)} strings, the longest {max(map(len, self.stop))}"
                " characters"
            )
        for ok, message in self._relations():
            if not ok:
                raise ValueError(message)

    def _relations(self) -> list[tuple[bool, str]]:
        beam = self.beam_width > 1
        return [
            (self.top_k != 0, "top_k must be -1 (off) or >= 1, got 0"),
            (
                self.top_p > 0 and self.top_p <= 1,
                f"top_p must be in (0, 1], got {self.top_p}",
            ),
            (
                not beam or self.n <= self.beam_width,
                (
                    f"beam search returns at most beam_width={self.beam_width} beams,"
                    f" but n={self.n}"
                ),
            ),
            (
                not beam or not self.stop,
                "stop strings are not supported with beam search",
            ),
            (
                not beam or self.temperature in (0, 1),
                (
                    "beam search ranks beams by the model's own log probabilities, so"
                    f" temperature={self.temperature} would be ignored: leave it at 1.0"
                    " (or 0)"
                ),
            ),
            (
                not beam or (self.top_k == -1 and self.top_p == 1),
                (
                    "beam search considers every token: top_k and top_p cannot be set"
                    " with beam_width > 1"
                ),
            ),
            (
                self.min_tokens <= self.max_tokens,
                (
                    f"min_tokens must be at most max_tokens={self.max_tokens}, got"
                    f" {self.min_tokens}"
                ),
            ),
            # beams are ranked by the model's own log probabilities (beam.step): a
            # control of the logits would be silently left out of the ranking, so it is
            # refused, as top_k is
            (
                not beam or not (self.adjusts_logits or self.min_p),
                (
                    "beam search ranks beams by the model's own log probabilities:"
                    " presence_penalty, frequency_penalty, repetition_penalty, min_p,"
                    " min_tokens and logit_bias cannot be set with beam_width > 1"
                ),
            ),
            (
                not beam or self.structured_outputs is None,
                (
                    "structured_outputs cannot be set with beam_width > 1: beams are"
                    " ranked by the model's own log probabilities, which the"
                    " automaton's mask would change"
                ),
            ),
            (
                not beam or self.logprobs is None,
                (
                    "logprobs cannot be set with beam_width > 1: each beam's "
                    "cumulative_logprob is in its output"
                ),
            ),
        ]

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def adjusts_logits(self) -> bool:
        """Do penalties, logit_bias or min_tokens change this request's logits
        (adjust)?"""
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1
            or self.logit_bias
            or self.min_tokens
        )

    @property
    def skip_reading_prefix_cache(self) -> bool:
        """vLLM's: prompt logprobs need the logits of every prompt token, so none may be
        a cache hit."""
        return self.prompt_logprobs is not None

    def ends(self, token: int, eos_token_ids) -> bool:
        """Does this token end the text: an end-of-sequence token (unless ignore_eos),
        or a stop token?"""
        return (
            token in eos_token_ids and not self.ignore_eos
        ) or token in self.stop_token_ids


def is_int(value) -> bool:
    """A Python or NumPy integer, not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(
        value, (bool, np.bool_)
    )


def is_number(value) -> bool:
    """A Python or NumPy integer or float, not a bool."""
    return is_int(value) or isinstance(value, (float, np.floating))


def check_int(name: str, value, minimum: int) -> None:
    if not is_int(value):
        raise ValueError(
            f"{name} must be an integer >= {minimum}, got {value!r}"
            f" ({type(value).__name__})"
        )
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")


def check_real(name: str, value, minimum: float, more: str) -> None:
    if not is_number(value) or not minimum <= value < np.inf:
        raise ValueError(f"{name} must be a number >= {minimum} {more}, got {value!r}")


def check_range(name: str, value, low: float, high: float) -> None:
    if not is_number(value) or not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value!r}")


def check_logit_bias(bias) -> dict[int, float]:
    """{token id: bias in [-100, 100]} (OpenAI's bounds), else a ValueError naming
    logit_bias."""
    if not isinstance(bias, dict):
        raise ValueError(
            f"logit_bias must be a dict of token id -> bias, got {type(bias).__name__}"
        )
    for token, value in bias.items():
        if not is_int(token) or token < 0:
            raise ValueError(
                f"logit_bias keys must be token ids (integers >= 0), got {token!r:.40}"
            )
        check_range(f"logit_bias[{token}]", value, -100, 100)
    return {int(t): float(v) for t, v in bias.items()}


def int_list(value, name: str) -> list[int]:
    """A list of ints from a list or tuple of ints, or a 1-D NumPy integer array;
    anything else (floats, strings, bools, nesting) is a ValueError naming `name`:
    nothing is coerced.
    """
    if isinstance(value, np.ndarray):
        if value.ndim != 1 or not np.issubdtype(value.dtype, np.integer):
            raise ValueError(
                f"{name} must be a 1-D integer array, got {value.dtype} of shape"
                f" {value.shape}"
            )
        return value.tolist()
    if not isinstance(value, (list, tuple)):
        raise ValueError(
            f"{name} must be a list of integers, got {type(value).__name__}"
            f" {value!r:.40}"
        )
    for v in value:
        if not is_int(v):
            raise ValueError(
                f"{name} must hold integers only, got {v!r:.40} ({type(v).__name__})"
            )
    return [int(v) for v in value]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log p for each row of logits (rows, vocab), computed stably in float64."""
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


class RandomStream:
    """A sequence's randomness, by token position: the draws for its token at position p
    come from a generator seeded with (seed, sample index, p), so a seeded request gets
    the same tokens whatever runs beside it, however many guesses it got, and after a
    preemption. Unseeded: one fresh generator for every position."""

    def __init__(self, seed: int | None, sample_index: int = 0):
        self.key = None if seed is None else (seed, sample_index)
        self.rng = np.random.default_rng() if seed is None else None

    def at(self, position: int) -> np.random.Generator:
        return (
            self.rng
            if self.key is None
            else np.random.default_rng([*self.key, position])
        )


def make_generator(params: SamplingParams, sample_index: int = 0) -> RandomStream:
    """One random stream per sequence (see RandomStream): seeded requests are
    reproducible in any batch."""
    return RandomStream(params.seed, sample_index)


def sample(
    logits: np.ndarray,
    params: list[SamplingParams],
    generators: list[np.random.Generator],
    seqs: list | None = None,
    eos_token_ids=(),
) -> list[int]:
    """One token id per row of logits (rows, vocab), float32 on the host. The penalties,
    logit_bias and min_tokens first (adjust: they read each row's sequence, anything
    with token_ids and prompt_len); then greedy when temperature is 0; otherwise
    temperature, min-p, top-k, top-p, then a draw from each sequence's own random
    generator, so a seeded request gets the same tokens whatever else is in the batch. A
    sequence with a `constraint` (its
    structured output's automaton) takes only the tokens it allows (held)."""
    if seqs is not None:
        logits = held(
            adjust(logits, params, seqs, eos_token_ids),
            [getattr(s, "constraint", None) for s in seqs],
            logits,
        )
    # greedy for all rows; sampled rows overwrite
    tokens = logits.argmax(axis=-1).tolist()
    for row, (p, gen) in enumerate(zip(params, generators)):
        if not p.greedy:
            tokens[row] = sample_row(logits[row], p, gen)
    return tokens


def adjust(
    logits: np.ndarray, params: list[SamplingParams], seqs: list, eos_token_ids=()
) -> np.ndarray:
    """vLLM's controls of the logits (rows, vocab), in vLLM's order: min_tokens bans the
    ends (every end-of-sequence and stop token) while the output is shorter; logit_bias
    adds; then the penalties (vllm/model_executor/layers/utils.py, apply_penalties):
    repetition_penalty divides the positive logits and multiplies the others of every
    token in prompt or output, frequency_penalty is subtracted per time a token is in
    the output, presence_penalty once. The rows that ask for none are returned as they
    are (and the array itself when none asks).
    """
    rows = [i for i, p in enumerate(params) if p.adjusts_logits]
    if not rows:
        return logits
    # (len(rows), vocab), a copy
    x, vocab = (
        logits[rows].astype(np.float32),
        logits.shape[-1],
    )
    # each token's count in the output
    counts = np.zeros((len(rows), vocab), dtype=np.int32)
    in_prompt = np.zeros((len(rows), vocab), dtype=bool)
    banned = np.zeros((len(rows), vocab), dtype=bool)  # min_tokens: the ends, for now
    for j, i in enumerate(rows):
        p, seq = params[i], seqs[i]
        output = seq.token_ids[seq.prompt_len :]
        counts[j] = np.bincount(np.asarray(output, dtype=np.int64), minlength=vocab)[
            :vocab
        ]
        in_prompt[j, seq.token_ids[: seq.prompt_len]] = True
        if len(output) < p.min_tokens:
            banned[j, [t for t in {*eos_token_ids, *p.stop_token_ids} if t < vocab]] = (
                True
            )
        if p.logit_bias:
            x[j, list(p.logit_bias)] += np.array(
                list(p.logit_bias.values()), dtype=np.float32
            )
    repetition, frequency, presence = (
        np.array([getattr(params[i], name) for i in rows], dtype=np.float64)[:, None]
        for name in ("repetition_penalty", "frequency_penalty", "presence_penalty")
    )
    # (len(rows), vocab)
    repetition = np.where(in_prompt | (counts > 0), repetition, 1.0)
    # a penalty of 1e-300 or 1e300 overflows: bounded, never inf or NaN
    with np.errstate(over="ignore"):
        x = (
            np.where(x > 0, x / repetition, x * repetition)
            - frequency * counts
            - presence * (counts > 0)
        )
    x = np.clip(x, -LOGIT_BOUND, LOGIT_BOUND).astype(np.float32)
    # the bans last, which is the same as first (-inf stays -inf through the rest),
    # vLLM's order
    x[banned] = -np.inf
    out = logits.copy()
    out[rows] = x
    return out


def held(
    logits: np.ndarray, constraints: list, raw: np.ndarray | None = None
) -> np.ndarray:
    """Each row whose constraint is not None keeps only the tokens it allows now (the
    others become -inf): the mask of structured output, one bool row (vocab,) per
    constrained row. Where the controls left no allowed token finite (min_tokens banning
    the end the automaton
    asks for), the automaton wins: that row's allowed tokens keep their `raw` logits."""
    rows = [i for i, c in enumerate(constraints) if c is not None]
    if not rows:
        return logits
    out = logits.copy()
    for i in rows:
        allowed = constraints[i].allowed()  # (vocab,) bool: the automaton's state
        if not allowed.any():  # a dead state (cannot happen once held)
            continue
        row = np.where(allowed, out[i], -np.inf)
        if not np.isfinite(row).any() and raw is not None:
            row = np.where(allowed, raw[i], -np.inf)
        out[i] = row
    return out


def held_rows(logits: np.ndarray, constraint, extra: list[int]) -> np.ndarray:
    """The logits (1 + len(extra), vocab) of a row that ran extra tokens (speculation's
    guesses): row k is held to the constraint's state after extra[:k], so verification
    checks each guess against it (a guess the automaton refuses has logit -inf and is
    rejected; rows after it are never read)."""
    if constraint is None:
        return logits
    walk, states = constraint.fork(), [constraint.fork()]
    for token in extra[: len(logits) - 1]:
        walk.advance(token)
        states.append(walk.fork())
    return held(logits, states, logits)


# adjusted logits stay within it: divided by any temperature >= GREEDY_BELOW, still
# finite
LOGIT_BOUND = 1e30


def sample_row(logits: np.ndarray, p: SamplingParams, gen: np.random.Generator) -> int:
    """Temperature -> min-p -> top-k -> top-p -> draw, for one row of logits
    (vocab,)."""
    order, kept = candidates(logits, p)
    return int(draw(kept, gen) if order is None else order[draw(kept, gen)])


def candidates(
    logits: np.ndarray, p: SamplingParams
) -> tuple[np.ndarray | None, np.ndarray]:
    """Temperature -> min-p -> top-k -> top-p of one row (vocab,): the token ids left,
    most likely first (None: all of them, in id order), and their weights (not
    normalised).
    """
    scaled = logits / np.float32(p.temperature)
    # (vocab,), not yet normalised: the likeliest is 1
    probs = np.exp(scaled - scaled.max())
    if p.min_p > 0:  # vLLM's: below min_p times the likeliest
        probs = np.where(probs < p.min_p, 0.0, probs)
    k = p.top_k if p.top_k > 0 else len(probs)
    if k == len(probs) and p.top_p == 1.0:
        return None, probs
    order = most_likely(probs, min(k, HEAD))  # token ids, most likely first
    if len(order) < k and probs[order].sum() < p.top_p * probs.sum():
        order = most_likely(probs, k)  # a flat distribution: sort them all
    kept = probs[order] / probs[order].sum()
    if p.top_p < 1.0:
        # smallest prefix reaching top_p
        n = int(np.searchsorted(np.cumsum(kept), p.top_p)) + 1
        order, kept = order[:n], kept[:n]
    return order, kept


def distribution(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    """The probabilities (vocab,) float64 that sample_row draws one row's token from."""
    if p.greedy:
        out = np.zeros(len(logits))
        out[int(logits.argmax())] = 1.0
        return out
    order, kept = candidates(logits, p)
    out = np.zeros(len(logits))
    out[slice(None) if order is None else order] = kept
    return out / out.sum()


def verify(
    logits: np.ndarray,
    draft: list[int],
    p: SamplingParams,
    gen,
    draft_probs: np.ndarray | None = None,
) -> list[int]:
    """Speculative sampling (Leviathan et al. 2023): logits (len(draft) + 1, vocab) are
    the model's at the last token and at each guess; `gen` is a generator, or one per
    row. Guess x, proposed with probability q(x) (draft_probs (len(draft), vocab)), is
    accepted with probability min(1, p(x) / q(x)); the first rejected one is replaced by
    a draw from max(0, p - q), renormalised; if all are accepted, one more token is
    sampled from the last row. Each emitted token is then distributed as the model's own
    (greedy: its argmax). draft_probs None: the proposer is sure (q = 1 at x). Then
    accepting x with probability p(x) and else drawing from p without x is the same as
    drawing from p and comparing with x: so each row's token is drawn as the sampler
    would draw it, and kept guesses are those it equals.
    """
    gens = gen if isinstance(gen, list) else [gen] * len(logits)
    out = []
    for i, x in enumerate(draft):
        if draft_probs is None:
            out.append(
                int(logits[i].argmax())
                if p.greedy
                else sample_row(logits[i], p, gens[i])
            )
            if out[-1] != x:
                return out
            continue
        probs = distribution(logits[i], p)  # (vocab,)
        if gens[i].random() * draft_probs[i][x] < probs[x]:
            out.append(int(x))
            continue
        return out + [draw(np.maximum(probs - draft_probs[i], 0.0), gens[i])]
    last = logits[len(draft)]
    return out + [
        int(last.argmax()) if p.greedy else sample_row(last, p, gens[len(draft)])
    ]


def draw(weights: np.ndarray, gen: np.random.Generator) -> int:
    """An index drawn with probability proportional to `weights` (inverse of the
    CDF)."""
    cdf = np.cumsum(weights, dtype=np.float64)
    return min(
        int(np.searchsorted(cdf, gen.random() * cdf[-1], side="right")), len(cdf) - 1
    )


# top-p usually keeps a few dozen tokens: sort a head this long, not the vocabulary
HEAD = 1024


def most_likely(probs: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries, largest first (a partial sort: a full one costs
    ms)."""
    if k >= len(probs):
        return np.argsort(-probs, kind="stable")
    head = np.argpartition(-probs, k - 1)[:k]
    return head[np.argsort(-probs[head], kind="stable")]
