"""The CUDA kernels themselves, run on the CPU through cuda/emulate/cuda_shim.h, against
the NumPy reference: every decode version, prefill, write_kv and copy_blocks, and over
an 8-bit cache (kv_cache_dtype "int8") write_kv_int8, paged_prefill_int8 and decode v7.

Caches hold NaN in every slot no sequence owns and in a frame on either side, so a
kernel that reads past a context or through a -1 entry of a block table fails here."""

import numpy as np
import pytest

from minipaged.attention import emulated, kernels, reference
from minipaged.attention.testing import assert_matches, edge_context_lens, random_batch

# (block_size, q_per_kv, head_dim, dtype): every block size, GQA 1/3/8, both head sizes
# and dtypes; fp16 makes each 16-byte load 8 elements wide, so it changes the lane
# layout.
CASES = [
    (8, 1, 64, np.float32),
    (16, 3, 64, np.float32),
    (32, 8, 128, np.float32),
    (16, 1, 128, np.float32),
    (8, 3, 128, np.float32),
    (32, 3, 64, np.float16),
    (8, 8, 64, np.float16),
    (16, 3, 128, np.float16),
]


def decode_both(batch, **options):
    return emulated.decode(*batch.args(), **options), reference.decode(*batch.args())


@pytest.mark.parametrize("version", kernels.VERSIONS)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_decode_matches_reference(version, case):
    block_size, q_per_kv, head_dim, dtype = CASES[case]
    rng = np.random.default_rng(100 * case + version)
    batch = random_batch(
        rng,
        edge_context_lens(rng, block_size),
        num_kv_heads=2,
        q_per_kv=q_per_kv,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
    )
    # v6 with partitions that end inside frames, several per sequence
    out, expected = decode_both(
        batch, version=version, partition_size=2 * block_size - 3
    )
    assert_matches(out, expected)


@pytest.mark.parametrize("partition_size", [1, 7, 32, kernels.PARTITION_SIZE])
def test_v6_merges_any_number_of_partitions(partition_size):
    rng = np.random.default_rng(partition_size)
    batch = random_batch(
        rng, [70, 33, 1], num_kv_heads=1, q_per_kv=3, head_dim=64, block_size=16
    )
    out, expected = decode_both(batch, version=6, partition_size=partition_size)
    assert_matches(out, expected)


def test_default_version_follows_the_rule():
    rng = np.random.default_rng(0)
    batch = random_batch(
        rng, [1500, 20], num_kv_heads=1, q_per_kv=3, head_dim=64, block_size=32
    )
    out, expected = decode_both(batch)  # 2 blocks of v5 < 132 SMs, > 2 partitions: v6
    assert_matches(out, expected)


def test_pick_version():
    assert kernels.pick_version(64, 8, 4, 4096, num_sms=132) == 5  # the GPU is full
    assert kernels.pick_version(2, 8, 4, 4096, num_sms=132) == 6  # few sequences, long
    assert kernels.pick_version(2, 8, 4, 512, num_sms=132) == 5  # short: no split
    assert kernels.pick_version(2, 1, 16, 4096, num_sms=132) == 4  # group > 8 heads


