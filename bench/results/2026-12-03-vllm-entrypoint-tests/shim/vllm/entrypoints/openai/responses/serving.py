"""Stub: the name vLLM's test_structured_output.py imports. Its unit tests of vLLM's own
helper are not applicable (skipped by conftest.py); minipaged has no such function."""


def _constraint_to_content_format(params):
    raise NotImplementedError("vLLM's in-process helper: not applicable to minipaged")
