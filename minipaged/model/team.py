"""Helper processes that compute their share of a CPU step on the other cores: every
product `x @ w` and the step's attention, over the weights and KV cache in memory shared
with them, each helper waiting for the next job spinning on a counter there (no thread
to wake, no interpreter lock to hand over). Linux on x86-64; model/cpu.py starts them.
"""

# Why processes, and how a job goes.
#
# A decode step on a CPU is mostly products `x @ w` of a few rows by every weight of the
# model (121 for SmolLM2-135M). To use two cores, each product is cut into column ranges
# and each core computes one. In threads (model/cpu.py's `_split`) every product hands
# its second half to a sleeping thread: the operating system wakes it and the
# interpreter's lock changes hands, about 80-90 us a product on the 2-core machine of
# bench/results/2026-12-05-cpu-2core-team/, some 10 ms a step. A helper process has no
# share in our interpreter's lock: between products it waits spinning on a counter in
# memory shared with us, sees the next product within a microsecond or two, and
# multiplies by its own range of the same weights (the weights live once, in that shared
# memory). Measured there, a step's products of 16 rows by SmolLM2's weights took 41 ms
# with one helper process, 55 ms with the helper thread and 78 ms on one core.
#
# A server's attention is split too (`Team.attend`, through model/cpu.py's
# SplitAttention): the engine's KV cache moves into the shared memory, and each core
# attends a range of the step's sequences with about as much work as the others.
#
# How a product goes (`Team.product`): we copy x into the shared memory, write which
# weight, how many rows and each helper's range (of the output's columns for a few rows,
# of the rows for many), then bump the job counter; each helper sees the counter change,
# computes its range into the shared output and writes the job's number into its own
# `done` slot; we compute our range meanwhile, then wait until every helper's slot holds
# the job's number. A helper that had no job for SPIN seconds stops spinning and sleeps
# on a pipe, and we write a byte to that pipe before a job that follows such a gap.
#
# Linux on x86-64 only: the shared memory is a memfd, and the counters rely on x86's
# store order (data written before a counter is seen before it by a process that reads
# the counter first). Elsewhere the threads of model/cpu.py do the split.

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import importlib
import json
import mmap
import os
import platform
import subprocess
import sys
import time
import weakref

import numpy as np

# a helper with no job for this long sleeps until we write to its pipe
SPIN = 0.05
# a wait spins this many times (some tens of us), then gives the core to whoever else
# is runnable at each turn: our process when the helper waits, the helper when we do,
# and a server's own threads (its HTTP loop), which would otherwise wait for a time
# slice while both cores spin
YIELD_SPINS = 500
# rows of x one job multiplies at most (more rows go in several jobs)
CHUNK_ROWS = 1024
# the shared output's size; a job's rows are cut so that rows x width fit
OUT_BYTES = 32 << 20
# int64 slots per cache line: each helper writes only its own lines
LINE = 8
# how long a helper may take to start and map the shared memory
START_SECONDS = 60.0
# the shared ints (block tables and context lengths of an ATTEND job), int64
INT_BYTES = 1 << 20
# what a job asks: multiply by panels (a few rows), by one GEMM (many), attend (a
# range of a step's sequences), or stop
PANELS, GEMM, ATTEND, STOP = 0, 1, 2, 3
# the job's slots, written by us only: the counter, then the header (kind, eight
# slots of arguments, and each helper's range: lo, hi); each helper's done slot (and
# its process id) is on a line of its own, after them. A product's arguments: weight,
# rows; an ATTEND's: the byte offsets of the layer's K and V caches, sequences, heads,
# blocks per sequence, the scale's float64 bits, and the query rows (0: a decode step,
# one row per sequence; else the rows of a step with prompts, query_start_loc shared
# too)
JOB, KIND, ARGS, RANGES = 0, 1, 2, 10