@pytest.mark.parametrize("case", range(0, len(CASES), 2))
def test_prefill_matches_reference(case):
    """A whole prompt, a one-token prompt, a prompt after a prefix-cache hit that starts
    inside a frame, and a chunk of a longer prompt whose keys span several shared-memory
    tiles.
    """
    block_size, q_per_kv, head_dim, dtype = CASES[case]
    rng = np.random.default_rng(case)
    context_lens = [2 * block_size + 5, 1, 3 * block_size + 2, 75]
    query_lens = [2 * block_size + 5, 1, block_size + 2, 9]
    batch = random_batch(
        rng,
        context_lens,
        query_lens,
        num_kv_heads=2,
        q_per_kv=q_per_kv,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
        share_prefix=False,
    )
    args = batch.args(prefill=True)
    assert_matches(emulated.prefill(*args), reference.prefill(*args))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_write_kv_matches_reference(dtype):
    rng = np.random.default_rng(0)
    k_cache, v_cache = rng.standard_normal((2, 9, 16, 2, 64)).astype(dtype)
    caches = [(k_cache.copy(), v_cache.copy()) for _ in range(2)]  # one for each side
    k, v = rng.standard_normal((2, 20, 2, 64)).astype(dtype)
    slot_mapping = rng.permutation(9 * 16)[:20].astype(np.int32)
    slot_mapping[[3, 11]] = -1  # padding tokens
    emulated.write_kv(k, v, *caches[0], slot_mapping)
    reference.write_kv(k, v, *caches[1], slot_mapping)
    np.testing.assert_array_equal(caches[0], caches[1])
    assert not np.array_equal(caches[0][0], k_cache)  # something was written


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_copy_blocks_matches_reference(dtype):
    rng = np.random.default_rng(0)
    k_cache, v_cache = rng.standard_normal((2, 9, 8, 3, 128)).astype(dtype)
    caches = [(k_cache.copy(), v_cache.copy()) for _ in range(2)]
    pairs = np.array([(4, 0), (4, 7), (1, 2)], np.int32)  # one src, two copies
    emulated.copy_blocks(*caches[0], pairs)
    reference.copy_blocks(*caches[1], pairs)
    np.testing.assert_array_equal(caches[0], caches[1])
    assert not np.array_equal(caches[0][0], k_cache)


# ---- an 8-bit cache (kv_cache_dtype "int8"): codes and a float16 scale per (slot, KV
# head) ------


