"""Prometheus metrics under vLLM's names, each series served twice: as
`minipaged:num_requests_running` (the name this series has always used) and as vLLM's
own `vllm:num_requests_running`, so that dashboards and alerts built for `vllm serve`
read a minipaged server unchanged. A watcher of the engine loop, told of every step and
every finished request.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.metrics_core import Metric

from minipaged.tools.serve.clients import OTHER, ClientNames, served_tokens

# vLLM's buckets (vllm/v1/metrics/loggers.py), so the histograms line up with its
# dashboards
TTFT_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
]
E2E_BUCKETS = [
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
]  # also each phase of a request
ITL_BUCKETS = [
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
]
TOKEN_BUCKETS = [
    1,
    8,
    16,
    32,
    64,
    128,
    256,
    512,
    1024,
    2048,
    4096,
    8192,
    16384,
]  # tokens per step
N_BUCKETS = [1, 2, 5, 10, 20]
# a request's finish reasons (outputs.py), each a series from the start: a router
# that sums every replica's metrics (sglang-router's /engine_metrics) reads a cold
# replica too
FINISH_REASONS = ("stop", "length", "abort", "rejected")


@dataclass(frozen=True, slots=True)
class Load:
    """What the engine held at its last step, for the routers' load probes (workers.py):
    requests running and waiting, the tokens its frames in use can hold, and when the
    last step ended (time.monotonic(); None before the first)."""

    running: int = 0
    waiting: int = 0
    tokens: int = 0
    stepped_at: float | None = None


def buckets_1_2_5(largest: int) -> list[int]:
    """vLLM's buckets for token counts of a request: 1, 2, 5, 10, 20, 50, ... up to
    largest."""
    buckets, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > largest:
                return buckets
            buckets.append(mantissa * scale)
        scale *= 10


class VLLMNames:
    """A collector that serves every `minipaged:` family of `registry` again as `vllm:`,
    with vLLM's `engine` label ("0": a server has one engine): one series, two names,
    never two counts.
    """

    def __init__(self, registry: CollectorRegistry):
        self.registry = registry

    def collect(self):
        for family in self.registry.collect():
            twin = Metric(
                family.name.replace("minipaged:", "vllm:", 1),
                family.documentation,
                family.type,
            )
            twin.samples = [
                s._replace(
                    name=s.name.replace("minipaged:", "vllm:", 1),
                    labels=s.labels | {"engine": "0"},
                )
                for s in family.samples
            ]
            yield twin


class Metrics:
    """The registry of one server (tests run several in one process: no global
    registry). It is told of every step and every finished request on the engine thread,
    and reads the engine there; /metrics only renders the registry, under both names."""

    def __init__(
        self,
        model_name: str,
        max_model_len: int = 8192,
        cache_config: dict | None = None,
    ):
        self.registry = registry = CollectorRegistry()
        label = {"labelnames": ["model_name"], "registry": registry}

        def metric(kind, name, doc, **options):
            return kind(f"minipaged:{name}", doc, **label, **options).labels(model_name)

        self.running = metric(
            Gauge,
            "num_requests_running",
            "Requests with frames on the device (in the batch).",
        )
        self.waiting = metric(
            Gauge, "num_requests_waiting", "Requests waiting to be admitted."
        )
        self.swapped = metric(
            Gauge, "num_requests_swapped", "Requests preempted by swap, in host memory."
        )
        self.kv_usage = metric(
            Gauge,
            "kv_cache_usage_perc",
            "Fraction of KV frames in use, 1 = all (cached frames nobody maps are"
            " free).",
        )
        self.queries = metric(
            Counter,
            "prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache when a sequence is admitted.",
        )
        self.hits = metric(
            Counter, "prefix_cache_hits", "Of those, tokens found in the prefix cache."
        )
        # vLLM's older (V0) names of the same three series, which the vLLM
        # production-stack router still scrapes
        self.v0_queries = metric(
            Counter,
            "gpu_prefix_cache_queries",
            "The same as prefix_cache_queries (vLLM's older name).",
        )
        self.v0_hits = metric(
            Counter,
            "gpu_prefix_cache_hits",
            "The same as prefix_cache_hits (vLLM's older name).",
        )
        self.v0_usage = metric(
            Gauge,
            "gpu_cache_usage_perc",
            "The same as kv_cache_usage_perc (vLLM's older name).",
        )
        # the block manager's counters, as far as counted
        self.counted = {
            "queries": 0,
            "hits": 0,
        }
        self.preemptions = metric(
            Counter, "num_preemptions", "Preemptions (recompute or swap)."
        )
        self.prompt_tokens = metric(
            Counter, "prompt_tokens", "Prompt tokens of finished requests."
        )
        self.generation_tokens = metric(
            Counter, "generation_tokens", "Tokens generated by finished requests."
        )
        self.success = Counter(
            "minipaged:request_success",
            "Finished requests, by finish reason (abort: the client hung up).",
            ["model_name", "finished_reason"],
            registry=registry,
        )
        for reason in FINISH_REASONS:
            self.success.labels(model_name, reason)
        # vLLM's speculative-decoding counters (v1 names): rows that guessed, guesses,
        # guesses kept
        self.drafts = metric(
            Counter,
            "spec_decode_num_drafts",
            "Rows of a step that checked guessed tokens.",
        )
        self.draft_tokens = metric(
            Counter,
            "spec_decode_num_draft_tokens",
            "Guessed tokens checked by the model.",
        )
        self.accepted_tokens = metric(
            Counter,
            "spec_decode_num_accepted_tokens",
            "Guessed tokens the model agreed with and kept.",
        )
        # each client's service (clients named as on the dashboard: never by key; 64
        # apart, then "other")
        self.client_tokens = Counter(
            "minipaged:client_tokens",
            "Tokens served to each client by its requests that "
            "left: kind=prompt (once per request that ran) or output.",
            ["model_name", "client", "kind"],
            registry=registry,
        )
        for kind in ("prompt", "output"):  # a series from the start (FINISH_REASONS)
            self.client_tokens.labels(model_name, OTHER, kind)
        self.names = ClientNames()
        self.model_name = model_name
        # replaced (never changed) at each step: read from any thread
        self.load = Load()
        self.iteration_tokens = metric(
            Histogram,
            "iteration_tokens_total",
            "Tokens computed per engine step.",
            buckets=TOKEN_BUCKETS,
        )
        # per finished request: its sizes, and its times (vLLM's phases: waiting,
        # prefill, decode)
        sizes = buckets_1_2_5(max_model_len)
        self.request_prompt_tokens = metric(
            Histogram,
            "request_prompt_tokens",
            "Prompt tokens of a request.",
            buckets=sizes,
        )
        self.request_generation_tokens = metric(
            Histogram,
            "request_generation_tokens",
            "Tokens a request generated (all its n samples).",
            buckets=sizes,
        )
        self.params_n = metric(
            Histogram, "request_params_n", "The n of a request.", buckets=N_BUCKETS
        )
        self.params_max_tokens = metric(
            Histogram,
            "request_params_max_tokens",
            "The max_tokens of a request.",
            buckets=sizes,
        )
        self.ttft = metric(
            Histogram,
            "time_to_first_token_seconds",
            "Time to first token.",
            buckets=TTFT_BUCKETS,
        )
        self.itl = metric(
            Histogram,
            "inter_token_latency_seconds",
            "Seconds between a request's steps after its first (each brings its next"
            " tokens).",
            buckets=ITL_BUCKETS,
        )
        self.tpot = metric(
            Histogram,
            "time_per_output_token_seconds",
            "The same as inter_token_latency_seconds (vLLM's older name).",
            buckets=ITL_BUCKETS,
        )
        self.request_tpot = metric(
            Histogram,
            "request_time_per_output_token_seconds",
            "A request's decode time per token after its first.",
            buckets=ITL_BUCKETS,
        )
        self.e2e = metric(
            Histogram,
            "e2e_request_latency_seconds",
            "End-to-end request latency.",
            buckets=E2E_BUCKETS,
        )
        self.queue_time = metric(
            Histogram,
            "request_queue_time_seconds",
            "Seconds from arrival to its first step.",
            buckets=E2E_BUCKETS,
        )
        self.prefill_time = metric(
            Histogram,
            "request_prefill_time_seconds",
            "Seconds of its first step (the prefill, and its first token).",
            buckets=E2E_BUCKETS,
        )
        self.decode_time = metric(
            Histogram,
            "request_decode_time_seconds",
            "Seconds from its first token to its last.",
            buckets=E2E_BUCKETS,
        )
        self.inference_time = metric(
            Histogram,
            "request_inference_time_seconds",
            "Seconds from its first step to its last.",
            buckets=E2E_BUCKETS,
        )
        if cache_config:  # vLLM's info series: a gauge at 1, the settings in its labels
            Gauge(
                "minipaged:cache_config_info",
                "The KV cache's settings.",
                list(cache_config),
                registry=registry,
            ).labels(**{k: str(v) for k, v in cache_config.items()}).set(1)
        self.vllm = CollectorRegistry()
        self.vllm.register(VLLMNames(registry))

    def render(self) -> bytes:
        return generate_latest(self.registry) + generate_latest(self.vllm)

    # ---- the engine loop's watcher interface (engine thread) -------------------------
    def stepped(self, engine, report, idle: bool) -> None:
        if report is not None:
            self.preemptions.inc(len(report.preempted))
            self.iteration_tokens.observe(report.num_tokens)
            self.drafts.inc(len(report.guesses))
            self.draft_tokens.inc(sum(guessed for *_, guessed, _ in report.guesses))
            self.accepted_tokens.inc(sum(kept for *_, kept in report.guesses))
        s, blocks = engine.scheduler, engine.blocks
        self.running.set(len(s.running))
        self.waiting.set(len(s.waiting))
        self.swapped.set(len(s.swapped))
        used = blocks.num_frames - blocks.num_free_frames
        self.kv_usage.set(used / blocks.num_frames)
        self.v0_usage.set(used / blocks.num_frames)
        self._count(
            (self.queries, self.v0_queries), "queries", blocks.prefix_cache_queries
        )
        self._count((self.hits, self.v0_hits), "hits", blocks.prefix_cache_hits)
        stepped_at = self.load.stepped_at
        if report is not None:
            stepped_at = time.monotonic()
        self.load = Load(
            len(s.running), len(s.waiting), used * blocks.block_size, stepped_at
        )

    def _count(self, counters, name: str, total: int) -> None:
        """Add what the block manager counted since the last step (it counts at
        admission) to each of its counters (its names)."""
        for counter in counters:
            counter.inc(max(total - self.counted[name], 0))
        self.counted[name] = total

    def finished(self, output, stream) -> None:
        """A request left the engine (finished or aborted): its counts, and its times
        from the loop's record of it (loop.Stream)."""
        now = time.perf_counter()
        prompt, generated = (
            len(output.prompt_token_ids),
            sum(len(c.token_ids) for c in output.outputs),
        )
        self.prompt_tokens.inc(prompt)
        self.generation_tokens.inc(generated)
        reason = output.outputs[0].finish_reason if output.outputs else "abort"
        self.success.labels(self.model_name, reason).inc()
        self.request_prompt_tokens.observe(prompt)
        self.request_generation_tokens.observe(generated)
        for kind, tokens in zip(("prompt", "output"), served_tokens(output, stream)):
            self.client_tokens.labels(
                self.model_name, self.names.of(stream.client), kind
            ).inc(tokens)
        if stream.params is not None:
            self.params_n.observe(stream.params.n)
            self.params_max_tokens.observe(stream.params.max_tokens)
        if stream.first_token is not None:  # it ran: its phases
            self.ttft.observe(stream.first_token - stream.arrival)
            self.queue_time.observe(stream.scheduled - stream.arrival)
            self.prefill_time.observe(stream.first_token - stream.scheduled)
            self.decode_time.observe(stream.last_token - stream.first_token)
            self.inference_time.observe(stream.last_token - stream.scheduled)
            for gap in stream.gaps:
                self.itl.observe(gap)
                self.tpot.observe(gap)
            longest = max((len(c.token_ids) for c in output.outputs), default=0)
            if longest > 1:
                self.request_tpot.observe(
                    (stream.last_token - stream.first_token) / (longest - 1)
                )
        self.e2e.observe(now - stream.arrival)
