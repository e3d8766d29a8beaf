"""The simulator behind `python -m minipaged.simulate`: the real Scheduler and
allocators on a virtual clock.

No model runs: the scheduler picks its batches over real block managers exactly as in
the engine, and a step-time model (a Profile, see PROFILES_HELP) says how long each
would take.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from minipaged.backend import cdiv
from minipaged.paging import make_block_manager
from minipaged.sampling import SamplingParams
from minipaged.scheduler import Batch, Scheduler, SchedulerConfig
from minipaged.sequence import Request, Sequence
from minipaged.tools.bench.workload import RequestSpec, make_workload

SYSTEMS = {  # name -> (allocator, batching policy): the paper's Figure 12 systems
    "paged": ("paged", "continuous"),
    "contiguous-oracle": ("contiguous-oracle", "continuous"),
    "contiguous-pow2": ("contiguous-pow2", "continuous"),
    "contiguous-max": ("contiguous-max", "continuous"),
    "static": ("paged", "static"),
}
# tokens; the vLLM paper's Alpaca figures
ALPACA_PROMPT_MEAN, ALPACA_OUTPUT_MEAN = (
    19.31,
    58.45,
)


@dataclass(frozen=True)
class Profile:
    """How long one step takes, and how much KV memory there is."""

    name: str
    fixed: float  # seconds per step, whatever it holds (reading the weights, overheads)
    per_token: float  # seconds per token computed (weights x token: matmuls)
    per_context: float  # seconds per cached token attended (reading its K and V)
    kv_slots: int  # token slots in the KV cache
    max_model_len: int
    max_num_seqs: int = 256
    # seconds per KV frame attended (one more block-table hop, a part-used read)
    per_frame: float = 0.0
    # seconds of overhead per frame moved to or from host memory (its copies)
    swap_per_frame: float = 0.0
    # seconds per token slot moved to or from host memory (its bytes)
    swap_per_slot: float = 0.0
    # a step takes max(memory, compute) (a GPU overlaps them), else their sum
    roofline: bool = False

    def step_time(self, num_tokens: int, context_tokens: int, frames: int = 0) -> float:
        memory = (
            self.fixed + self.per_context * context_tokens + self.per_frame * frames
        )
        compute = self.per_token * num_tokens
        return max(memory, compute) if self.roofline else memory + compute

    def swap_time(self, frames: int, block_size: int) -> float:
        return frames * (self.swap_per_frame + block_size * self.swap_per_slot)


def _opt13b_a100() -> Profile:
    bandwidth, kv_token, weights = (
        1.555e12,
        2 * 40 * 5120 * 2,
        2 * 13e9,
    )  # B/s, bytes/token, bytes
    # fp16 tensor cores at half their peak: prefill tokens are compute-bound
    flops = 312e12 * 0.5
    # B/s host <-> device, and seconds per copy (2 x 40 per frame)
    pcie, copy_overhead = (
        25e9,
        2e-6,
    )
    return Profile(
        "opt-13b-a100",
        fixed=weights / bandwidth,
        per_token=2 * 13e9 / flops,
        per_context=kv_token / bandwidth,
        kv_slots=int(12e9) // kv_token,
        max_model_len=2048,
        per_frame=0.2 * 16 * kv_token / bandwidth,
        swap_per_frame=2 * 40 * copy_overhead,
        swap_per_slot=kv_token / pcie,
        roofline=True,
    )


PROFILES = {
    # fitted by `python -m minipaged.bench calibrate` (84 timed steps of SmolLM2-135M,
    # fp32, NumPy, on the shared 2-core CPU of 2026-11-30; relative error of a step p50
    # 8%, p90 22%)
    "cpu-smollm2": Profile(
        "cpu-smollm2",
        fixed=0.01979,
        per_token=0.002332,
        per_context=2.8419e-5,
        kv_slots=4096,
        max_model_len=2048,
        max_num_seqs=64,
    ),
    "opt-13b-a100": _opt13b_a100(),
}
PROFILES_HELP = """\
profiles:
- `cpu-smollm2`: fitted to timed minipaged steps on a 2-core CPU \
(`python -m minipaged.bench
  calibrate`): step time = fixed + per_token x new tokens \
+ per_context x tokens attended. A CPU
  does one thing at a time, so the three costs add up.
