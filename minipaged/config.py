"""Every option of the engine, checked before any memory is sized: `EngineConfig`.

The names are vLLM's where vLLM has the option; each seam's option takes a policy's
name, a "module:Class" path or an object (minipaged.policies); which options combine is
checked there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from minipaged import policies
from minipaged.paging import (
    ALLOCATORS,
    check_size,
    kv_storage_dtype,
    make_block_manager,
)
from minipaged.scheduler import SchedulerConfig
from minipaged.speculative import SpeculativeConfig, make_lookahead


@dataclass(slots=True)
class EngineConfig:
    block_size: int = 16
    num_blocks: int = 0  # 0: as many as kv_cache_memory holds
    kv_cache_memory: int = 0  # bytes; 0: 512 MiB on a CPU, half the free GPU memory
    # vLLM's: "auto" (the model's), "int8" or "fp8": 8-bit, 2-4x the frames
    kv_cache_dtype: str = "auto"
    swap_space: int = 0  # host frames for preemption by swap; 0: up to 4 GiB worth
    max_model_len: int = 0  # 0: the model's, capped by what the KV cache holds
    max_num_seqs: int = 64
    # decode rows per step while several clients' requests run: each client's first,
    # then the waiting order's choice; 0: every running row
    max_decode_rows: int = 0
    # 0: max(4096, max_model_len); 512 with chunked prefill
    max_num_batched_tokens: int = 0
    enable_prefix_caching: bool = True
    # the seams (minipaged.policies): a name, a "module:Class" path, or an object of
    # one's own
    # which parked cached frame goes first: "fifo", "clock", "random"
    prefix_cache_policy: object = "lru"
    # the drum: host frames keeping evicted prefix-cache blocks; 0: off
    kv_offload_frames: int = 0
    # a file for those frames (numpy.memmap); None: host memory
    kv_offload_path: str | None = None
    # waiting-queue order: "sjf" (shortest job first), "aging", "priority"
    scheduling_policy: object = "fcfs"
    aging_rate: float = 8.0  # "aging": job-size tokens forgiven per step waited
    # or "working-set": admit while running sequences' growth fits too
    admission: object = "greedy"
    admission_window: int = 16  # "working-set": steps of growth counted
    # whom to preempt: None, the waiting order's (else "newest")
    preemption_victim: object = None
    preemption_mode: str = "recompute"
    scheduler: str = "continuous"  # or "static": the pre-Orca baseline
    watermark: float = 0.01
    # or "contiguous-max" / "-pow2" / "-oracle": Orca's baselines
    allocator: str = "paged"
    # prompts in chunks within max_num_batched_tokens per step
    enable_chunked_prefill: bool = False
    # vLLM's: {"method": "ngram", ...}
    speculative_config: dict | SpeculativeConfig | None = None
    # compiles SamplingParams.structured_outputs (meeting 16)
    structured_outputs_backend: object = "automata"

    def __post_init__(self):
        """Every option, before any memory is sized (the scheduler's by
        SchedulerConfig)."""
        check_size("block_size", self.block_size, minimum=1)
        for name in (
            "num_blocks",
            "kv_cache_memory",
            "swap_space",
            "max_model_len",
            "kv_offload_frames",
        ):
            check_size(name, getattr(self, name), minimum=0)
        for name in ("enable_prefix_caching", "enable_chunked_prefill"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"{name} must be True or False, got {getattr(self, name)!r}"
                )
        # a ValueError naming the policies
        policies.make("prefix_cache_policy", self.prefix_cache_policy)
        if (
            not isinstance(self.structured_outputs_backend, str)
            or ":" in self.structured_outputs_backend
            or self.structured_outputs_backend
            not in policies.SEAMS["structured_outputs_backend"]
        ):
            # a ValueError naming them
            policies.resolve(
                "structured_outputs_backend", self.structured_outputs_backend
            )
        # a ValueError naming the dtypes
        kv_storage_dtype(self.kv_cache_dtype, "float32")
        if self.kv_offload_path is not None and not isinstance(
            self.kv_offload_path, (str, os.PathLike)
        ):
            raise ValueError(
                "kv_offload_path must be a file path or None, got"
                f" {self.kv_offload_path!r}"
            )
        if self.allocator not in ALLOCATORS:
            raise ValueError(
                f"allocator must be one of {ALLOCATORS}, got {self.allocator!r}"
            )
        if self.speculative_config is not None:
            self.speculative_config = SpeculativeConfig.from_dict(
                self.speculative_config
            )
        policies.check_options(
            batching=self.scheduler,
            allocator=self.allocator,
            chunked_prefill=self.enable_chunked_prefill,
            lookahead=self.speculative_config is not None,
            prefix_caching=self.enable_prefix_caching,
            offload_frames=self.kv_offload_frames,
            offload_path=self.kv_offload_path,
        )
        self.scheduler_config(max_model_len=0)  # checks the scheduler's options now

    def scheduler_config(self, max_model_len: int) -> SchedulerConfig:
        """The scheduler's options (max_model_len is the engine's, known once memory is
        sized)."""
        return SchedulerConfig(
            max_num_seqs=self.max_num_seqs,
            max_decode_rows=self.max_decode_rows,
            max_num_batched_tokens=self.max_num_batched_tokens,
            preemption_mode=self.preemption_mode,
            watermark=self.watermark,
            max_model_len=max_model_len,
            batching=self.scheduler,
            chunked_prefill=self.enable_chunked_prefill,
            scheduling_policy=self.scheduling_policy,
            aging_rate=self.aging_rate,
            admission=self.admission,
            admission_window=self.admission_window,
            preemption_victim=self.preemption_victim,
        )

    def block_manager(self, num_blocks: int, max_model_len: int, host_frames: int):
        """The KV memory these options ask for (paging.make_block_manager), its policies
        built."""
        return make_block_manager(
            self.allocator,
            self.scheduler,
            num_blocks,
            self.block_size,
            max_model_len,
            host_frames,
            self.enable_prefix_caching,
            policies.make("prefix_cache_policy", self.prefix_cache_policy),
            self.kv_offload_frames,
        )

    def constrainer(self, tokenizer, vocab_size: int, eos_token_ids):
        """The structured-output backend these options name (its constraints'
        compiler)."""
        return policies.make(
            "structured_outputs_backend",
            self.structured_outputs_backend,
            tokenizer=tokenizer,
            vocab_size=vocab_size,
            eos_token_ids=eos_token_ids,
        )

    def lookahead(self, runner, blocks):
        """The step's lookahead (speculative decoding's proposer and checks), or
        None."""
        return make_lookahead(self.speculative_config, runner, blocks)
