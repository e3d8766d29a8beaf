"""Snapshots of the engine for the live dashboard: frame map, page tables, queues,
timeline, each client's service.

A watcher of the engine loop: after a step it publishes one plain dict, which
dashboard.html receives as a server-sent event and a notebook can fetch as JSON
(/dashboard/snapshot).
"""

from __future__ import annotations

import time
from collections import deque
from importlib import resources

from minipaged.tools.serve.clients import OTHER, ClientNames, served_tokens

# Colours a room tells apart from the back: every pair is at least 35 apart in CIE Lab
# (the pictures' ten colours hold two teals 4 apart), and each is far from the greys of
# free, cached and shared frames. Ink is the label colour that reads on it.
PALETTE = [
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#9467bd",
    "#f3c300",
    "#654522",
    "#17becf",
    "#e68fac",
    "#000080",
    "#c51b7d",
    "#c2b280",
]
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
WINDOW = 5.0  # seconds of tokens/s (vLLM logs its throughput over 5 s too)


def luminance(colour: str) -> float:
    """WCAG's relative luminance of '#rrggbb': 0 black .. 1 white."""
    r, g, b = (
        c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4
        for c in (int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5))
    )
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def ink(colour: str) -> str:
    """The label colour that reads best on a fill: white or near-black, by WCAG's
    contrast ratio."""
    light = luminance(colour) + 0.05
    return (
        "#ffffff"
        if 1.05 / light >= light / (luminance("#111111") + 0.05)
        else "#111111"
    )


def page() -> str:
    """The dashboard: one HTML file with its script inline (no build step, no CDN)."""
    return (
        resources.files("minipaged.tools.serve").joinpath("dashboard.html").read_text()
    )


class Styles:
    """A colour and a letter (the short label the frame map writes in its cells) for
    each live request, given at its first admission, in arrival order, and kept until it
    finishes. No two live requests share a colour while there are colours left; past
    that, a newcomer takes the colour fewest live requests hold. Both go round, so a
    colour just given back waits its turn.
    """

    def __init__(self):
        # request id -> (colour index, letter)
        self.live: dict[str, tuple[int, str]] = {}
        self.gone: dict[str, str] = {}  # the letters of the last requests that finished
        self.next_colour = self.next_letter = 0

    def of(self, request_id: str) -> tuple[int, str]:
        if request_id not in self.live:
            self.live[request_id] = (self._colour(), self._letter())
        return self.live[request_id]

    def release(self, request_id: str) -> None:
        if request_id in self.live:
            self.gone[request_id] = self.live.pop(request_id)[1]
            if len(self.gone) > 256:
                del self.gone[next(iter(self.gone))]

    def letter(self, request_id: str) -> str | None:
        """The letter of a live request, or of one that finished lately (static batching
        still computes its row: padding); None for a request never admitted."""
        return (
            self.live[request_id][1]
            if request_id in self.live
            else self.gone.get(request_id)
        )

    def _colour(self) -> int:
        used = [0] * len(PALETTE)
        for colour, _ in self.live.values():
            used[colour] += 1
        order = [(self.next_colour + i) % len(PALETTE) for i in range(len(PALETTE))]
        # the first of the least used, in turn
        colour = min(order, key=lambda c: used[c])
        self.next_colour = (colour + 1) % len(PALETTE)
        return colour

    def _letter(self) -> str:
        held = {letter for _, letter in self.live.values()}
        for i in range(len(LETTERS)):
            letter = LETTERS[(self.next_letter + i) % len(LETTERS)]
            if letter not in held:
                self.next_letter = (self.next_letter + i + 1) % len(LETTERS)
                return letter
        return next(
            f"{c}{n}" for n in range(2, 10**6) for c in LETTERS if f"{c}{n}" not in held
        )


