"""`python -m minipaged.serve`: an OpenAI-compatible server with a live page-table
dashboard.

A request's path: api.py (read, check, tokenize) -> loop.py (the one thread that owns
the engine) -> back through the request's asyncio queue; metrics.py and dashboard.py
watch the loop.
"""