- `opt-13b-a100`: a roofline *model*, not a measurement. \
A step takes the longer of its memory
  time and its compute time, as a GPU overlaps the two:
  - memory: OPT-13B's 26 GB of fp16 weights, plus 800 KB of K and V per context token, \
read at
    A100-40GB bandwidth (1.555 TB/s), plus a small cost per KV frame attended \
(20% of a 16-token
    frame's read time: the paper measured its paged kernel 20-26% \
slower than FasterTransformer's
    at block size 16, Figure 18a), so small blocks cost more;
  - compute: 2 x 13e9 FLOPs per new token at half the fp16 tensor-core peak \
(156 TFLOP/s).
  The KV cache holds what the paper left for it (about 12 GB: 15,000 tokens). \
A swapped frame
  crosses PCIe at 25 GB/s, plus 2 µs for each of its 2 x 40 copies \
(K and V of every layer).
"""


@dataclass(slots=True)
class Arrival:
    time: float
    spec: RequestSpec


def poisson_trace(
    specs: list[RequestSpec], rate: float, seed: int = 0
) -> list[Arrival]:
    """Requests arriving as a Poisson process of `rate` per second."""
    # (num_requests,)
    gaps = np.random.default_rng(seed).exponential(1 / rate, len(specs))
    return [Arrival(float(t), s) for t, s in zip(np.cumsum(gaps), specs)]


def trace_specs(
    name: str, num_requests: int, max_len: int = 1000, seed: int = 0
) -> list[RequestSpec]:
    if name == "alpaca":
        return make_workload(
            num_requests, 1, max_len, ALPACA_PROMPT_MEAN, ALPACA_OUTPUT_MEAN, seed
        )
    return make_workload(num_requests, max_len=max_len, seed=seed)


@dataclass(slots=True)
class Result:
    system: str
    # end-to-end, seconds, per request
    latencies: list[float] = field(default_factory=list)
    output_lens: list[int] = field(default_factory=list)
    steps: int = 0
    clock: float = 0.0
    memory: dict = field(
        default_factory=lambda: dict.fromkeys(
            ("token_states", "reserved", "internal", "external"), 0.0
        )
    )
    # steps with a request waiting (where the memory shares are measured)
    loaded_steps: int = 0
    refusals: int = 0
    preemptions: int = 0
    swapped_frames: int = 0  # frames moved out and in
    # per request, in the order of latencies
    prompt_lens: list[int] = field(default_factory=list)
    # seconds from arrival to its first prefill step
    waits: list[float] = field(default_factory=list)
    # prefill tokens of requests preempted by recompute, computed again
    recomputed_tokens: int = 0

    @property
    def normalized_latency(self) -> float:
        """Mean over requests of end-to-end latency / output length (s/token), the
        paper's metric."""
        return float(np.mean(np.array(self.latencies) / np.array(self.output_lens)))

    def shares(self) -> dict:
        n = max(self.loaded_steps, 1)
        return {k: v / n for k, v in self.memory.items()} | {"refusals": self.refusals}