class Dashboard:
    """After a step (at most every `interval` seconds, about ten times a second, and
    once more when the engine falls idle) it reads the block manager and the scheduler's
    queues on the engine thread and publishes one plain dict as `latest`. It names
    requests by id and counts their tokens; their text only with `show_text` (the
    server's --dashboard-show-text), and `public` is always the same snapshot without
    text (what a client without the API key gets). Given the `engine` (idle, its loop
    not started), it publishes the first snapshot at once.
    """

    def __init__(
        self,
        model_name: str,
        interval: float = 0.1,
        show_text: bool = False,
        timeline_steps: int = 200,
        engine=None,
    ):
        self.model_name, self.interval, self.show_text = model_name, interval, show_text
        # one row per step, newest last
        self.timeline: deque[dict] = deque(maxlen=timeline_steps)
        # (time, tokens sampled), last WINDOW s
        self.recent: deque[tuple[float, int]] = deque()
        self.busy_since: float | None = None  # start of this busy spell (None: idle)
        self.styles = Styles()
        # finished since the last step: their colours go back after it
        self.ending: list[str] = []
        self.totals = {
            "steps": 0,
            "finished": 0,
            "preemptions": 0,
            "guessed": 0,
            "kept": 0,
        }
        # replaced, never changed: readers on other threads are safe
        self.latest: dict | None = None
        self.public: dict | None = None  # latest without prompts and answers
        self.version, self.published = 0, 0.0
        # each client's service: tokens of its requests that left, its tokens of the
        # last WINDOW s
        self.names = ClientNames()
        # client's name -> [prompt, output] tokens of requests that left
        self.served: dict[str, list[int]] = {}
        # request id -> its client, for requests seen and not finished
        self.client_of: dict[str, str] = {}
        # (time, client's name -> tokens computed)
        self.window: deque[tuple[float, dict[str, int]]] = deque()
        if engine is not None:
            # the idle engine at once, before its loop runs: the page draws the empty
            # pool, the queues and the model before the first request (the loop
            # publishes after a step or a request only)
            self.stepped(engine, None, idle=True)

    # ---- the engine loop's watcher interface (engine thread) -------------------------
    def stepped(self, engine, report, idle: bool) -> None:
        now = time.perf_counter()
        if report is not None:
            self._record(report, now)
            self._record_clients(engine, report, now)
        # the loop tells finished() before the step's report
        for request_id in self.ending:
            self.styles.release(request_id)
            self.client_of.pop(request_id, None)
        self.ending.clear()
        if idle:
            self.recent.clear()
            self.window.clear()
            self.busy_since = None
        if idle or now - self.published >= self.interval:
            latest = self.snapshot(engine, now)
            self.public = without_text(latest) if self.show_text else latest
            self.latest = latest
            # the next snapshot waits `interval` after this one ends: however long a
            # snapshot takes, the engine steps at least that long between two
            self.version, self.published = self.version + 1, time.perf_counter()

    def finished(self, output, stream) -> None:
        """A request left: its tokens go to its client's service (the loop's record
        names the client; outside a server, the engine named it at an earlier step)."""
        self.totals["finished"] += 1
        self.ending.append(output.request_id)
        client = (
            stream.client
            if stream is not None
            else self.client_of.get(output.request_id, "")
        )
        # its last step's tokens are counted after this
        self.client_of[output.request_id] = client
        served = self.served.setdefault(self.names.of(client), [0, 0])
        for i, tokens in enumerate(served_tokens(output, stream)):
            served[i] += tokens

    def _record(self, report, now: float) -> None:
        self.totals["steps"] += 1
        self.totals["preemptions"] += len(report.preempted)
        self.totals["guessed"] += sum(guessed for *_, guessed, _ in report.guesses)
        self.totals["kept"] += sum(kept for *_, kept in report.guesses)
        if self.busy_since is None:
            self.busy_since = now - report.seconds
        # each row of the batch sampled a token
        self.recent.append((now, len(report.ran)))
        while self.recent[0][0] < now - WINDOW:
            self.recent.popleft()
        ran = [
            [rid, index, kind, n, *self.styles.of(rid)]
            for rid, index, kind, n in report.ran
        ]
        self.timeline.append(
            {
                "step": report.step,
                "ms": round(1000 * report.seconds, 1),
                "ran": ran,
                "preempted": [rid for rid, _ in report.preempted],
                "padded": [rid for rid, _ in report.padded],
                # speculative decoding: per row, its guessed slots and how many were
                # kept
                "guesses": [
                    [rid, index, guessed, kept]
                    for rid, index, guessed, kept in report.guesses
                ],
            }
        )

    def _record_clients(self, engine, report, now: float) -> None:
        """The tokens each client's rows computed this step (prompt and output alike),
        kept WINDOW s."""
        tokens: dict[str, int] = {}
        for rid, _, _, n in report.ran:
            # a request that finished this step is gone: finished() named it
            request = engine.requests.get(rid)
            if request is not None:
                self.client_of[rid] = request.client
            name = self.names.of(self.client_of.get(rid, ""))
            tokens[name] = tokens.get(name, 0) + n
        self.window.append((now, tokens))
        while self.window[0][0] < now - WINDOW:
            self.window.popleft()

    def tokens_per_s(self, now: float) -> float:
        """Tokens sampled per second over the last WINDOW seconds of this busy spell; 0
        when idle."""
        if self.busy_since is None or not self.recent:
            return 0.0
        start = max(now - WINDOW, self.busy_since)
        return round(
            sum(n for t, n in self.recent if t >= start) / max(now - start, 1e-3), 1
        )

    # ---- one snapshot ----------------------------------------------------------------
    def snapshot(self, engine, now: float) -> dict:
        s, blocks = engine.scheduler, engine.blocks
        queues = {
            "running": list(s.running),
            "waiting": list(s.waiting),
            "swapped": list(s.swapped),
        }
        padding = list(
            dict.fromkeys(
                request for request, _ in s.padding if request not in s.running
            )
        )
        requests = [(r, status) for status, queue in queues.items() for r in queue] + [
            (r, "padding") for r in padding
        ]
        index_of = {
            seq.seq_id: i for i, (r, _) in enumerate(requests) for seq in r.seqs
        }
        frames: list = [None] * blocks.num_frames  # None: free
        for state in blocks.held_frame_states():  # the free ones stay None
            if state.owners:
                owners = sorted(
                    {index_of[seq_id] for seq_id in state.owners if seq_id in index_of}
                )
                # [ref count, requests that map it]
                frames[state.frame] = [
                    len(state.owners),
                    *owners,
                ]
            elif state.cached:
                # a cached prefix block nobody maps: free, but findable again
                frames[state.frame] = "c"
        queries, hits = blocks.prefix_cache_queries, blocks.prefix_cache_hits
        return {
            "model": self.model_name,
            "time": time.time(),
            "step": self.totals["steps"],
            "block_size": blocks.block_size,
            "num_frames": blocks.num_frames,
            "free_frames": blocks.num_free_frames,
            "frames": frames,
            "palette": [[colour, ink(colour)] for colour in PALETTE],
            "requests": [self._request(r, status, blocks) for r, status in requests],
            "queues": {
                name: [r.request_id for r in queue] for name, queue in queues.items()
            },
            "timeline": list(self.timeline),
            "clients": self._clients(engine, queues, now),
            "counters": {
                "tokens_per_s": self.tokens_per_s(now),
                "window_s": WINDOW,
                "kv_usage": round(1 - blocks.num_free_frames / blocks.num_frames, 4),
                "preemptions": self.totals["preemptions"],
                "finished": self.totals["finished"],
                "prefix_cache_queries": queries,
                "prefix_cache_hits": hits,
                "prefix_hit_rate": round(hits / queries, 4) if queries else 0.0,
                "guessed": self.totals["guessed"],
                "guesses_kept": self.totals["kept"],
            },
        }

    def _clients(self, engine, queues: dict, now: float) -> list[dict]:
        """Each client's service, in arrival order: prompt and output tokens served
        (requests that left, and what the live ones were served so far), its requests
        running and waiting (swapped ones wait too), its share of the tokens computed
        over the last WINDOW s, and the waiting order's counter of it if the order keeps
        one (fair queuing's `service()`), else None.
        """
        rows: dict[str, dict] = {}

        def row(name: str) -> dict:
            prompt, output = self.served.get(name, (0, 0))
            return rows.setdefault(
                name,
                {
                    "name": name,
                    "prompt_tokens": prompt,
                    "output_tokens": output,
                    "running": 0,
                    "waiting": 0,
                    "recent_tokens": 0,
                    "share": 0.0,
                    "counter": None,
                },
            )

        for name in self.served:
            row(name)
        for status, queue in queues.items():
            for request in queue:
                view = row(self.names.of(request.client))
                view["running" if status == "running" else "waiting"] += 1
                # it ran: served so far
                if status != "waiting" or request.request_id in self.styles.live:
                    view["prompt_tokens"] += len(request.prompt_token_ids)
                    view["output_tokens"] += sum(
                        len(seq.output_ids) for seq in request.seqs
                    )
        recent = [
            (name, n)
            for t, tokens in self.window
            if t >= now - WINDOW
            for name, n in tokens.items()
        ]
        total = sum(n for _, n in recent)
        for name, n in recent:
            row(name)["recent_tokens"] += n
        for view in rows.values():
            view["share"] = round(view["recent_tokens"] / total, 4) if total else 0.0
        # fair queuing's counters, if the order keeps them
        service = getattr(engine.scheduler.order, "service", None)
        for client, value in (service() if callable(service) else {}).items():
            name = self.names.of(client)
            if name != OTHER:  # OTHER folds many clients: no one counter
                row(name)["counter"] = round(value, 1)
        return sorted(rows.values(), key=lambda view: self.names.rank(view["name"]))

    def _request(self, request, status: str, blocks) -> dict:
        seqs = []
        for seq in request.seqs:
            on_device = blocks.has(seq.seq_id) and not blocks.is_swapped(seq.seq_id)
            seq_view = {
                "index": seq.index,
                "tokens": len(seq.token_ids),
                "finished": seq.finished,
                "blocks": blocks.block_table(seq.seq_id) if on_device else None,
            }
            if self.show_text:
                seq_view["text"] = seq.released_text
            seqs.append(seq_view)
        # waiting: coloured if preempted (admitted before); padding: finished, grey
        rid = request.request_id
        admitted = status in ("running", "swapped") or rid in self.styles.live
        colour, label = (
            self.styles.of(rid) if admitted else (None, self.styles.letter(rid))
        )
        view = {
            "id": rid,
            "status": status,
            "colour": colour,
            "label": label,
            "prompt_tokens": len(request.prompt_token_ids),
            "output_tokens": sum(len(seq.output_ids) for seq in request.seqs),
            "seqs": seqs,
        }
        if self.show_text:
            view["prompt"] = request.prompt
        return view


def without_text(snapshot: dict) -> dict:
    """A snapshot with its prompts and answers left out: ids, token counts and frames
    only."""
    requests = [
        {k: v for k, v in r.items() if k != "prompt"}
        | {"seqs": [{k: v for k, v in seq.items() if k != "text"} for seq in r["seqs"]]}
        for r in snapshot["requests"]
    ]
    return snapshot | {"requests": requests}
