"""A pytest plugin: every engine a test builds without its own max_num_batched_tokens
runs with chunked prefill and a budget of CHUNK tokens per step (continuous scheduler
only), so suites written before chunked prefill check it too.
tests/test_chunked_prefill.py runs the equivalence suites under it: `pytest -p
chunked_prefill_plugin tests/test_scheduler.py`.
At the end it writes how many prompt chunks ran to $MINIPAGED_CHUNKS_FILE (if set)."""

import os

from minipaged.engine import EngineConfig
from minipaged.scheduler import Scheduler

CHUNK = int(os.environ.get("MINIPAGED_CHUNK", "5"))
chunks = [0]
_post_init, _schedule_prefill = EngineConfig.__post_init__, Scheduler._schedule_prefill


def chunked_post_init(self):
    if self.scheduler == "continuous" and not self.max_num_batched_tokens:
        self.enable_chunked_prefill, self.max_num_batched_tokens = True, CHUNK
    _post_init(self)


def counted_schedule_prefill(self, request, batch):
    before = len(batch.scheduled)
    _schedule_prefill(self, request, batch)
    # a chunk that is not the last
    chunks[0] += sum(not s.samplers for s in batch.scheduled[before:])


EngineConfig.__post_init__ = chunked_post_init
Scheduler._schedule_prefill = counted_schedule_prefill


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("MINIPAGED_CHUNKS_FILE"):
        with open(os.environ["MINIPAGED_CHUNKS_FILE"], "w") as f:
            f.write(str(chunks[0]))
