"""The engine loop: one thread owns the LLMEngine; HTTP handlers talk to it through
queues.

vLLM's AsyncLLMEngine idea, small: requests and aborts go in through one thread-safe
queue, each request's new text comes out through its own asyncio queue
(docs/06_serving.md tells the rest).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from minipaged.outputs import CompletionOutput, RequestOutput, StepReport
from minipaged.policies import PolicyError

LOG = logging.getLogger("minipaged.serve")
# a step that runs longer is reported by /health (503) and the log: a CPU step of a
# full batch takes seconds, so a minute means something is stuck (a policy that never
# returns, most likely)
WATCHDOG_SECONDS = 60.0


@dataclass(slots=True)
class Update:
    """What a request's handler receives: first an empty update (accepted) or the
    engine's reason for refusing it; then what each sequence added (its text, its
    tokens) and each sequence that finished, as it finishes (n > 1: one may end before
    its siblings); at the end its output.
    """

    request_id: str
    # sequence index -> text released since the last update
    text: dict[int, str] = field(default_factory=dict)
    # sequence index -> tokens since the last one
    token_ids: dict[int, list[int]] = field(default_factory=dict)
    # sequence index -> those tokens' logprobs (if asked)
    logprobs: dict[int, list] = field(default_factory=dict)
    # sequences that finished since
    finished: dict[int, CompletionOutput] = field(default_factory=dict)
    output: RequestOutput | None = None  # the last update of a request that ran
    error: str | None = None  # add_request refused it (nothing was queued)


@dataclass(slots=True)
class Stream:
    """The engine thread's record of one request: where its updates go, what it was
    handed, and its times (perf_counter seconds), which the metrics read: arrival, the
    start of its first step (it waited until then), the end of its first step (its first
    token) and of each later one.
    """

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    arrival: float
    params: object = None  # its SamplingParams (n, max_tokens for the metrics)
    client: str = ""  # who sent it (Server._client): each client's service
    # sequence index -> characters handed out
    sent: dict[int, int] = field(default_factory=dict)
    # sequence index -> tokens handed out
    ids_sent: dict[int, int] = field(default_factory=dict)
    # sequences whose finish was handed out
    finished: set[int] = field(default_factory=set)
    scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    # seconds between its steps after the first
    gaps: list[float] = field(default_factory=list)
    # called on its event loop after the last update
    done: Callable[[], None] | None = None

    def ran(self, start: float, end: float) -> None:
        """It was in a step from start to end: the first one samples its first token."""
        if self.first_token is None:
            self.scheduled, self.first_token = start, end
        else:
            self.gaps.append(end - self.last_token)
        self.last_token = end


class EngineLoop:
    """Own `engine` on a thread of its own: it takes requests and aborts from `inbox`,
    steps while any request is unfinished and sleeps when none is; after each step it
    hands each request's new text to that request's own asyncio queue, on the HTTP
    server's event loop. Nothing else touches the engine, so it needs no lock.
    `watchers` see every step and every finished request on that thread (metrics,
    dashboard snapshots): `stepped(engine, report, idle)` and
    `finished(output, stream)`; they may read the engine, never change it."""

    def __init__(self, engine, watchers=(), watchdog_seconds=WATCHDOG_SECONDS):
        self.engine, self.watchers = engine, list(watchers)
        self.watchdog_seconds = watchdog_seconds
        self.step_started: float | None = None  # perf_counter() while a step runs
        self.stuck_logged = False
        # distinct policy failures logged so far (bounded: each is logged once)
        self.policy_failures: dict[str, int] = {}
        self.inbox: queue.Queue = queue.Queue()
        self.streams: dict[str, Stream] = {}  # touched by the engine thread only
        self.accepted = self.done = 0  # requests in and out: each written by one thread
        # aborts asked for, not yet done: they hold no place
        self.aborting: set[str] = set()
        # set if a step failed: the loop has stopped
        self.stop_reason: str | None = None
        self.thread = threading.Thread(
            target=self._run, name="minipaged-engine", daemon=True
        )

    # ---- called from the HTTP server's event loop ------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt,
        params,
        updates: asyncio.Queue,
        done=None,
        priority: int = 0,
        client: str = "",
    ) -> None:
        """Queue a request; its Updates arrive in `updates` (one queue may serve
        several), and `done()` runs once the engine has let go of it (finished, aborted
        or refused); `client` names who sent it (Server._client)."""
        self.accepted += 1
        self.inbox.put(
            (
                "add",
                request_id,
                prompt,
                params,
                Stream(
                    asyncio.get_running_loop(),
                    updates,
                    time.perf_counter(),
                    params,
                    client=client,
                    done=done,
                ),
                priority,
                client,
            )
        )

    def abort(self, request_id: str) -> None:
        """Stop a request (its client left, or a sibling prompt was refused): its frames
        are freed at the loop's next turn, and from now it no longer counts as
        unfinished.
        """
        self.aborting.add(request_id)
        self.inbox.put(("abort", request_id))

    def call(self, work: Callable) -> asyncio.Future:
        """Run `work(engine)` on the engine thread between two steps (never during
        one); the future, of the calling event loop, gets what it returns or raises."""
        future = asyncio.get_running_loop().create_future()
        self.inbox.put(("call", work, future))
        return future

    @property
    def num_unfinished(self) -> int:
        """Requests the engine holds or will: accepted, not done, and not being
        aborted."""
        return self.accepted - self.done - len(self.aborting)

    @property
    def error(self) -> str | None:
        """Why the server cannot serve now (/health answers 503 with it): the loop
        stopped, or a step has run past the watchdog's limit."""
        if self.stop_reason is not None:
            return self.stop_reason
        started = self.step_started
        if started is None:
            return None
        seconds = time.perf_counter() - started
        if seconds <= self.watchdog_seconds:
            return None
        message = (
            f"the engine's step has run for {seconds:.0f} s, past the watchdog's"
            f" {self.watchdog_seconds:g} s: a policy that never returns stalls it"
            f" ({self.policies()})"
        )
        if not self.stuck_logged:
            self.stuck_logged = True
            LOG.error(message)
        return message

    def policies(self) -> str:
        """The engine's seams and the policy on each, for messages."""
        config = self.engine.config
        names = (
            "scheduling_policy",
            "admission",
            "preemption_victim",
            "prefix_cache_policy",
        )
        return ", ".join(f"{name}={getattr(config, name, None)!r}" for name in names)

    def start(self) -> EngineLoop:
        self.thread.start()
        threading.Thread(
            target=self._watch, name="minipaged-watchdog", daemon=True
        ).start()
        return self

    def _watch(self) -> None:
        """Look at the step once a second, so that a stuck one is logged even when
        nobody asks /health."""
        while self.thread.is_alive():
            _ = self.error
            time.sleep(1.0)

    def stop(self) -> None:
        self.inbox.put(("stop",))
        self.thread.join(timeout=10)

    # ---- the engine thread -----------------------------------------------------------
    def _run(self) -> None:
        try:
            while self._take_inbox(block=not self.engine.has_unfinished_requests()):
                if self.engine.has_unfinished_requests():
                    self._step()
                else:
                    self._tell_watchers(None)
        except Exception as error:  # a bug in the engine: fail every request, loudly
            self.stop_reason = (
                f"the engine loop stopped: {type(error).__name__}: {error}"
            )
            for request_id in list(self.streams):
                self._send(request_id, Update(request_id, error=self.stop_reason))
            raise

    def _step(self) -> None:
        """One engine step, timed by the watchdog, and what it produced handed out. A
        policy that failed at its seam was stood in for by the seam's default: the
        step ran; the requests it cut short fail with its error, the rest carry on,
        and the failure is logged."""
        self.step_started = time.perf_counter()
        self.stuck_logged = False
        failure = None
        try:
            report = self.engine.step()
        except PolicyError as error:
            failure = error
            report = error.report
        finally:
            self.step_started = None
        if failure is not None:
            self._policy_failed(failure)
        self._after_step(report)

    def _policy_failed(self, error: PolicyError) -> None:
        message = str(error)
        if message not in self.policy_failures and len(self.policy_failures) < 100:
            LOG.error("a policy failed (its seam's default stood in): %s", message)
        count = self.policy_failures.get(message, 0)
        if count or len(self.policy_failures) < 100:
            self.policy_failures[message] = count + 1
        for request_id in error.request_ids:  # failed, finished this step or not
            if request_id in self.engine.requests:
                self.engine.abort_request(request_id)
            if request_id in self.streams:
                self._send(request_id, Update(request_id, error=message))

    def _take_inbox(self, block: bool) -> bool:
        """Handle every message waiting (when idle, sleep until one comes); False at
        stop."""
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
            elif message[0] == "call":
                self._call(*message[1:])
            elif message[1] in self.streams and message[1] in self.engine.requests:
                self._finish(self.engine.abort_request(message[1]))
            else:  # it had finished (or been refused) before the abort came
                self.aborting.discard(message[1])

    def _add(
        self,
        request_id: str,
        prompt,
        params,
        stream: Stream,
        priority: int,
        client: str = "",
    ) -> None:
        self.streams[request_id] = stream
        try:
            self.engine.add_request(request_id, prompt, params, priority, client)
        except ValueError as error:  # nothing was queued: tell the handler why
            self._send(request_id, Update(request_id, error=str(error)))
            return
        self._send(request_id, Update(request_id))  # accepted

    def _call(self, work: Callable, future: asyncio.Future) -> None:
        """Run a caller's work on the engine (loop.call) and hand back its outcome."""
        try:
            result, error = work(self.engine), None
        except Exception as failure:  # the caller's to report: the loop goes on
            result, error = None, failure

        def settle() -> None:
            if future.cancelled():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        try:
            future.get_loop().call_soon_threadsafe(settle)
        except RuntimeError:  # the caller's event loop is closed
            pass

    def _after_step(self, report: StepReport) -> None:
        """Hand out what the step produced: new text of running requests, finished
        outputs."""
        now = time.perf_counter()
        for request_id in dict.fromkeys(rid for rid, *_ in report.ran):
            if request_id not in self.streams:  # failed by its policy this step
                continue
            self.streams[request_id].ran(now - report.seconds, now)
            request = self.engine.requests.get(request_id)
            if request is not None and not request.beam_search:
                self._send_new(
                    request_id,
                    {
                        seq.index: (seq.released_text, seq.output_ids, seq.logprobs)
                        for seq in request.seqs
                    },
                    {
                        seq.index: seq.completion(request.params)
                        for seq in request.seqs
                        if seq.finished
                    },
                )
        for output in report.finished:
            if output.request_id in self.streams:
                self._finish(output)
        self._tell_watchers(report)

    def _finish(self, output: RequestOutput) -> None:
        self._send_new(
            output.request_id,
            {c.index: (c.text, c.token_ids, c.logprobs) for c in output.outputs},
            {c.index: c for c in output.outputs},
        )  # the last text with its end, as vLLM streams it
        stream = self.streams[output.request_id]
        for watcher in self.watchers:
            watcher.finished(output, stream)
        self._send(output.request_id, Update(output.request_id, output=output))

    def _send_new(
        self,
        request_id: str,
        seqs: dict[int, tuple[str, list[int], list | None]],
        finished: dict[int, CompletionOutput],
    ) -> None:
        """Hand out what each sequence (index -> its text, its tokens, their logprobs or
        None) added since the last update, and the sequences that finished since (each
        once).
        """
        stream = self.streams[request_id]
        text = {
            i: t[stream.sent.get(i, 0) :]
            for i, (t, *_) in seqs.items()
            if len(t) > stream.sent.get(i, 0)
        }
        ids = {
            i: t[stream.ids_sent.get(i, 0) :]
            for i, (_, t, _) in seqs.items()
            if len(t) > stream.ids_sent.get(i, 0)
        }
        logprobs = {
            i: seqs[i][2][stream.ids_sent.get(i, 0) : len(seqs[i][1])]
            for i in ids
            if seqs[i][2] is not None
        }
        finished = {i: c for i, c in finished.items() if i not in stream.finished}
        if text or ids or finished:
            stream.sent.update({i: len(seqs[i][0]) for i in text})
            stream.ids_sent.update({i: len(seqs[i][1]) for i in ids})
            stream.finished.update(finished)
            self._send(
                request_id,
                Update(
                    request_id,
                    text=text,
                    token_ids=ids,
                    logprobs=logprobs,
                    finished=finished,
                ),
            )

    def _send(self, request_id: str, update: Update) -> None:
        """Put an update on the request's queue, on its event loop; the last one forgets
        it."""
        stream = self.streams[request_id]
        last = update.output is not None or update.error is not None
        if last:
            del self.streams[request_id]
            self.done += 1
            self.aborting.discard(request_id)

        # one callback: the handler never sees the last update with its slot held
        def deliver() -> None:
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