class Simulator:
    """One system serving one trace on a virtual clock."""

    def __init__(
        self,
        profile: Profile,
        system: str,
        block_size: int = 16,
        chunked_prefill: bool = False,
        max_num_batched_tokens: int = 0,
        preemption_mode: str = "recompute",
        measure_memory=False,
        scheduler_options: dict | None = None,
    ):
        allocator, policy = SYSTEMS[system]
        self.profile, self.measure_memory = profile, measure_memory
        # one region per sequence: no per-frame hops
        self.contiguous = allocator.startswith("contiguous")
        num_blocks = profile.kv_slots // block_size
        self.blocks = make_block_manager(
            allocator,
            policy,
            num_blocks,
            block_size,
            profile.max_model_len,
            host_frames=num_blocks,
        )
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_num_seqs=profile.max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens,
                preemption_mode=preemption_mode,
                max_model_len=profile.max_model_len,
                batching=policy,
                chunked_prefill=chunked_prefill,
                **(scheduler_options or {}),
            ),
            self.blocks,
        )
        self.result = Result(system)
        self.params: dict[int, SamplingParams] = {}
        self.arrivals: dict[Request, float] = {}
        # request -> clock at its first prefill step
        self.started: dict[Request, float] = {}
        self.next_id = 0

    def run(self, trace: list[Arrival]) -> Result:
        clock, i = 0.0, 0
        while i < len(trace) or self.scheduler.has_unfinished():
            while i < len(trace) and trace[i].time <= clock:
                self.add(trace[i])
                i += 1
            if not self.scheduler.has_unfinished():
                clock = trace[i].time
                continue
            clock += self.step(clock)
        self.result.clock = clock
        self.result.refusals = getattr(self.blocks, "refusals", 0)
        return self.result

    def add(self, arrival: Arrival) -> None:
        spec = arrival.spec
        prompt_len = min(spec.prompt_len, self.profile.max_model_len - 1)
        output_len = min(spec.output_len, self.profile.max_model_len - prompt_len)
        if output_len not in self.params:
            self.params[output_len] = SamplingParams(
                max_tokens=output_len, ignore_eos=True
            )
        prompt = [self.next_id % 30000 + 1] * prompt_len
        request = Request(
            str(self.next_id),
            None,
            prompt,
            self.params[output_len],
            [Sequence(self.next_id, list(prompt), prompt_len)],
        )
        self.next_id += 1
        self.arrivals[request] = arrival.time
        self.scheduler.add(request)

    def step(self, clock: float) -> float:
        """One scheduler step: its duration by the profile; finished requests get their
        latency."""
        batch = self.scheduler.schedule()
        if self.measure_memory:
            self._measure()
        seconds = self.profile.step_time(
            batch.num_tokens + len(batch.padding), *self._context(batch)
        )
        # frames of block_size slots
        swapped = len(batch.moves.swap_out) + len(batch.moves.swap_in)
        seconds += self.profile.swap_time(swapped, self.blocks.block_size)
        self.result.steps += 1
        self.result.preemptions += len(batch.preempted)
        self.result.swapped_frames += swapped
        for s in batch.scheduled:
            # it had sampled before: a recompute
            if s.kind == "prefill" and s.seq.output_ids:
                self.result.recomputed_tokens += s.num_new_tokens
            self.started.setdefault(s.request, clock)
        # a dummy token each
        tokens = {seq: 0 for s in batch.scheduled for seq in s.samplers}
        for request in self.scheduler.update(batch, tokens):
            self.result.latencies.append(clock + seconds - self.arrivals[request])
            self.result.waits.append(
                self.started.pop(request) - self.arrivals.pop(request)
            )
            self.result.output_lens.append(request.params.max_tokens)
            self.result.prompt_lens.append(len(request.prompt_token_ids))
        return seconds

    def _context(self, batch: Batch) -> tuple[int, int]:
        """Tokens attended by the step's rows, and the KV frames they are read from."""
        lengths = [s.seq.num_computed + s.num_new_tokens for s in batch.scheduled] + [
            seq.num_computed for _, seq in batch.padding
        ]
        frames = (
            len(lengths)
            if self.contiguous
            else sum(cdiv(n, self.blocks.block_size) for n in lengths)
        )
        return sum(lengths), frames

    def _measure(self) -> None:
        """Where the KV slots are, at a step where a request waits for memory."""
        if not self.scheduler.waiting:
            return
        usage, m = self.blocks.usage(), self.result.memory
        total = usage.total_slots
        m["token_states"] += usage.token_slots / total
        m["reserved"] += usage.reserved_unused / total
        m["internal"] += usage.internal_waste / total
        m["external"] += (total - usage.allocated_slots) / total
        self.result.loaded_steps += 1


def simulate(
    profile: str | Profile, system: str, trace: list[Arrival], **options
) -> Result:
    profile = PROFILES[profile] if isinstance(profile, str) else profile
    return Simulator(profile, system, **options).run(trace)


def fragmentation(
    num_requests: int = 1000,
    block_size: int = 16,
    seed: int = 0,
    desc: str | None = None,
) -> dict:
    """The paper's Figure 2: the ShareGPT-like trace, all arriving at once, through each
    allocator with continuous batching on the opt-13b-a100 KV budget; shares of KV
    slots. A progress bar titled `desc` (none without) counts the allocators.
    """
    trace = [Arrival(0.0, s) for s in trace_specs("sharegpt", num_requests, seed=seed)]
    systems = ("contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged")
    return {
        system: (
            simulate(
                "opt-13b-a100",
                system,
                trace,
                measure_memory=True,
                block_size=block_size if system == "paged" else 1,
            ).shares()
        )
        for system in tqdm(systems, desc=desc, unit="allocator", disable=desc is None)
    }


