"""Stub: the name vLLM's test_structured_output.py imports (its unit tests are N/A)."""


class StructuredOutputsParams:
    def __init__(self, **fields):
        self.fields = fields
