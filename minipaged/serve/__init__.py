"""`python -m minipaged.serve`: an OpenAI-compatible server with a live page-table dashboard.

Many clients at once are what continuous batching and paging are for. The path of a request
over the network: api.py (FastAPI: read, check, tokenize) -> loop.py (the one thread that owns
the engine) -> the engine's steps -> back through the request's asyncio queue as JSON or
server-sent events. metrics.py (Prometheus, vLLM's names) and dashboard.py (snapshots of the
frames, page tables and queues, shown live by dashboard.html) watch the engine loop.

In Python: `Server(engine, tokenizer, ServerConfig(model_name=...))` (minipaged.serve.api), and
`with ServerThread(server) as url:` (minipaged.serve.cli) serves it from a thread of your process.
"""
