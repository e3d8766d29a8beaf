"""Speculative decoding (speculative execution): a cheap proposer guesses the next
tokens, the model checks them all in one forward beside the rest of the batch, and the
page table is rolled back past the first wrong guess. `SpeculativeConfig` is vLLM's
`speculative_config`.
"""

from minipaged.speculative.config import METHODS, SpeculativeConfig
from minipaged.speculative.decoding import SpeculativeDecoding, make_lookahead
from minipaged.speculative.draft import DraftLayers
from minipaged.speculative.ngram import NgramProposer, ngram_propose

__all__ = [
    "METHODS",
    "SpeculativeConfig",
    "SpeculativeDecoding",
    "make_lookahead",
    "NgramProposer",
    "ngram_propose",
    "DraftLayers",
]
