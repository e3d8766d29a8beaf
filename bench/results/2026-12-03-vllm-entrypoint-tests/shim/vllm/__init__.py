"""Stub of the few vLLM modules vLLM's entrypoint tests import (for the minipaged run); not vLLM."""
