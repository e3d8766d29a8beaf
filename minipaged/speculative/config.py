"""`speculative_config`, in vLLM's shape: which proposer guesses, and how many tokens
ahead.

Checked when the engine is built, so a wrong option fails before any memory is sized.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

METHODS = ("ngram", "draft_layers")
# each guess is a KV slot and a row of the verification forward
MAX_SPECULATIVE_TOKENS = 16


@dataclass(slots=True)
class SpeculativeConfig:
    """method "ngram": prompt lookup (the last n tokens found earlier in the sequence,
    the tokens after them proposed), n from prompt_lookup_max down to prompt_lookup_min
    (vLLM's defaults: 5 and 5 when neither is given, else the one given for both).
    method "draft_layers": the first num_draft_layers layers of the model itself, with
    its final norm
    and LM head, guess greedily (a draft model that needs no second checkpoint)."""

    method: str = "ngram"
    num_speculative_tokens: int = 0
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None
    num_draft_layers: int | None = None

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(
                f"speculative_config method must be one of {METHODS}, got"
                f" {self.method!r}"
            )
        k = self.num_speculative_tokens
        if not _is_int(k) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(
                "speculative_config needs num_speculative_tokens, an integer from 1 to"
                f" {MAX_SPECULATIVE_TOKENS} (the tokens guessed per step), got {k!r}"
            )
        if self.method == "ngram":
            self._check_lookup()
        elif self.prompt_lookup_max is not None or self.prompt_lookup_min is not None:
            raise ValueError(
                "prompt_lookup_max / prompt_lookup_min are options of method 'ngram'"
                " only"
            )
        if (
            self.method == "draft_layers"
            and self.num_draft_layers is not None
            and (not _is_int(self.num_draft_layers) or self.num_draft_layers < 1)
        ):
            raise ValueError(
                "num_draft_layers must be an integer >= 1, got"
                f" {self.num_draft_layers!r}"
            )
        if self.method == "ngram" and self.num_draft_layers is not None:
            raise ValueError(
                "num_draft_layers is an option of method 'draft_layers' only"
            )

    def _check_lookup(self) -> None:
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        low, high = (
            (5, 5)
            if low is None and high is None
            else (high if low is None else low, low if high is None else high)
        )
        for name, value in (("prompt_lookup_min", low), ("prompt_lookup_max", high)):
            if not _is_int(value) or value < 1:
                raise ValueError(
                    f"{name} must be an integer >= 1 (tokens matched), got {value!r}"
                )
        if low > high:
            raise ValueError(
                f"prompt_lookup_min={low} is above prompt_lookup_max={high}"
            )
        self.prompt_lookup_min, self.prompt_lookup_max = low, high

    @classmethod
    def from_dict(cls, options) -> SpeculativeConfig:
        """A config from vLLM's dict (or a SpeculativeConfig, returned as it is)."""
        if isinstance(options, cls):
            return options
        if not isinstance(options, dict):
            raise ValueError(
                "speculative_config must be a dict such as {'method': 'ngram', "
                f"'num_speculative_tokens': 4}}, got {options!r:.80}"
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(
                f"speculative_config has unknown keys {unknown}; known: {sorted(known)}"
            )
        return cls(**options)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
