"""The engine loop: one thread owns the LLMEngine; HTTP handlers talk to it through queues.

vLLM's AsyncLLMEngine idea, small: requests and aborts go in through one thread-safe queue, each
request's new text comes out through its own asyncio queue (docs/06_serving.md tells the rest).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from minipaged.outputs import RequestOutput, StepReport


@dataclass(slots=True)
class Update:
    """What a request's handler receives: first an empty update (accepted) or the engine's reason
    for refusing it; then new text of each sequence; at the end its output (finish_reason)."""
    request_id: str
    text: dict[int, str] = field(default_factory=dict)  # sequence index -> text released since the last update
    output: RequestOutput | None = None                 # the last update of a request that ran
    error: str | None = None                            # add_request refused it (nothing was queued)


@dataclass(slots=True)
class Stream:
    """The engine thread's record of one request: where its updates go, and its times."""
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    arrival: float
    sent: dict[int, int] = field(default_factory=dict)  # sequence index -> characters handed out
    first_token: float | None = None
    done: Callable[[], None] | None = None              # called on its event loop after the last update


class EngineLoop:
    """Own `engine` on a thread of its own: it takes requests and aborts from `inbox`, steps while
    any request is unfinished and sleeps when none is; after each step it hands each request's
    new text to that request's own asyncio queue, on the HTTP server's event loop. Nothing else
    touches the engine, so it needs no lock. `watchers` see every step and every finished request
    on that thread (metrics, dashboard snapshots): `stepped(engine, report, idle)` and
    `finished(output, stream)`; they may read the engine, never change it."""

    def __init__(self, engine, watchers=()):
        self.engine, self.watchers = engine, list(watchers)
        self.inbox: queue.Queue = queue.Queue()
        self.streams: dict[str, Stream] = {}  # touched by the engine thread only
        self.accepted = self.done = 0         # requests in and out: each written by one thread
        self.aborting: set[str] = set()       # aborts asked for, not yet done: they hold no place
        self.error: str | None = None         # set if a step failed: the loop has stopped
        self.thread = threading.Thread(target=self._run, name="minipaged-engine", daemon=True)

    # ---- called from the HTTP server's event loop -----------------------------------------
    def add_request(self, request_id: str, prompt, params, updates: asyncio.Queue, done=None,
                    priority: int = 0) -> None:
        """Queue a request; its Updates arrive in `updates` (one queue may serve several), and
        `done()` runs once the engine has let go of it (finished, aborted or refused)."""
        self.accepted += 1
        self.inbox.put(("add", request_id, prompt, params,
                        Stream(asyncio.get_running_loop(), updates, time.perf_counter(), done=done), priority))

    def abort(self, request_id: str) -> None:
        """Stop a request (its client left, or a sibling prompt was refused): its frames are
        freed at the loop's next turn, and from now it no longer counts as unfinished."""
        self.aborting.add(request_id)
        self.inbox.put(("abort", request_id))

    @property
    def num_unfinished(self) -> int:
        """Requests the engine holds or will: accepted, not done, and not being aborted."""
        return self.accepted - self.done - len(self.aborting)

    def start(self) -> EngineLoop:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.inbox.put(("stop",))
        self.thread.join(timeout=10)

    # ---- the engine thread ------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while self._take_inbox(block=not self.engine.has_unfinished_requests()):
                if self.engine.has_unfinished_requests():
                    self._after_step(self.engine.step())
                else:
                    self._tell_watchers(None)
        except Exception as error:  # a bug in the engine: fail every request, loudly
            self.error = f"the engine loop stopped: {type(error).__name__}: {error}"
            for request_id in list(self.streams):
                self._send(request_id, Update(request_id, error=self.error))
            raise

    def _take_inbox(self, block: bool) -> bool:
        """Handle every message waiting (when idle, sleep until one comes); False at stop."""
        while True:
            try:
                message = self.inbox.get(block=block)
            except queue.Empty:
                return True
            block = False
            if message[0] == "stop":
                return False
            if message[0] == "add":
                self._add(*message[1:])
            elif message[1] in self.streams and message[1] in self.engine.requests:
                self._finish(self.engine.abort_request(message[1]))
            else:  # it had finished (or been refused) before the abort came
                self.aborting.discard(message[1])

    def _add(self, request_id: str, prompt, params, stream: Stream, priority: int) -> None:
        self.streams[request_id] = stream
        try:
            self.engine.add_request(request_id, prompt, params, priority)
        except ValueError as error:  # nothing was queued: tell the handler why
            self._send(request_id, Update(request_id, error=str(error)))
            return
        self._send(request_id, Update(request_id))  # accepted

    def _after_step(self, report: StepReport) -> None:
        """Hand out what the step produced: new text of running requests, finished outputs."""
        now = time.perf_counter()
        for request_id in dict.fromkeys(rid for rid, *_ in report.ran):
            stream = self.streams[request_id]
            stream.first_token = stream.first_token or now  # a request's first step samples a token
            request = self.engine.requests.get(request_id)
            if request is not None and not request.beam_search:
                texts = {seq.index: seq.released_text for seq in request.seqs}
                self._send_text(request_id, texts)
        for output in report.finished:
            self._finish(output)
        self._tell_watchers(report)

    def _finish(self, output: RequestOutput) -> None:
        self._send_text(output.request_id, {c.index: c.text for c in output.outputs})
        stream = self.streams[output.request_id]
        for watcher in self.watchers:
            watcher.finished(output, stream)
        self._send(output.request_id, Update(output.request_id, output=output))

    def _send_text(self, request_id: str, texts: dict[int, str]) -> None:
        sent = self.streams[request_id].sent
        new = {i: text[sent.get(i, 0):] for i, text in texts.items() if len(text) > sent.get(i, 0)}
        if new:
            sent.update({i: len(texts[i]) for i in new})
            self._send(request_id, Update(request_id, text=new))

    def _send(self, request_id: str, update: Update) -> None:
        """Put an update on the request's queue, on its event loop; the last one forgets it."""
        stream = self.streams[request_id]
        last = update.output is not None or update.error is not None
        if last:
            del self.streams[request_id]
            self.done += 1
            self.aborting.discard(request_id)
        def deliver() -> None:  # one callback: the handler never sees the last update with its slot held
            stream.queue.put_nowait(update)
            if last and stream.done is not None:
                stream.done()

        try:
            stream.loop.call_soon_threadsafe(deliver)
        except RuntimeError:  # the server's event loop is closed: nobody is listening
            pass

    def _tell_watchers(self, report: StepReport | None) -> None:
        idle = not self.engine.has_unfinished_requests()
        for watcher in self.watchers:
            watcher.stepped(self.engine, report, idle)