def latency_curve(
    profile: str | Profile,
    system: str,
    rates: list[float],
    num_requests: int,
    trace: str = "sharegpt",
    seed: int = 0,
    **options,
) -> list[dict]:
    specs = trace_specs(trace, num_requests, seed=seed)
    points = []
    for rate in rates:
        result = simulate(profile, system, poisson_trace(specs, rate, seed), **options)
        points.append({"rate": rate, "normalized_latency": result.normalized_latency})
    return points


MAX_RATE = 2.0**20  # req/s: beyond this every request of a trace arrives at once
# req/s (one in 12 days): slower, arrival times outgrow what float64 resolves a step on
MIN_RATE = 1e-6


def max_sustainable_rate(
    profile: str | Profile,
    system: str,
    threshold: float,
    num_requests: int,
    trace: str = "sharegpt",
    seed: int = 0,
    known: dict[float, float] | None = None,
    **options,
) -> float:
    """The highest request rate (req/s, to 2%) whose normalized latency stays under
    `threshold`; MAX_RATE when even the whole trace arriving at once stays under it (too
    short to saturate); 0.0 when not even MIN_RATE does (a threshold below what a
    request alone takes).

    `known`: rate -> normalized latency already simulated for this trace, seed and
    options (a latency curve's points). The search then starts between the two known
    rates around the threshold instead of from 1 req/s: a handful of runs fewer."""
    specs = trace_specs(trace, num_requests, seed=seed)
    latency = dict(known or {})

    def ok(rate: float) -> bool:
        if rate not in latency:
            latency[rate] = simulate(
                profile, system, poisson_trace(specs, rate, seed), **options
            ).normalized_latency
        return latency[rate] <= threshold

    low = max(
        (rate for rate, value in latency.items() if value <= threshold), default=0.0
    )
    high = min(
        (rate for rate, value in latency.items() if value > threshold and rate > low),
        default=2 * low or 1.0,
    )
    while ok(high):
        if high >= MAX_RATE:
            return MAX_RATE
        low, high = high, high * 2
    if low == 0.0 and not ok(MIN_RATE):  # one run, instead of halving down to MIN_RATE
        return 0.0
    while high - low > 0.02 * high and high > MIN_RATE:
        middle = (low + high) / 2
        low, high = (middle, high) if ok(middle) else (low, middle)
    return low


# vLLM over Orca
PAPER_RATE_RATIOS = {
    "vs_contiguous_oracle": (1.7, 2.7),
    "vs_contiguous_max": (2.7, 8.0),
}
FIGURE_SYSTEMS = ("paged", "contiguous-oracle", "contiguous-pow2", "contiguous-max")


def figure12(
    profile: str | Profile,
    trace: str,
    num_requests: int,
    rates: list[float],
    threshold: float = 0.0,
) -> dict:
    """Normalized latency against rate for each system, the highest rate each sustains
    under `threshold` s/token (0: four times paging's at the lowest rate), and paging's
    ratios.
    """
    curves = {
        s: latency_curve(profile, s, rates, num_requests, trace) for s in FIGURE_SYSTEMS
    }
    threshold = threshold or 4 * curves["paged"][0]["normalized_latency"]
    best = {
        s: max_sustainable_rate(profile, s, threshold, num_requests, trace)
        for s in FIGURE_SYSTEMS
    }
    ratio = {
        f"vs_{s.replace('-', '_')}": (
            best["paged"] / best[s] if best[s] else float("inf")
        )
        for s in ("contiguous-oracle", "contiguous-max")
    }
    return {
        "trace": trace,
        "threshold": threshold,
        "curves": curves,
        "max_rate": best,
        "rate_ratio": ratio,
    }


ABLATION_BLOCK_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256]


def ablations(
    profile: str | Profile, trace: str, num_requests: int, rate: float
) -> dict:
    """The paper's Figures 18b and 19b from the same tool: paging's normalized latency
    by block size (small blocks pay the per-frame attention cost, large ones waste more
    of their last frame), preempting by recompute and by swap (which pays PCIe time per
    slot and a copy overhead per frame moved). Each run also counts its preemptions:
    where nothing is preempted, the two modes cannot differ."""
    specs = trace_specs(trace, num_requests)

    def run(**options) -> dict:
        result = simulate(profile, "paged", poisson_trace(specs, rate), **options)
        return {
            "normalized_latency": result.normalized_latency,
            "preemptions": result.preemptions,
            "swapped_frames": result.swapped_frames,
        }

    return {"rate": rate} | {
        mode: {b: run(block_size=b, preemption_mode=mode) for b in ABLATION_BLOCK_SIZES}
        for mode in ("recompute", "swap")
    }
