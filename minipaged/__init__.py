"""minipaged: a small, readable LLM inference engine that teaches how vLLM serves models.

    from minipaged import LLM, SamplingParams
    llm = LLM()
    llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=16))
"""

from minipaged.llm import LLM
from minipaged.outputs import CompletionOutput, RequestOutput
from minipaged.sampling import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]
