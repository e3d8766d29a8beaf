"""How a projection `x @ w` is computed on this CPU: BLAS threads fitted to the
machine's load (one per core no other program is using), and weight panels that make a
few rows (2 to 23-63, timed per machine) read each weight once. The model's forward
never sees it: weights are made here, the load is followed between steps. The array
backend itself (`xp`, the device) is minipaged.backend.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import statistics
import time
import warnings

import numpy as np

from minipaged.backend import cdiv

# ---- BLAS threads on a shared CPU ----------------------------------------------------


def fit_blas_threads(samples: int = 5) -> int:
    """Give NumPy's BLAS one thread per core that no other program is using now; return
    that count.

    OpenBLAS splits every matrix product over its threads and waits for the slowest.
    When another process competes for the cores, one of those threads is often
    descheduled and the others spin waiting for it: decoding on a 2-core machine with
    one busy neighbour ran 5x slower with 2 threads than with 1. On an idle machine all
    cores stay in use. The count never exceeds what BLAS started with (its default or
    OPENBLAS_NUM_THREADS). Called when a model is loaded (`LLM()` on a CPU), by the chat
    before each answer and by the benchmarks before they measure. While a model runs,
    `follow_machine_load` (before each step) keeps it up to date.
    """
    most = blas_threads_at_start()
    # no BLAS with a thread pool (e.g. Apple's Accelerate): nothing to choose
    if most == 0:
        return 1
    busy = busy_cores(samples)
    threads = max(1, min(most, len(_usable_cores()) - busy))
    _set_blas_threads(threads)
    _cores.now, _cores.looks, _cores.checked = threads, [busy], time.monotonic()
    return threads


@functools.cache
def blas_threads_at_start() -> int:
    """BLAS's thread count before fit_blas_threads first changed it (0: no BLAS thread
    pool)."""
    from threadpoolctl import threadpool_info

    return max(
        [
            pool["num_threads"]
            for pool in threadpool_info()
            if pool["user_api"] == "blas"
        ],
        default=0,
    )


def busy_cores(samples: int = 5) -> int:
    """Cores other programs keep busy now: runnable tasks on the machine (/proc/stat's
    procs_running) less this process's own running threads, the median of `samples`
    looks 10 ms apart. 0 where /proc is missing (not Linux): there we cannot tell, and
    assume a quiet machine.
    """
    counts = []
    for i in range(samples):
        try:
            counts.append(_procs_running() - _own_running_threads())
        except OSError:
            return 0
        if i + 1 < samples:
            time.sleep(0.01)
    return max(0, round(statistics.median(counts)))


def _procs_running() -> int:
    with open("/proc/stat") as stat:
        for line in stat:
            if line.startswith("procs_running"):
                return int(line.split()[1])
    raise OSError("no procs_running in /proc/stat")


def _own_running_threads() -> int:
    """Our threads running now, and our helper processes' (model/team.py): they are
    ours, not a neighbour's."""
    tasks = [f"/proc/self/task/{task}" for task in os.listdir("/proc/self/task")]
    tasks += _helpers_in_proc()
    running = 0
    for task in tasks:
        try:
            with open(f"{task}/stat") as stat:
                running += stat.read().rsplit(")", 1)[1].split()[0] == "R"
        except OSError:  # the thread ended while we looked
            pass
    return running


def _usable_cores() -> set[int]:
    return (
        os.sched_getaffinity(0)
        if hasattr(os, "sched_getaffinity")
        else set(range(os.cpu_count() or 1))
    )


# seconds between two looks at the machine's load while a model runs
LOOK_PERIOD = 0.5