def coded_cache(batch) -> tuple[list[np.ndarray], dict]:
    """The batch's K/V written by reference.write_kv into an int8 cache of its shape:
    (codes for K and V, {"k_scales", "v_scales"}). Every slot no sequence owns, and a
    frame on either side of
    the cache, has a NaN scale, so a kernel that reads one returns NaN."""
    shape = batch.k_cache.shape
    codes = [np.zeros((shape[0] + 2, *shape[1:]), np.int8)[1:-1] for _ in range(2)]
    scales = [
        np.full((shape[0] + 2, *shape[1:3]), np.nan, np.float16)[1:-1] for _ in range(2)
    ]
    block_size = shape[1]
    for i, n in enumerate(batch.context_lens):
        positions = np.arange(n)
        slots = (
            batch.block_tables[i, positions // block_size] * block_size
            + positions % block_size
        )
        reference.write_kv(batch.keys[i], batch.values[i], *codes, slots, *scales)
    return codes, {"k_scales": scales[0], "v_scales": scales[1]}


def rows_to_code(
    rng, num_tokens: int, num_kv_heads: int, head_dim: int, dtype
) -> np.ndarray:
    """K or V rows (num_tokens, kvh, head_dim) that test the coding's corners:
    magnitudes from 1e-3 (a subnormal float16 scale) to 300, a row of zeros (scale 0),
    and a row whose scale is exactly 1/8 in float16 with values at code + 0.5, which
    rint rounds to the even code.
    """
    rows = rng.standard_normal((num_tokens, num_kv_heads, head_dim))
    rows *= 10.0 ** rng.uniform(-3, 2.5, (num_tokens, num_kv_heads, 1))
    rows[1, 0] = 0.0
    halves = rng.integers(-120, 120, head_dim) + 0.5  # x / scale = k + 0.5
    halves[0] = 127.0  # the row's max: scale 1/8
    rows[2, -1] = halves / 8
    return rows.astype(dtype)


@pytest.mark.parametrize(
    "dtype, head_dim, num_kv_heads",
    [
        (np.float32, 64, 3),
        (np.float16, 128, 2),
        (np.float16, 64, 5),
        (np.float32, 128, 1),
    ],
)
def test_write_kv_int8_codes_as_the_reference_bit_for_bit(
    dtype, head_dim, num_kv_heads
):
    """Codes and scales equal reference.write_coded's exactly; -1 slots and slots not
    written keep what they held (NaN scales, code 99)."""
    rng = np.random.default_rng(head_dim + num_kv_heads)
    k, v = (rows_to_code(rng, 24, num_kv_heads, head_dim, dtype) for _ in range(2))
    shape = (7, 8, num_kv_heads, head_dim)
    slot_mapping = rng.permutation(7 * 8)[:24].astype(np.int32)
    slot_mapping[[5, 17]] = -1  # padding tokens
    # one a side
    caches = [[np.full(shape, 99, np.int8) for _ in range(2)] for _ in range(2)]
    scales = [
        [np.full(shape[:3], np.nan, np.float16) for _ in range(2)] for _ in range(2)
    ]
    emulated.write_kv(k, v, *caches[0], slot_mapping, *scales[0])
    reference.write_kv(k, v, *caches[1], slot_mapping, *scales[1])
    np.testing.assert_array_equal(caches[0], caches[1])
    np.testing.assert_array_equal(scales[0], scales[1])  # NaN where nothing was written
    written = slot_mapping[slot_mapping >= 0]
    codes = caches[0][0].reshape(-1, num_kv_heads, head_dim)
    assert not (codes[written] == 99).all(axis=-1).any()  # every row was written
    assert (codes[slot_mapping[1], 0] == 0).all()  # a row of zeros: codes 0
    assert scales[0][0].reshape(-1, num_kv_heads)[slot_mapping[1], 0] == 0
    halves = codes[slot_mapping[2], -1][1:]  # k + 0.5 rounds to even
    assert (halves % 2 == 0).all() and len(np.unique(halves)) > 10


@pytest.mark.parametrize("case", range(len(CASES)))
def test_prefill_int8_matches_the_8bit_reference(case):
    """Over an int8 cache: whole prompts, a one-token prompt, a prompt after a
    prefix-cache hit that starts inside a frame, a chunk whose keys span several
    shared-memory tiles; GQA groups
    1/3/8, head_dim 64/128, block sizes 8/16/32, float32 and float16 queries."""
    block_size, q_per_kv, head_dim, dtype = CASES[case]
    rng = np.random.default_rng(case)
    context_lens = [2 * block_size + 5, 1, 3 * block_size + 2, 75]
    query_lens = [2 * block_size + 5, 1, block_size + 2, 9]
    batch = random_batch(
        rng,
        context_lens,
        query_lens,
        num_kv_heads=2,
        q_per_kv=q_per_kv,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
        share_prefix=False,
    )
    codes, scales = coded_cache(batch)
    args = (
        batch.q,
        *codes,
        batch.block_tables,
        batch.context_lens,
        batch.query_start_loc,
        batch.scale,
    )
    out = emulated.prefill(*args, **scales, codec="int8" if case % 2 else None)
    assert_matches(out, reference.prefill(*args, **scales))
    full = reference.prefill(*batch.args(prefill=True))  # the codes are 8 bits:
    # close, not equal
    assert 0 < np.abs(out.astype(np.float32) - full.astype(np.float32)).max() < 0.05


@pytest.mark.parametrize("case", range(0, len(CASES), 2))
def test_decode_v7_matches_the_8bit_reference(case):
    """v7 through the launcher's codec door, on the decode cases' edges of frames."""
    block_size, q_per_kv, head_dim, dtype = CASES[case]
    rng = np.random.default_rng(10 + case)
    batch = random_batch(
        rng,
        edge_context_lens(rng, block_size, long=5),
        num_kv_heads=2,
        q_per_kv=q_per_kv,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
    )
    codes, scales = coded_cache(batch)
    args = (batch.q, *codes, batch.block_tables, batch.context_lens, batch.scale)
    assert_matches(
        emulated.decode(*args, **scales, codec="int8"),
        reference.decode(*args, **scales),
    )


def test_the_int8_kernels_chain_as_the_engine_runs_them():
    """write_kv_int8 codes a prompt, paged_prefill_int8 and v7 read those codes: the
    same outputs as the reference doing all three."""
    rng = np.random.default_rng(7)
    batch = random_batch(
        rng,
        [40, 17],
        [40, 17],
        num_kv_heads=2,
        q_per_kv=3,
        head_dim=64,
        block_size=16,
        dtype=np.float16,
        share_prefix=False,
    )
    slots = np.concatenate(
        [
            batch.block_tables[i, np.arange(n) // 16] * 16 + np.arange(n) % 16
            for i, n in enumerate(batch.context_lens)
        ]
    ).astype(np.int32)
    k, v = np.concatenate(batch.keys), np.concatenate(batch.values)
    sides = []
    for attention in (emulated, reference):
        codes = [np.zeros(batch.k_cache.shape, np.int8) for _ in range(2)]
        scales = {
            name: np.zeros(batch.k_cache.shape[:3], np.float16)
            for name in ("k_scales", "v_scales")
        }
        attention.write_kv(k, v, *codes, slots, **scales)
        tables = (batch.block_tables, batch.context_lens)
        sides.append(
            (
                attention.prefill(
                    batch.q,
                    *codes,
                    *tables,
                    batch.query_start_loc,
                    batch.scale,
                    **scales,
                ),
                attention.decode(
                    batch.q[[39, 56]], *codes, *tables, batch.scale, **scales
                ),
            )
        )
    for out, expected in zip(*sides):
        assert_matches(out, expected)


def test_the_int8_kernels_drive_the_model_as_the_8bit_reference_does(tmp_path):
    """kv_cache_dtype "int8" through the emulated kernels (write_kv_int8,
    paged_prefill_int8, v7) and through the NumPy reference: the same bytes in the cache
    after a prefill and 5 decode steps (forked, with a copy-on-write), and the same
    greedy tokens: the GPU's 8-bit path minus the GPU."""
    from checkpoints import write_checkpoint

    from minipaged.model import Model
    from minipaged.paging import BlockManager, KVCache, MemoryMoves
    from minipaged.runner import ModelRunner, step_inputs

    model = Model.from_folder(
        write_checkpoint(tmp_path, hidden=192, heads=3, kv_heads=1, layers=2)
    )
    c, prompts = (
        model.config,
        [
            [1, 5, 9, 13, 17, 21, 25, 29, 33],
            [1, 40],
            [7],
        ],
    )  # head_dim 64, GQA 3
    sides = []
    for attention in (emulated, reference):
        manager = BlockManager(32, 4)
        kv = KVCache(
            c.num_layers, 32, c.num_kv_heads, c.head_dim, 4, dtype=np.int8, device="cpu"
        )
        runner = ModelRunner(model, kv, manager, attention)
        for i, prompt in enumerate(prompts):
            manager.allocate(i, prompt)
        logits = runner.run(
            step_inputs(
                manager, [0, 1, 2], [len(p) for p in prompts], token_ids=prompts
            )
        )
        outs = {i: [int(row.argmax())] for i, row in enumerate(logits)}
        manager.fork(1, 3)  # shares prompt 1's half-full frame
        outs[3] = list(outs[1])
        for _ in range(5):
            copies = [
                cow for i in outs if (cow := manager.append_slot(i, outs[i][-1])[1])
            ]
            runner.move(MemoryMoves(copies=copies))
            logits = runner.run(
                step_inputs(
                    manager,
                    list(outs),
                    [1] * 4,
                    token_ids=[[outs[i][-1]] for i in outs],
                )
            )
            for i, row in zip(list(outs), logits):
                outs[i].append(int(row.argmax()))
        sides.append((outs, kv.data.copy(), kv.scales.copy()))
    (outs, codes, scales), (expected, expected_codes, expected_scales) = sides
    assert outs == expected and outs[3] == outs[1]
    np.testing.assert_array_equal(codes, expected_codes)
    np.testing.assert_array_equal(scales, expected_scales)
    # rows written: 12 of the prompts, 5 x 4 decoded, 2 in the copy of [1, 40]'s frame
    # (CoW)
    assert (scales > 0).sum() == 2 * c.num_layers * c.num_kv_heads * (12 + 5 * 4 + 2)


@pytest.mark.parametrize(
    "codec",
    [
        "fp8",
        type("FP8", (), {"name": "fp8"})(),
        type("Mine", (), {"name": "my_int4"})(),
    ],
)
def test_the_int8_kernels_refuse_other_codecs(codec):
    """fp8 (by name or object) and a codec of one's own are refused with a sentence, not
    run as int8; scales that are not the cache's own float16 arrays too (a copy would be
    written).
    """
    rng = np.random.default_rng(0)
    batch = random_batch(
        rng, [5], [5], num_kv_heads=1, q_per_kv=1, head_dim=64, block_size=8
    )
    codes, scales = coded_cache(batch)
    args = (batch.q, *codes, batch.block_tables, batch.context_lens)
    with pytest.raises(
        ValueError, match="read int8 codes only; kv_cache_dtype=.* runs on the CPU"
    ):
        emulated.prefill(
            *args, batch.query_start_loc, batch.scale, **scales, codec=codec
        )
    with pytest.raises(ValueError, match="read int8 codes only"):
        emulated.decode(*args, batch.scale, **scales, codec=codec)
    with pytest.raises(ValueError, match="read int8 codes only"):
        emulated.write_kv(
            batch.keys[0], batch.values[0], *codes, np.arange(5), **scales, codec=codec
        )
    with pytest.raises(ValueError, match="must be contiguous float16"):
        emulated.write_kv(
            batch.keys[0],
            batch.values[0],
            *codes,
            np.arange(5),
            scales["k_scales"].astype(np.float32),
            scales["v_scales"],
        )


def test_mistakes_are_explained():
    rng = np.random.default_rng(0)
    batch = random_batch(
        rng, [5], num_kv_heads=1, q_per_kv=16, head_dim=64, block_size=8
    )
    args = batch.args()
    with pytest.raises(ValueError, match="5 and 6 take up to 8"):
        emulated.decode(*args, version=5)
    with pytest.raises(ValueError, match="q is float16 but the cache is float32"):
        emulated.decode(batch.q.astype(np.float16), *args[1:])
    with pytest.raises(RuntimeError, match="the arguments passed do not match"):
        emulated.LAUNCHER.launch("write_kv<float>", (1,), (128,), (batch.k_cache,))


def test_the_emulator_runs_threads_in_a_shuffled_order_so_a_missing_barrier_shows(
    tmp_path,
):
    source = tmp_path / "neighbours.cu"
    source.write_text("""
    template <typename T>
    __global__ void neighbours(T* out, int launch, int barrier) {
        __shared__ T values[64];
        values[threadIdx.x] = 100 * launch + threadIdx.x;
        if (barrier) __syncthreads();
        out[threadIdx.x] = values[(threadIdx.x + 1) % 64];   // a neighbour's value
    }""")
    compiled = emulated.library(source, ("neighbours<float>",))
    for launch, barrier in enumerate((1, 0, 1)):
        out = np.full(64, -1, np.float32)
        emulated.launch_on(
            compiled,
            "neighbours<float>",
            (1,),
            (64,),
            (out, np.int32(launch), np.int32(barrier)),
        )
        expected = 100 * launch + (np.arange(64) + 1) % 64
        assert np.array_equal(out, expected) == bool(barrier)


def test_the_emulator_reports_a_shuffle_that_part_of_a_warp_skips(tmp_path):
    source = tmp_path / "divergent.cu"
    source.write_text("""
    template <typename T>
    __global__ void divergent(T* x) {
        if (threadIdx.x < 16) \
x[threadIdx.x] = __shfl_xor_sync(0xffffffffu, x[threadIdx.x], 1);
    }""")
    compiled = emulated.library(source, ("divergent<float>",))
    with pytest.raises(RuntimeError, match="deadlock"):
        emulated.launch_on(
            compiled, "divergent<float>", (1,), (32,), (np.zeros(32, np.float32),)
        )
