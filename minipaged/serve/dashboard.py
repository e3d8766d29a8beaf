"""Snapshots of the engine for the live dashboard: frame map, page tables, queues, timeline.

A watcher of the engine loop: after a step it publishes one plain dict, which dashboard.html
receives as a server-sent event and a notebook can fetch as JSON (/dashboard/snapshot).
"""

from __future__ import annotations

import time
from collections import deque
from importlib import resources

from minipaged.viz import PALETTE


def page() -> str:
    """The dashboard: one HTML file with its script inline (no build step, no CDN)."""
    return resources.files("minipaged.serve").joinpath("dashboard.html").read_text()


class Dashboard:
    """After a step (at most every `interval` seconds, about ten times a second, and once more
    when the engine falls idle) it reads the block manager and the scheduler's queues on the
    engine thread and publishes one plain dict as `latest`. It names requests by id and counts
    their tokens; their text only with `show_text` (the server's --dashboard-show-text), and
    `public` is always the same snapshot without text (what a client without the API key gets)."""

    def __init__(self, model_name: str, interval: float = 0.1, show_text: bool = False,
                 timeline_steps: int = 200):
        self.model_name, self.interval, self.show_text = model_name, interval, show_text
        self.timeline: deque[dict] = deque(maxlen=timeline_steps)  # one row per step, newest last
        self.recent: deque[tuple[float, int]] = deque()            # (time, tokens sampled) for tok/s
        self.totals = {"steps": 0, "finished": 0, "preemptions": 0, "prompt_tokens": 0, "cached_tokens": 0}
        self.latest: dict | None = None  # replaced, never changed: readers on other threads are safe
        self.public: dict | None = None  # latest without prompts and answers
        self.version, self.published = 0, 0.0

    # ---- the engine loop's watcher interface (engine thread) ---------------------------------
    def stepped(self, engine, report, idle: bool) -> None:
        now = time.perf_counter()
        if report is not None:
            self._record(report, now)
        if idle or now - self.published >= self.interval:
            latest = self.snapshot(engine, now)
            self.public = without_text(latest) if self.show_text else latest
            self.latest = latest
            self.version, self.published = self.version + 1, now

    def finished(self, output, stream) -> None:
        self.totals["finished"] += 1
        self.totals["prompt_tokens"] += len(output.prompt_token_ids)
        self.totals["cached_tokens"] += output.num_cached_tokens

    def _record(self, report, now: float) -> None:
        self.totals["steps"] += 1
        self.totals["preemptions"] += len(report.preempted)
        self.recent.append((now, len(report.ran)))  # each row of the batch sampled a token
        while self.recent and self.recent[0][0] < now - 2.0:
            self.recent.popleft()
        self.timeline.append({"step": report.step, "ms": round(1000 * report.seconds, 1),
                              "ran": [[rid, index, kind, n] for rid, index, kind, n in report.ran],
                              "preempted": [rid for rid, _ in report.preempted],
                              "padded": [rid for rid, _ in report.padded]})

    # ---- one snapshot ------------------------------------------------------------------------
    def snapshot(self, engine, now: float) -> dict:
        s, blocks = engine.scheduler, engine.blocks
        queues = {"running": list(s.running), "waiting": list(s.waiting), "swapped": list(s.swapped)}
        padding = list(dict.fromkeys(request for request, _ in s.padding if request not in s.running))
        requests = [(r, status) for status, queue in queues.items() for r in queue] + \
                   [(r, "padding") for r in padding]
        index_of = {seq.seq_id: i for i, (r, _) in enumerate(requests) for seq in r.seqs}
        frames: list = [None] * blocks.num_frames  # None: free
        for state in blocks.frame_states():
            if state.owners:
                owners = sorted({index_of[seq_id] for seq_id in state.owners if seq_id in index_of})
                frames[state.frame] = [len(state.owners), *owners]  # [ref count, requests that map it]
            elif state.cached:
                frames[state.frame] = "c"  # a cached prefix block nobody maps: free, but findable again
        span = now - self.recent[0][0] if len(self.recent) > 1 else 0.0
        queries = self.totals["prompt_tokens"]
        return {
            "model": self.model_name, "time": time.time(), "step": self.totals["steps"], "block_size": blocks.block_size,
            "num_frames": blocks.num_frames, "free_frames": blocks.num_free_frames,
            "frames": frames, "palette": PALETTE,
            "requests": [self._request(r, status, blocks) for r, status in requests],
            "queues": {name: [r.request_id for r in queue] for name, queue in queues.items()},
            "timeline": list(self.timeline),
            "counters": {
                "tokens_per_s": round(sum(n for _, n in list(self.recent)[1:]) / span, 1) if span else 0.0,
                "kv_usage": round(1 - blocks.num_free_frames / blocks.num_frames, 4),
                "preemptions": self.totals["preemptions"], "finished": self.totals["finished"],
                "prefix_hit_rate": round(self.totals["cached_tokens"] / queries, 4) if queries else 0.0,
            },
        }

    def _request(self, request, status: str, blocks) -> dict:
        seqs = []
        for seq in request.seqs:
            on_device = blocks.has(seq.seq_id) and not blocks.is_swapped(seq.seq_id)
            seq_view = {"index": seq.index, "tokens": len(seq.token_ids), "finished": seq.finished,
                        "blocks": blocks.block_table(seq.seq_id) if on_device else None}
            if self.show_text:
                seq_view["text"] = seq.released_text
            seqs.append(seq_view)
        view = {"id": request.request_id, "status": status, "prompt_tokens": len(request.prompt_token_ids),
                "output_tokens": sum(len(seq.output_ids) for seq in request.seqs), "seqs": seqs}
        if self.show_text:
            view["prompt"] = request.prompt
        return view


def without_text(snapshot: dict) -> dict:
    """A snapshot with its prompts and answers left out: ids, token counts and frames only."""
    requests = [{k: v for k, v in r.items() if k != "prompt"}
                | {"seqs": [{k: v for k, v in seq.items() if k != "text"} for seq in r["seqs"]]}
                for r in snapshot["requests"]]
    return snapshot | {"requests": requests}