def cpu_jiffies() -> tuple[int, int]:
    """(clock ticks every core of the machine spent busy, ticks this process and its
    helper processes spent) since boot, from /proc (OSError where it is missing). Busy:
    user, nice, system and interrupts; not idle, waiting on a disk or stolen by the
    hypervisor."""
    with open("/proc/stat") as stat:
        user, nice, system, _, _, irq, softirq = map(int, stat.readline().split()[1:8])
    own = 0
    for task in ["/proc/self", *_helpers_in_proc()]:
        with contextlib.suppress(OSError):  # a helper that just ended
            with open(f"{task}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            own += int(fields[11]) + int(fields[12])  # utime, stime
    return user + nice + system + irq + softirq, own


def _helpers_in_proc() -> list[str]:
    """Our helper processes' folders in /proc (none without a team)."""
    return [] if _team is None else [f"/proc/{pid}" for pid in _team.pids()]


def busy_cores_lately(cores: _Cores) -> int:
    """Cores other programs kept busy since `cores`'s last look, on average, rounded
    half up: the machine's busy ticks less our own (cpu_jiffies). An average, not a
    look at what runs this instant: a look before a step falls just when the server has
    sent its tokens and its clients (often on this machine) read them, and a client
    reading 16 streams ran in half of those looks while it used a tenth of a core. The
    first look, and a machine without /proc, take busy_cores' snapshot."""
    try:
        moment, ticks = time.monotonic(), cpu_jiffies()
    except OSError:
        return busy_cores(samples=1)
    before, cores.ticks = cores.ticks, (moment, ticks)
    if before is None or moment <= before[0]:
        return busy_cores(samples=1)
    busy, own = ticks[0] - before[1][0], ticks[1] - before[1][1]
    seconds = (moment - before[0]) * os.sysconf("SC_CLK_TCK")
    return max(0, int((busy - own) / seconds + 0.5))


class _Cores:
    """The cores this process should use now, looked at again at most every `period`
    seconds: the cores other programs kept busy since the last look (busy_cores_lately,
    0.1-0.3 ms of /proc reading on a 2-core machine), so a long-running server follows
    the load: a median over the last 5 looks (2.5 s) ignores a blip.
    """

    def __init__(self, period: float = LOOK_PERIOD):
        self.period, self.now, self.looks, self.checked = period, 1, [], -1e9
        # (when, cpu_jiffies()) at the last look
        self.ticks = None

    def follow(self) -> None:
        moment = time.monotonic()
        if moment - self.checked < self.period:
            return
        self.checked = moment
        self.looks = self.looks[-4:] + [busy_cores_lately(self)]
        free = max(1, len(_usable_cores()) - round(statistics.median(self.looks)))
        most = blas_threads_at_start() or len(_usable_cores())
        if min(free, most) != self.now:
            self.now = min(free, most)
            _set_blas_threads(self.now)


_cores = _Cores()


def follow_machine_load() -> int:
    """The cores to use now (see _Cores); BLAS's own thread count is kept equal to it.
    Called between steps (`Model.follow_machine_load`, before each step), never inside a
    forward: most calls only read the clock (under 1 us)."""
    _cores.follow()
    return _cores.now


def use_cores(choice: str | int) -> int:
    """How a long-running process (the server) sets its BLAS threads and weight panels:
    "fit", one per core that other programs leave idle, followed before each step
    (fit_blas_threads, follow_machine_load: a good neighbour, as the chat is); "all",
    every core this process may run on, whatever the others do (a server that owns the
    machine, as vLLM's); or that many threads. Never more than BLAS started with.
    Returns the threads in use now.

    Why a server fits by default (measured on a 2-core AMD EPYC, concurrency 16, other
    programs keeping 0.6 to 1.6 cores busy; bench/results/2026-12-03-cpu-2core-race/):
    fit served 19-62 tokens/s at 17-21 ms of CPU per token, all 9-10 tokens/s at 87-102
    ms, its two threads waiting on whichever one the neighbour's work descheduled. What
    fitting costs: the core a neighbour leaves idle between its bursts stays idle.
    """
    if choice == "fit":
        _cores.period = LOOK_PERIOD  # the load is looked at again, as at start
        return fit_blas_threads(samples=3)
    most = blas_threads_at_start() or len(_usable_cores())
    cores = len(_usable_cores()) if choice == "all" else int(choice)
    # follow() looks again only after `period` seconds: never
    _cores.now, _cores.period = max(1, min(cores, most)), math.inf
    _set_blas_threads(_cores.now)
    return _cores.now


@contextlib.contextmanager
def held_cores(cores: int = 1):
    """BLAS and the weight panels on `cores` threads until the block ends, whatever the
    machine's load: for numbers that must not change from run to run. OpenBLAS's GEMM
    sums in an order that depends on its thread count, so a result's last bits follow
    the load; an 8-bit KV cache's rounding can turn them into another greedy token in a
    near tie (`bench kv-dtype` saw 4 to 6 of 10 answers agree from run to run)."""
    before = (_cores.now, _cores.period)
    # follow() looks again only after `period` seconds: never, while held
    _cores.now, _cores.period = cores, math.inf
    _set_blas_threads(cores)
    try:
        yield
    finally:
        _cores.now, _cores.period = before
        _set_blas_threads(_cores.now)


def _set_blas_threads(threads: int) -> None:
    """BLAS's own threads: `threads`, or 1 while helper processes split the products
    (its threads would compete with them for the cores)."""
    for controller in _blas_controllers():
        controller.set_num_threads(threads if _team is None else 1)


@functools.cache
def _blas_controllers():
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController().select(user_api="blas").lib_controllers


# ---- Helper processes (model/team.py) ------------------------------------------------

# the running team of helper processes, if any (start_team)
_team = None


@functools.cache
def team_module():
    """minipaged.model.team, imported when first needed (and then looked up once: a
    decode step asks for it at each of its 121 products)."""
    from minipaged.model import team

    return team


def cores_for(choice: str | int) -> int:
    """The most cores `choice` (use_cores's) may use at once."""
    most = blas_threads_at_start() or len(_usable_cores())
    if choice in ("fit", "all"):
        return max(1, min(len(_usable_cores()), most))
    return max(1, min(int(choice), most))


def start_team(weights: list, helpers: int, kv=None, attention: str = "") -> str:
    """Split the products by `weights` (PanelWeights) over `helpers` helper processes
    and this one from now on (model/team.py), in place of BLAS's threads and the
    panels' helper thread; with `kv` (an engine's KVCache), its attention too
    (SplitAttention), the helpers running module `attention`'s (its name). A team
    already running stops first. Says in a few words what runs: where helpers cannot run
    here, or MINIPAGED_CPU_HELPERS=0, the threads stay, and the answer says why; where
    the shared weights could not go on 2 MB pages (team.huge_pages), it says that too.
    """
    stop_team()
    if helpers < 1:
        return "no helper processes (one core)"
    if os.environ.get("MINIPAGED_CPU_HELPERS") == "0":
        return "no helper processes (MINIPAGED_CPU_HELPERS=0): BLAS threads"
    team = team_module()
    global _team
    try:
        _team = team.Team(weights, helpers, kv, attention)
    except team.HelperError as error:
        return f"no helper processes ({error}): BLAS threads"
    _set_blas_threads(_cores.now)
    _stop_team_at_exit()
    pages = "" if _team.huge_pages else " (weights on 4 KB pages, not 2 MB: slower)"
    return f"{helpers} helper process(es) beside this one{pages}"


def stop_team() -> None:
    """Stop the helper processes, if any; the weights go back to private memory and
    BLAS to its threads."""
    global _team
    if _team is not None:
        team, _team = _team, None
        team.close()
        _set_blas_threads(_cores.now)


@functools.cache
def _stop_team_at_exit() -> None:
    import atexit

    atexit.register(stop_team)


class SplitAttention:
    """The CPU attention (minipaged.attention.cpu) with its decode and prefill split
    between this process and the helper processes, each a range of the step's
    sequences with about as much of the work, where the team shares the engine's KV
    cache (Team.attend). write_kv, copy_blocks, and a call the team cannot take (an
    8-bit cache, one core free now, no team), are the CPU attention's own."""

    def __init__(self, impl):
        self.impl = impl
        self.write_kv, self.copy_blocks = impl.write_kv, impl.copy_blocks

    def decode(self, q, k_cache, v_cache, block_tables, context_lens, scale, **scales):
        out = self._split(
            self.impl.decode, None, q, k_cache, v_cache, block_tables, context_lens,
            scale, scales,
        )  # fmt: skip
        if out is not None:
            return out.astype(q.dtype, copy=False)
        return self.impl.decode(
            q, k_cache, v_cache, block_tables, context_lens, scale, **scales
        )

    def prefill(
        self, q, k_cache, v_cache, block_tables, context_lens, query_start_loc, scale,
        **scales,
    ):  # fmt: skip
        out = self._split(
            self.impl.prefill, query_start_loc, q, k_cache, v_cache, block_tables,
            context_lens, scale, scales,
        )  # fmt: skip
        if out is not None:
            return out.astype(q.dtype, copy=False)
        return self.impl.prefill(
            q, k_cache, v_cache, block_tables, context_lens, query_start_loc, scale,
            **scales,
        )  # fmt: skip

    def _split(
        self, attention, starts, q, k_cache, v_cache, tables, lens, scale, scales
    ):
        """Team.attend's result, or None where it is not to be split."""
        if _team is None or _cores.now < 2 or scales:
            return None
        try:
            return _team.attend(
                q, k_cache, v_cache, tables, lens, scale, _cores.now, attention, starts
            )
        except team_module().HelperError as error:
            warnings.warn(
                f"{error}: the helper processes stop; attention goes on here",
                stacklevel=3,
            )
            stop_team()
            return None


# ---- How a projection `x @ w` is computed on a CPU -----------------------------------
#
# A decode step multiplies a few rows, one per running sequence, by every weight matrix
# of the model: 538 MB for SmolLM2-135M in float32. The work is small (2 flops per
# weight per row) and the weights do not fit in any cache, so the step's time is the
# time to read them from memory: one row is memory-bound. Read once, the weights cost
# the same for 1 row as for 16; only the flops grow, and at 16 rows they are still under
# the memory's time (200-300 GFLOP/s on two cores: 4.3 GFLOP, 15-20 ms). So many rows
# should cost almost what one row costs.
#
# What this machine's BLAS does in between (OpenBLAS in NumPy's wheel on a 2-core Xeon;
# measured by `python -m minipaged.bench projections`,
# bench/results/2026-12-02-cpu-2core-numpy-decode/):
# - 1 row: its matrix-vector code on 2 threads reads the weights at the copy bandwidth
#   (about 25 GB/s): one step's products in 20-21 ms, the floor.
# - 2 rows and more: its GEMM packs (copies) each weight into cache-sized tiles at every
#   call, then computes: 2.5x the time of reading it, so 2 rows took 3.5x one row. Kept
#   as PANEL-row panels of the (out, in) layout, the product is a stack of small ones
#   that its small-matrix kernel computes straight from memory: one core reads at 12-13
#   GB/s, near its own limit (15 GB/s for the matrix-vector code on one core). A second
#   core needs a second thread, and each product hands half of its panels to it: about
#   90 us per hand-off here (a sleeping thread is woken, the GIL changes hands), 121
#   products a step, some 10 ms that the matrix-vector code never pays (its threads
#   wait spinning inside OpenBLAS). So 2 rows cost 1.7x one row's products, not 1x, and
#   16 rows 2.8x. A server instead starts helper processes (start_team, model/team.py):
#   each waits spinning on a counter in shared memory, with no hand-off of the
#   interpreter's lock, and a step's products of 16 rows took 41 ms, not 55
#   (bench/results/2026-12-05-cpu-2core-team/). With them, every row count is split
#   between the processes, one row too (BLAS's own threads would compete with them).
# - Many rows: packing pays for itself, and one GEMM on the whole matrix wins. From how
#   many rows depends on the processor: on the 2-core Xeon (AVX-512) of
#   bench/results/2026-12-05-cpu-2core-race/ from 24 (the small-matrix kernel slows
#   down 2x past about 21 rows of SmolLM2's shapes: 16 rows 51 ms by panels, 75 by the
#   GEMM; 24 rows 115 and 83 ms). So the model times its own step both ways at load
#   (choose_gemm_rows) and each weight keeps the answer; 64 where the GEMM never wins.
# Tried and dropped: one matrix-vector product per row (each row reads the weights
# again: 2 rows 1.7-1.9x one row, 4 rows 2.6x; `bench projections` shows it), column
# blocks of the (in, out) layout through the GEMM, panels of 16, 64 and 128 rows,
# splitting only the larger products, handing the pieces over with locks instead of
# futures (the same within noise), and BLIS (cython-blis's wheel: 4-10x slower). The
# layout costs no copy: all three paths read the same memory. Apple's Accelerate and MKL
# choose their own kernels, so the panels are timed once per machine (`panels_pay`) and
# dropped where they do not gain.

# rows of (out, in) per panel: (16 x in x 32) stays under OpenBLAS's small-matrix size
PANEL = 32
# from this many rows on, one GEMM on the whole matrix, where choose_gemm_rows does not
# find fewer
GEMM_ROWS = 64
# the row counts choose_gemm_rows tries, from the smallest up
GEMM_ROW_CHOICES = (16, 24, 32, 48, 64)


def projection_path(rows: int, gemm_rows: int = GEMM_ROWS, team: bool = False) -> str:
    """How `x @ w` is computed for `rows` rows of x (the rule above, the one place it is
    made): "matrix-vector" for one row, "panels" for 2 to gemm_rows - 1, "gemm" from
    gemm_rows on (the weight's own, measured at load: choose_gemm_rows). With helper
    processes (`team`, model/team.py) one row is split by columns as panels are, each
    core's range by BLAS's matrix-vector code on one thread: BLAS's own threads would
    compete with the helpers for the cores.
    """
    if rows == 1 and not team:
        return "matrix-vector"
    return "panels" if rows < gemm_rows else "gemm"


class PanelWeight:
    """An (in, out) weight matrix kept as (out, in) rows, read as panels of PANEL rows,
    for CPU decoding; `x @ w` works as on an array (the model's code does not change)
    and returns an ndarray (rows, out)."""

    # `x @ w` with an ndarray x calls our __rmatmul__, not NumPy's
    __array_ufunc__ = None

    def __init__(self, array: np.ndarray):
        rows, cols = array.shape
        padded = cdiv(cols, PANEL) * PANEL
        # a last, narrower panel is padded with zeros, cut off after the product
        if padded != cols:
            array = np.pad(array, ((0, 0), (0, padded - cols)))
        self.shape, self.dtype = (rows, cols), array.dtype
        # (out, in): no copy for a Hugging Face weight's .T
        self.out_rows = np.ascontiguousarray(array.T)
        # (out/PANEL, PANEL, in), a view
        self.panels = self.out_rows.reshape(padded // PANEL, PANEL, rows)
        # from how many rows on the GEMM takes over (the model's choose_gemm_rows)
        self.gemm_rows = GEMM_ROWS
        # in memory shared with helper processes (model/team.py)
        self.shared = False

    def share(self, out_rows: np.ndarray) -> None:
        """Keep the (out, in) rows in `out_rows` from now on, copied there: memory
        shared with helper processes (model/team.py)."""
        out_rows[...] = self.out_rows
        self._keep(out_rows, shared=True)

    def unshare(self) -> None:
        """Back to a private copy of the (out, in) rows (the helpers have stopped)."""
        self._keep(np.array(self.out_rows), shared=False)

    def _keep(self, out_rows: np.ndarray, shared: bool) -> None:
        self.out_rows, self.shared = out_rows, shared
        self.panels = out_rows.reshape(-1, PANEL, out_rows.shape[1])

    @property
    def nbytes(self) -> int:
        return self.out_rows.nbytes

    def dense(self) -> np.ndarray:
        """The (in, out) matrix, a view."""
        return self.out_rows.T[:, : self.shape[1]]

    def __rmatmul__(self, x: np.ndarray) -> np.ndarray:
        if x.ndim != 2 or x.shape[1] != self.shape[0]:
            raise ValueError(
                f"x @ w: x {x.shape} does not match a weight of shape {self.shape}"
            )
        team = _team if _cores.now > 1 and self.shared else None
        path = projection_path(len(x), self.gemm_rows, team is not None)
        if team is not None:
            kind = team_module().GEMM if path == "gemm" else team_module().PANELS
            try:
                return team.product(self, x, _cores.now, kind)
            except team_module().HelperError as error:
                # this product, and the later ones, without the helpers
                warnings.warn(
                    f"{error}: the helper processes stop; BLAS threads go on",
                    stacklevel=2,
                )
                stop_team()
                path = projection_path(len(x), self.gemm_rows)
        if path == "panels":
            return self.by_panels(x)
        # BLAS: its matrix-vector code for one row, its GEMM for many
        return x @ self.dense()

    def by_panels(self, x: np.ndarray, cores: int | None = None) -> np.ndarray:
        """x @ w as one small product per panel, the panels split over `cores` threads
        (default: the cores free now)."""
        out = np.empty(
            (len(self.panels), len(x), PANEL), dtype=np.result_type(x, self.dtype)
        )
        _split(
            lambda lo, hi: np.matmul(
                x, self.panels[lo:hi].transpose(0, 2, 1), out=out[lo:hi]
            ),
            len(self.panels),
            cores or _cores.now,
        )
        return out.transpose(1, 0, 2).reshape(len(x), -1)[:, : self.shape[1]]


def projection_weight(array: np.ndarray, xp, dtype):
    """How the model stores an (in, out) weight that multiplies activations (`x @ w`):
    panels on a CPU whose BLAS gains by them, else a contiguous array on the device: on
    a GPU (cuBLAS has no such gap), with MINIPAGED_CPU_PANELS=0 (to measure the
    difference), or =1 to skip the timing.
    """
    choice = os.environ.get("MINIPAGED_CPU_PANELS", "")
    if xp is np and choice != "0" and (choice == "1" or panels_pay()):
        return PanelWeight(array.astype(dtype, copy=False))
    return xp.asarray(np.ascontiguousarray(array, dtype=dtype))


@functools.cache
def panels_pay() -> bool:
    """Does this machine's BLAS multiply 2 rows faster by panels than by its own GEMM?
    Timed at the first load on this machine (_time_panels) and kept in
    cache_dir()/GEMM_ROWS_FILE by processor, cores, NumPy and BLAS, beside
    choose_gemm_rows's answers: later loads read it. OpenBLAS on x86 gains 2-3x on the
    2-core EPYC, 1.5x on the 2-core Xeon; another BLAS (Apple's Accelerate, MKL) may
    pick good code by itself.

    Why kept: timed anew in each process, the Xeon's small gain lost to noise in one
    load in ten or so, and a server so loaded took BLAS's path, without the helper
    processes, at two thirds of its speed
    (bench/results/2026-12-05-cpu-2core-slow-mode/).
    """
    key = "panels at 2 rows | " + machine_key(PANELS_PROBE_SHAPE)
    kept = kept_gemm_rows().get(key)
    if isinstance(kept, bool):
        return kept
    # a "no" is asked twice more: a busy spell can slow the panels' passes, and the
    # answer stays for every later load
    pays = any(_time_panels() for _ in range(3))
    keep_gemm_rows(key, pays)
    return pays


# the weight panels_pay times, (in, out): 32 MB, bigger than most caches
PANELS_PROBE_SHAPE = ((512, 16384),)


def _time_panels() -> bool:
    """The panels and the GEMM on 2 rows, in turn, the fastest of 7 passes each
    counting after 5 to warm up (about 80 ms in all): are the panels faster?"""
    w = np.full(PANELS_PROBE_SHAPE[0], 0.5, np.float32)  # the values do not matter
    x = np.full((2, 512), 0.5, np.float32)
    panels = PanelWeight(w)
    ways = {"panels": lambda: x @ panels, "gemm": lambda: x @ w}
    best = dict.fromkeys(ways, float("inf"))
    for turn in range(12):
        for name, work in ways.items():
            start = time.perf_counter()
            work()
            if turn >= 5:  # the first passes run slow, both ways (1.5-2x here)
                best[name] = min(best[name], time.perf_counter() - start)
    return best["panels"] < best["gemm"]


def choose_gemm_rows(weights: list) -> int:
    """From how many rows BLAS's GEMM beats the panels on this machine, for a step that
    multiplies by each of `weights` (PanelWeights) once. Whole steps of products are
    timed both ways, the panels first, the faster of three passes counting, at each row
    count of GEMM_ROW_CHOICES from the smallest up; the answer is the first count where
    the GEMM is faster by GEMM_MARGIN (GEMM_ROWS where it never is). Timed at a model's
    first load on this machine, with BLAS fitted to its load first (1.1-1.2 s for
    SmolLM2-135M on 2 cores), and kept in cache_dir()/GEMM_ROWS_FILE by processor,
    cores, NumPy, BLAS and shapes: later loads read it. MINIPAGED_GEMM_ROWS=N answers
    N untimed; deleting the file times again.

    Why whole steps: a step reads its weights from memory, and the GEMM packs (copies)
    them, which costs more there than on weights just read; and the panels' helper
    thread runs slow for its first 50-100 ms of work after an idle spell, or after a
    GEMM whose threads still spin on the cores it needs.
    """
    chosen = os.environ.get("MINIPAGED_GEMM_ROWS", "")
    if chosen:
        if not chosen.isdigit() or int(chosen) < 2:
            raise ValueError(
                f"MINIPAGED_GEMM_ROWS={chosen!r}: give a whole number of rows, 2 or"
                " more"
            )
        return int(chosen)
    shapes = tuple(w.shape for w in weights)
    seen = (shapes, helpers_now())  # with helpers the products split another way
    if seen not in _gemm_rows_seen:
        key = machine_key(shapes)
        rows = kept_gemm_rows().get(key)
        how = f"kept in {gemm_rows_file()}"
        if not isinstance(rows, int) or rows < 2:
            fit_blas_threads(samples=3)
            rows = _time_gemm_rows(weights)
            how = keep_gemm_rows(key, rows)
        _gemm_rows_seen[seen] = rows
        _gemm_rows_how[seen] = how
    return _gemm_rows_seen[seen]


# choose_gemm_rows's answers in this process, by the shapes it was given (and the
# helper processes running), and how each was had (gemm_rows_how)
_gemm_rows_seen: dict = {}
_gemm_rows_how: dict = {}
# where choose_gemm_rows keeps its answers between processes, in cache_dir()
GEMM_ROWS_FILE = "cpu-gemm-rows.json"
# the GEMM takes over where it is this much faster than the panels (a close call,
# where either is about as good, stays with the panels: a stray slow pass of the
# panels must not decide for every later load)
GEMM_MARGIN = 0.05


def gemm_rows_how(weights: list) -> str:
    """How choose_gemm_rows had its answer for these weights, in a few words."""
    if os.environ.get("MINIPAGED_GEMM_ROWS"):
        return "MINIPAGED_GEMM_ROWS"
    seen = (tuple(w.shape for w in weights), helpers_now())
    return _gemm_rows_how.get(seen, "not chosen yet")


def helpers_now() -> int:
    """Helper processes running now (start_team), 0 for none."""
    return 0 if _team is None else _team.helpers


def gemm_rows_file():
    from minipaged.model.offline import cache_dir

    return cache_dir() / GEMM_ROWS_FILE


def machine_key(shapes: tuple) -> str:
    """What the timing depends on: processor, cores, NumPy, BLAS and the shapes."""
    from threadpoolctl import threadpool_info

    blas = sorted(
        f"{pool.get('internal_api')} {pool.get('version')}"
        f" {pool.get('architecture', '')}".strip()
        for pool in threadpool_info()
        if pool["user_api"] == "blas"
    )
    return " | ".join(
        [
            processor_name(),
            f"{len(_usable_cores())} cores",
            f"numpy {np.__version__}",
            ", ".join(blas) or "no BLAS pool",
            f"{len(shapes)} weights {sorted(set(shapes))}",
        ]
        # with helper processes the products split another way: timed apart
        + ([f"{helpers_now()} helper processes"] if helpers_now() else [])
    )


def processor_name() -> str:
    """The processor's model name (Linux's /proc/cpuinfo), else what platform says."""
    import platform

    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown processor"


def kept_gemm_rows() -> dict:
    """The answers kept in the file ({} when there is none or it cannot be read)."""
    with contextlib.suppress(OSError, ValueError):
        kept = json.loads(gemm_rows_file().read_text())
        if isinstance(kept, dict):
            return kept
    return {}


def keep_gemm_rows(key: str, rows: int | bool) -> str:
    """Add an answer (rows, or panels_pay's yes or no) to the file (written whole, then
    renamed into place); say where it went, or that it could not be kept."""
    path = gemm_rows_file()
    spare = path.with_name(f"{path.name}.{os.getpid()}")
    kept = kept_gemm_rows() | {key: rows}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        spare.write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n")
        os.replace(spare, path)
    except OSError as error:
        with contextlib.suppress(OSError):
            spare.unlink()
        return f"timed at load (not kept: {error.strerror or error})"
    return f"timed at load, kept in {path}"


def _time_gemm_rows(weights: list) -> int:
    def step_seconds(rows: int) -> tuple[float, float]:
        """(panels, GEMM): the faster of three passes each, interleaved."""
        xs = {n: np.full((rows, n), 0.5, weights[0].dtype) for n in widths}
        passes = [
            (_seconds("panels", weights, xs), _seconds("gemm", weights, xs))
            for _ in range(3)
        ]
        return min(p for p, _ in passes), min(g for _, g in passes)

    widths = {w.shape[0] for w in weights}
    warm = {n: np.full((GEMM_ROW_CHOICES[0], n), 0.5, weights[0].dtype) for n in widths}
    _seconds("panels", weights, warm)  # a pass to wake the helper thread
    for rows in GEMM_ROW_CHOICES:
        panels, gemm = step_seconds(rows)
        if gemm < panels * (1 - GEMM_MARGIN):
            return rows
    return GEMM_ROWS


def _seconds(way: str, weights: list, xs: dict) -> float:
    """How long the products of x by `weights` take one way ("panels" or "gemm"), split
    over the helper processes where they run."""
    team = _team if _cores.now > 1 else None
    kind = {"panels": team_module().PANELS, "gemm": team_module().GEMM}[way]
    start = time.perf_counter()
    for w in weights:
        x = xs[w.shape[0]]
        if team is not None and w.shared:
            team.product(w, x, _cores.now, kind)
        elif way == "panels":
            w.by_panels(x)
        else:
            x @ w.dense()
    return time.perf_counter() - start


def _split(work, n: int, cores: int) -> None:
    """Runs work(lo, hi) over [0, n) in one piece per core: the others in a thread pool
    (NumPy releases the GIL inside BLAS), the first in this thread."""
    parts = min(cores, n)
    bounds = [n * i // parts for i in range(parts + 1)]
    futures = [_pool().submit(work, lo, hi) for lo, hi in zip(bounds[1:-1], bounds[2:])]
    work(bounds[0], bounds[1])
    for future in futures:
        future.result()


@functools.cache
def _pool():
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(
        max_workers=max(1, len(_usable_cores()) - 1), thread_name_prefix="panels"
    )