def done_slot(k: int, helpers: int) -> int:
    """Where helper k writes the last job it finished (its process id in the next
    slot): a line of its own, after the job's lines."""
    job_lines = -(-(RANGES + 2 * helpers) // LINE)
    return (job_lines + k) * LINE


def supported() -> str | None:
    """None where helper processes can run here, else why not (a few words)."""
    if not hasattr(os, "memfd_create"):
        return "helper processes need Linux (memfd_create)"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return "helper processes rely on x86-64's store order"
    return None


@dataclasses.dataclass(slots=True)
class Plan:
    """How one product goes (Team._plan): the job's header, our range lo:hi (of the
    output's columns for PANELS, of x's rows for GEMM), and the views of the shared x
    and output that the job uses."""

    header: np.ndarray
    lo: int
    hi: int
    x: np.ndarray
    out: np.ndarray
    # our columns' operands of np.matmul (a, b, out) for PANELS, their out in the
    # shared output beside the helpers' columns; None for GEMM (its x is the
    # caller's) or an empty range
    ours: tuple | None


class HelperError(RuntimeError):
    """A helper process could not start, or stopped while it had a job."""


class Team:
    """`helpers` processes that multiply x by `weights` (cpu.PanelWeight) with us, each
    weight moved into memory shared with them (no second copy). `product(w, x, parts)`
    splits one product over `parts` cores: ours and parts - 1 helpers'. With `kv` (an
    engine's KVCache, whose `data` holds every layer's K and V), the cache moves into
    that memory too, and `attend` splits a step's attention; `attention` names the
    module whose decode and prefill the helpers run (minipaged.attention.cpu: the
    caller's, so that this layer imports none)."""

    def __init__(self, weights: list, helpers: int, kv=None, attention: str = ""):
        if helpers < 1:
            raise ValueError(f"a team needs at least one helper process, not {helpers}")
        reason = supported()
        if reason:
            raise HelperError(reason)
        if any(w.dtype != np.float32 for w in weights):
            raise HelperError("helper processes multiply float32 weights only")
        self.helpers, self.weights = helpers, list(weights)
        self.panel = weights[0].panels.shape[1]
        widest_in = max(w.out_rows.shape[1] for w in weights)
        # the shared memory: control lines, x, the output, the ints, every weight, then
        # the KV cache
        control = _aligned(8 * done_slot(helpers, helpers))
        x_bytes = _aligned(CHUNK_ROWS * widest_in * 4)
        offsets, size = [], control + x_bytes + OUT_BYTES + INT_BYTES
        for w in weights:
            offsets.append(size)
            size += _aligned(w.out_rows.nbytes)
        kv_at = size
        if kv is not None:
            size += _aligned(kv.data.nbytes)
        self.fd = os.memfd_create("minipaged-weights")
        self.procs, self.wakes = [], []
        try:
            os.ftruncate(self.fd, size)
            self.memory = map_shared(self.fd, size)
            # the weights on 2 MB pages where the kernel can (see huge_pages)
            weights_at = offsets[0] if offsets else kv_at
            self.huge_pages = huge_pages(self.memory, weights_at, kv_at)
            # the weights' pages now (no room fails here, not in a page fault); the KV
            # cache's come as its frames are written
            os.posix_fallocate(self.fd, 0, kv_at)
        except OSError as error:
            os.close(self.fd)
            raise HelperError(
                f"no room for {size / 2**20:.0f} MiB of shared memory: {error}"
            ) from None
        self.control = np.ndarray((control // 8,), np.int64, self.memory)
        self.x = np.ndarray((x_bytes // 4,), np.float32, self.memory, control)
        self.out = np.ndarray(
            (OUT_BYTES // 4,), np.float32, self.memory, control + x_bytes
        )
        ints_at = control + x_bytes + OUT_BYTES
        self.ints = np.ndarray((INT_BYTES // 8,), np.int64, self.memory, ints_at)
        for w, offset in zip(weights, offsets):
            w.share(np.ndarray(w.out_rows.shape, w.out_rows.dtype, self.memory, offset))
        table = [
            [offset, *w.out_rows.shape, w.panels.shape[1]]
            for w, offset in zip(weights, offsets)
        ]
        # where the KV cache lives, and one layer's K (or V) cache's shape and dtype
        self.kv, self.kv_range, frames = None, (0, 0), None
        self.base = np.frombuffer(self.memory, np.uint8, 1).ctypes.data
        if kv is not None:
            shared = np.ndarray(kv.data.shape, kv.data.dtype, self.memory, kv_at)
            copy_written(kv.data, shared)
            kv.data, self.kv = shared, kv
            self.kv_range = (kv_at, kv_at + shared.nbytes)
            frames = [list(shared.shape[2:]), shared.dtype.str, attention]
        self.index = {id(w): i for i, w in enumerate(weights)}
        self.job, self.last_job, self.plans = 0, time.monotonic(), {}
        self.done_slots = [done_slot(k, helpers) for k in range(helpers)]
        try:
            for k in range(helpers):
                self._start(k, table, control, x_bytes, frames)
            self._wait_ready()
        except BaseException:
            self.close()
            raise

    def pids(self) -> list[int]:
        """The helper processes' ids."""
        return [proc.pid for proc in self.procs]

    def _start(self, k: int, table, control: int, x_bytes: int, frames) -> None:
        read, write = os.pipe()
        os.set_blocking(write, False)
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        layout = dict(
            fd=self.fd, wake=read, k=k, helpers=self.helpers, size=len(self.memory),
            control=control, x_bytes=x_bytes, out_bytes=OUT_BYTES, table=table,
            frames=frames,
        )  # fmt: skip
        proc = subprocess.Popen(
            [sys.executable, "-m", "minipaged.model.team", json.dumps(layout)],
            pass_fds=(self.fd, read),
            env=env,
        )
        os.close(read)
        self.procs.append(proc)
        self.wakes.append(write)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_SECONDS
        for k, proc in enumerate(self.procs):
            while self.control[done_slot(k, self.helpers) + 1] != proc.pid:
                if proc.poll() is not None:
                    raise HelperError(
                        f"helper process {k + 1} exited at start (code"
                        f" {proc.returncode})"
                    )
                if time.monotonic() > deadline:
                    raise HelperError(
                        f"helper process {k + 1} did not start in {START_SECONDS:.0f} s"
                    )
                time.sleep(0.005)

    # ---- a product -------------------------------------------------------------

    def product(self, w, x: np.ndarray, parts: int, kind: int) -> np.ndarray:
        """x @ w (an ndarray (rows, w.shape[1])) on `parts` cores, ours and parts - 1
        helpers': by PANELS, each core a range of the output's columns (few rows: the
        weights are read once); by GEMM, each core a range of the rows (many rows: the
        work is the flops, and whole rows need no gathering)."""
        rows, width = len(x), w.out_rows.shape[0]
        parts = max(1, min(parts, self.helpers + 1))
        chunk = max(1, min(CHUNK_ROWS, OUT_BYTES // (4 * width)))
        if rows <= chunk:  # one job: every product of a decode step
            result = self._job(w, x, kind, parts)
        else:
            result = np.empty((rows, width), np.float32)
            for lo in range(0, rows, chunk):
                hi = min(rows, lo + chunk)
                self._job(w, x[lo:hi], kind, parts, result[lo:hi])
        return result if width == w.shape[1] else result[:, : w.shape[1]]

    def _bounds(self, kind: int, rows: int, width: int, parts: int) -> list[int]:
        """Where each core's range starts and ends, as even as can be: columns in
        whole panels (PANELS), or rows (GEMM)."""
        if kind == GEMM:
            return [rows * i // parts for i in range(parts + 1)]
        panels = width // self.panel
        return [panels * i // parts * self.panel for i in range(parts + 1)]

    def _header(self, kind: int, args: tuple, bounds: list) -> np.ndarray:
        """A job's header: kind, arguments, each helper's range."""
        ranges = [0] * (2 * self.helpers)
        # helpers beyond the parts get an empty range and only say done
        for k in range(len(bounds) - 2):
            ranges[2 * k : 2 * k + 2] = bounds[k + 1 : k + 3]
        padded = list(args) + [0] * (RANGES - ARGS - len(args))
        return np.array([kind, *padded, *ranges], np.int64)

    def _plan(self, w, rows: int, kind: int, parts: int) -> Plan:
        """How a product of `rows` rows by w goes on `parts` cores, made once and kept:
        a decode step asks the same 121 again and again, and each NumPy call saved
        here is saved 121 times a step (some microseconds each: the weights have just
        gone through the caches)."""
        key = (id(w), rows, kind, parts)
        plan = self.plans.get(key)
        if plan is None:
            if len(self.plans) > 4096:
                self.plans.clear()
            width, depth = w.out_rows.shape
            bounds = self._bounds(kind, rows, width, parts)
            lo, hi = bounds[0], bounds[1]
            shared_x = self.x[: rows * depth].reshape(rows, depth)
            shared_out = self.out[: rows * width].reshape(rows, width)
            ours = None
            if kind == PANELS and lo < hi:
                ours = operands(
                    kind, shared_x, w.out_rows, self.panel, shared_out, lo, hi
                )
            plan = Plan(
                header=self._header(kind, (self.index[id(w)], rows), bounds),
                lo=lo,
                hi=hi,
                x=shared_x,
                out=shared_out,
                ours=ours,
            )
            self.plans[key] = plan
        return plan

    def _publish(self, header: np.ndarray) -> None:
        """Write a job's header, then its number: the helpers start on it."""
        self.control[KIND : RANGES + 2 * self.helpers] = header
        if time.monotonic() - self.last_job > SPIN / 2:
            self._wake()  # a helper may have gone to sleep
        self.job += 1
        self.control[JOB] = self.job  # last: the helpers read the rest after it

    def _job(self, w, x: np.ndarray, kind: int, parts: int, result=None):
        """One job, x's rows fitting the shared memory: x @ w into `result`, or into a
        new array (returned either way)."""
        plan = self._plan(w, len(x), kind, parts)
        if kind == GEMM:
            # the helpers read and write their rows; ours go straight into the result
            if result is None:
                result = np.empty(plan.out.shape, np.float32)
            plan.x[plan.hi :] = x[plan.hi :]
            self._publish(plan.header)
            multiply(GEMM, x, w.out_rows, self.panel, result, plan.lo, plan.hi)
            self._wait_done()
            result[plan.hi :] = plan.out[plan.hi :]
        else:
            # the helpers read all of x; our columns go beside theirs in the shared
            # output, and all of it into the result
            np.copyto(plan.x, x)
            self._publish(plan.header)
            if plan.ours is not None:
                a, b, out = plan.ours
                np.matmul(a, b, out=out)
            self._wait_done()
            if result is None:
                result = plan.out.copy()
            else:
                np.copyto(result, plan.out)
        self.last_job = time.monotonic()
        return result

    def holds(self, array: np.ndarray) -> bool:
        """Does `array` lie in the KV cache this team shares?"""
        at = array.ctypes.data - self.base
        return self.kv_range[0] <= at < self.kv_range[1]

    def attend(
        self, q, k_cache, v_cache, tables, lens, scale, parts: int, attention, starts
    ):
        """`attention`'s result for a step's sequences, split over `parts` cores, each
        core a range of the sequences with about as much of the work (queries times
        positions): `attention` is minipaged.attention.cpu's decode (`starts` None: a
        row of q per sequence) or prefill (`starts`, its query_start_loc). None where
        this team cannot: the cache is not the one it shares, or the step is too big
        for the shared memory."""
        heads, head_dim = q.shape[1:]
        num_seqs = len(lens)
        parts = max(1, min(parts, self.helpers + 1, num_seqs))
        if parts < 2:  # one sequence: ours alone (no call spent on the rest)
            return None
        tables, lens = np.asarray(tables), np.asarray(lens)
        rows = np.arange(num_seqs + 1) if starts is None else np.asarray(starts)
        if (
            q.dtype != np.float32
            or not (self.holds(k_cache) and self.holds(v_cache))
            or tables.size + 2 * num_seqs + 1 > len(self.ints)
            or q.size > min(len(self.x), len(self.out))
        ):
            return None
        # each core's sequences: about 1 / parts of the work each
        ends = np.cumsum(np.diff(rows) * lens)
        cuts = np.searchsorted(ends, ends[-1] * np.arange(1, parts) / parts)
        bounds = [0, *np.minimum(cuts + 1, num_seqs).tolist(), num_seqs]
        self.x[: q.size] = q.reshape(-1)
        self.ints[: tables.size] = tables.reshape(-1)
        self.ints[tables.size : tables.size + num_seqs] = lens
        self.ints[tables.size + num_seqs : tables.size + 2 * num_seqs + 1] = rows
        args = (
            k_cache.ctypes.data - self.base,
            v_cache.ctypes.data - self.base,
            num_seqs,
            heads,
            tables.shape[1],
            int(np.float64(scale).view(np.int64)),
            0 if starts is None else len(q),
        )
        self._publish(self._header(ATTEND, args, bounds))
        result = np.empty(q.shape, np.float32)
        mine, ours, *call = share(
            q, tables, lens, rows, bounds[0], bounds[1], starts is None
        )
        result[mine] = attention(ours, k_cache, v_cache, *call, scale)
        self._wait_done()
        self.last_job = time.monotonic()
        theirs = slice(rows[bounds[1]], len(q))
        result[theirs] = self.out[: q.size].reshape(q.shape)[theirs]
        return result

    def _wake(self) -> None:
        for write in self.wakes:
            # full: it will wake anyway; closed: it is gone, and _check says so
            with contextlib.suppress(BlockingIOError, BrokenPipeError):
                os.write(write, b"!")

    def _wait_done(self) -> None:
        ctl, job = self.control, self.job
        spins, since = 0, time.monotonic()
        for k, slot in enumerate(self.done_slots):
            while ctl[slot] != job:
                spins += 1
                if spins > YIELD_SPINS:
                    os.sched_yield()  # the helper may wait for this core
                if spins % 4096 == 0:
                    self._check(k, since)

    def _check(self, k: int, since: float) -> None:
        """While we wait on helper k: it is alive (else HelperError), and awake."""
        proc = self.procs[k]
        if proc.poll() is not None:
            raise HelperError(
                f"helper process {k + 1} (pid {proc.pid}) exited with code"
                f" {proc.returncode} while it had a job"
            )
        if time.monotonic() - since > 0.002:
            self._wake()

    def close(self) -> None:
        """Stop the helpers (a STOP job, then their exit); the weights and the KV cache
        go back to private copies."""
        procs, self.procs = self.procs, []
        if any(p.poll() is None for p in procs):
            self.control[KIND] = STOP
            self.job += 1
            self.control[JOB] = self.job
            self._wake()
        for proc in procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for write in self.wakes:
            os.close(write)
        self.wakes = []
        for w in self.weights:
            if w.shared:
                w.unshare()
        if self.kv is not None:  # the cache back in private memory
            self.kv.data, self.kv = np.array(self.kv.data), None
        self.weights = []
        # never unmapped here: an array a caller still holds (a layer's cache passed
        # to an attention call when a helper died) keeps the mapping alive, and it goes
        # with the last of them
        self.control = self.x = self.out = self.ints = self.memory = None
        with contextlib.suppress(OSError):
            os.close(self.fd)


def multiply(kind, x, out_rows, panel: int, out, lo: int, hi: int) -> None:
    """One core's range of x @ out_rows.T into the same range of out (rows, width):
    PANELS, columns lo:hi, one small product per panel of `panel` rows of out_rows
    (one product for one row); GEMM, rows lo:hi, one product."""
    if lo < hi:
        a, b, into = operands(kind, x, out_rows, panel, out, lo, hi)
        np.matmul(a, b, out=into)


def operands(kind, x, out_rows, panel: int, out, lo: int, hi: int) -> tuple:
    """multiply's product as np.matmul's operands (a, b, out): views, which a plan
    keeps (the same product comes back every step)."""
    if kind == PANELS and len(x) == 1:
        # one row: BLAS's matrix-vector code reads the range 5% faster than panels
        return x, out_rows[lo:hi].T, out[:, lo:hi]
    if kind == PANELS:
        rows, width = out.shape
        stacked = out_rows[lo:hi].reshape(-1, panel, out_rows.shape[1])
        columns = out.reshape(rows, width // panel, panel).transpose(1, 0, 2)
        return x, stacked.transpose(0, 2, 1), columns[lo // panel : hi // panel]
    return x[lo:hi], out_rows.T, out[lo:hi]


def copy_written(source: np.ndarray, target: np.ndarray, rows: int = 256) -> None:
    """Copy `source` into `target` (fresh shared memory, all zeros), `rows` frames at a
    time, skipping those that are all zeros: a fresh KV cache's pages stay unwritten,
    and take no memory until the engine writes them."""
    frames = source.shape[-4]  # (..., frames, block_size, kvh, head_dim)
    flat_source = source.reshape(-1, *source.shape[-4:])
    flat_target = target.reshape(flat_source.shape)
    for outer in range(len(flat_source)):
        for lo in range(0, frames, rows):
            chunk = flat_source[outer, lo : lo + rows]
            if chunk.any():
                flat_target[outer, lo : lo + rows] = chunk


# Why the shared memory is mapped by hand, at a 2 MB boundary
# (bench/results/2026-12-05-cpu-2core-batch1/): a decode step reads every weight once,
# 538 MB in pages of 4 KB, and each page costs the processor a walk of the page tables
# (two in a virtual machine). On 2 MB pages one core's matrix-vector product read 15.0
# GB/s where it read 13.3 on 4 KB pages, and a decode step of one stream took 25.4 ms
# where it took 26.6. NumPy asks for 2 MB pages for its own large arrays (madvise), so
# BLAS's threads had them and the helpers did not. The shared memory (a memfd) gets
# them only where the kernel is told to: MADV_COLLAPSE (Linux 6.1 and later, whatever
# the system's settings) turns a range of written pages into 2 MB pages, and every
# process then maps them whole if its mapping starts at a 2 MB boundary, which Python's
# mmap does not promise. Elsewhere the pages stay 4 KB: slower, the same numbers.

HUGE_PAGE = 2 << 20
# Linux's values, which Python's mmap module does not name
MADV_HUGEPAGE, MADV_COLLAPSE, PROT_NONE, MAP_FIXED = 14, 25, 0, 0x10
MAP_FAILED = ctypes.c_void_p(-1).value


def map_shared(fd: int, size: int):
    """The first `size` bytes of file `fd`, mapped shared and writable at a 2 MB
    boundary (libc's mmap, through ctypes): a buffer NumPy arrays can lie on, unmapped
    when the last of them is gone. Python's mmap.mmap where that fails."""
    try:
        libc = _libc()
        # reserve size + 2 MB, put the file at the first 2 MB boundary inside, and
        # give back the rest
        reserved = libc.mmap(None, size + HUGE_PAGE, PROT_NONE,
                             mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)  # fmt: skip
        if reserved in (None, MAP_FAILED):
            raise OSError(ctypes.get_errno(), "no room to reserve")
        at = -(-reserved // HUGE_PAGE) * HUGE_PAGE
        mapped = libc.mmap(at, size, mmap.PROT_READ | mmap.PROT_WRITE,
                           mmap.MAP_SHARED | MAP_FIXED, fd, 0)  # fmt: skip
        if mapped != at:
            libc.munmap(reserved, size + HUGE_PAGE)
            raise OSError(ctypes.get_errno(), "could not map the file")
        if at > reserved:
            libc.munmap(reserved, at - reserved)
        libc.munmap(at + size, reserved + HUGE_PAGE - at)
    except (OSError, AttributeError):
        return mmap.mmap(fd, size)
    memory = (ctypes.c_char * size).from_address(at)
    # not at exit: a thread still running then may read it; the exit unmaps it anyway
    weakref.finalize(memory, libc.munmap, at, size).atexit = False
    return memory


def huge_pages(memory, start: int, end: int) -> bool:
    """Put bytes start:end of `memory` (map_shared's, still unwritten) on 2 MB pages:
    one byte written in each 2 MB, then MADV_COLLAPSE (0.1 s for SmolLM2's 538 MB). True
    where every 2 MB of the range took; False on a kernel without it, or a mapping
    that does not start at a 2 MB boundary (then 4 KB pages, as before)."""
    at = np.frombuffer(memory, np.uint8, 1).ctypes.data
    first = -(-(at + start) // HUGE_PAGE) * HUGE_PAGE
    last = (at + end) // HUGE_PAGE * HUGE_PAGE
    if at % HUGE_PAGE or last <= first:
        return False
    libc = _libc()
    pages = np.frombuffer(memory, np.uint8)[first - at : last - at]
    libc.madvise(first, last - first, MADV_HUGEPAGE)  # new pages huge, where allowed
    pages[::HUGE_PAGE] = 0
    return libc.madvise(first, last - first, MADV_COLLAPSE) == 0


@functools.cache
def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                          ctypes.c_int, ctypes.c_int, ctypes.c_long]  # fmt: skip
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


def _aligned(nbytes: int, to: int = 4096) -> int:
    return -(-nbytes // to) * to


def helper(layout: dict) -> None:
    """A helper process's life: map the shared memory, say ready, then do each job's
    range until a STOP job, or until the pipe closes (our process is gone)."""
    memory = map_shared(layout["fd"], layout["size"])
    k, helpers, wake = layout["k"], layout["helpers"], layout["wake"]
    control = np.ndarray((layout["control"] // 8,), np.int64, memory)
    x = np.ndarray((layout["x_bytes"] // 4,), np.float32, memory, layout["control"])
    out_at = layout["control"] + layout["x_bytes"]
    out = np.ndarray((layout["out_bytes"] // 4,), np.float32, memory, out_at)
    ints_at = out_at + layout["out_bytes"]
    ints = np.ndarray((INT_BYTES // 8,), np.int64, memory, ints_at)
    weights = [
        (np.ndarray((width, depth), np.float32, memory, offset), panel)
        for offset, width, depth, panel in layout["table"]
    ]
    done, mine = done_slot(k, helpers), RANGES + 2 * k
    plans = {}
    seen = int(control[JOB])
    control[done] = seen
    control[done + 1] = os.getpid()
    while True:
        spins, idle_since = 0, time.monotonic()
        while control[JOB] == seen:
            spins += 1
            if spins > YIELD_SPINS:
                os.sched_yield()  # our process (or its server's threads) may wait
            if spins % 1024 == 0 and time.monotonic() - idle_since > SPIN:
                if not os.read(wake, 4096):
                    return  # the pipe closed: our process is gone
                idle_since = time.monotonic()
        seen = int(control[JOB])
        header = control[KIND : mine + 2].tolist()
        kind, args = header[0], header[ARGS - KIND : RANGES - KIND]
        lo, hi = header[mine - KIND : mine - KIND + 2]
        if kind == STOP:
            return
        if kind == ATTEND:
            attend(memory, layout["frames"], x, ints, out, args, lo, hi)
            control[done] = seen
            continue
        weight, rows = args[:2]
        key = (kind, weight, rows, lo, hi)
        if key not in plans:  # this range's operands, kept: products come back
            if len(plans) > 4096:
                plans.clear()
            out_rows, panel = weights[weight]
            width, depth = out_rows.shape
            shared_x = x[: rows * depth].reshape(rows, depth)
            shared_out = out[: rows * width].reshape(rows, width)
            plans[key] = (
                operands(kind, shared_x, out_rows, panel, shared_out, lo, hi)
                if lo < hi
                else None  # an empty range: only say done
            )
        if plans[key] is not None:
            a, b, into = plans[key]
            np.matmul(a, b, out=into)
        control[done] = seen


def share(q, tables, lens, rows, lo: int, hi: int, decoding: bool) -> tuple:
    """One core's share of an ATTEND job, sequences lo:hi: (its rows of q, their q,
    then the attention call's arguments after the caches: block tables, context
    lengths and, for a prefill, its query_start_loc from 0)."""
    mine = slice(rows[lo], rows[hi])
    if decoding:
        return mine, q[mine], tables[lo:hi], lens[lo:hi]
    return mine, q[mine], tables[lo:hi], lens[lo:hi], rows[lo : hi + 1] - rows[lo]


def attend(memory, frames, x, ints, out, args, lo: int, hi: int) -> None:
    """A helper's share of an ATTEND job: sequences lo:hi of the step, attended over
    the shared cache into the same rows of the shared output."""
    if lo == hi:
        return
    k_at, v_at, num_seqs, heads, blocks, scale_bits, num_rows = args[:7]
    shape, dtype, module = frames
    attention = importlib.import_module(module)
    k_cache = np.ndarray(shape, dtype, memory, k_at)
    v_cache = np.ndarray(shape, dtype, memory, v_at)
    decoding = num_rows == 0
    num_rows = num_seqs if decoding else num_rows
    q = x[: num_rows * heads * shape[-1]].reshape(num_rows, heads, shape[-1])
    tables = ints[: num_seqs * blocks].reshape(num_seqs, blocks)
    at = num_seqs * blocks
    lens, rows = ints[at : at + num_seqs], ints[at + num_seqs : at + 2 * num_seqs + 1]
    scale = float(np.int64(scale_bits).view(np.float64))
    mine, ours, *call = share(q, tables, lens, rows, lo, hi, decoding)
    how = attention.decode if decoding else attention.prefill
    out[: q.size].reshape(q.shape)[mine] = how(ours, k_cache, v_cache, *call, scale)


if __name__ == "__main__":
    helper(json.loads(sys.argv[1]))
