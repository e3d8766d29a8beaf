"""The .cu files compile with NVRTC for sm_80 (A100) and sm_90 (H100, H200), on any
Linux or Windows machine (NVIDIA ships no NVRTC for a Mac), and the compiler's report
backs what the kernels' comments claim."""

import multiprocessing
import re
from concurrent.futures import ProcessPoolExecutor

import pytest

from minipaged.attention import kernels, nvrtc

# where the wheels exist, missing ones fail
if nvrtc.nvrtc is None and not nvrtc.WHEELS_EXIST:
    pytest.skip(
        "needs the nvrtc extra (Linux/Windows only): " + nvrtc.INSTALL,
        allow_module_level=True,
    )

ARCHS = ("sm_80", "sm_90")
GROUP_SIZES = (
    1,
    3,
    8,
)  # v5/v6 instances compiled here; a GPU compiles the one it needs


@pytest.fixture(scope="module")
def compiled():
    """Each (source, arch) compiled once. NVRTC holds the GIL, so two processes share
    the work."""
    jobs = {
        (source, arch): (path, kernels.kernel_names(source, GROUP_SIZES), arch)
        for source, path in kernels.SOURCES.items()
        for arch in ARCHS
    }
    with ProcessPoolExecutor(
        2, mp_context=multiprocessing.get_context("spawn")
    ) as pool:
        futures = {
            key: pool.submit(nvrtc.compile_cu, *job) for key, job in jobs.items()
        }
        # raises with NVRTC's log
        return {key: future.result() for key, future in futures.items()}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("source", sorted(kernels.SOURCES))
def test_every_kernel_compiles_without_warnings(compiled, source, arch):
    result = compiled[source, arch]
    assert sorted(result.kernels) == sorted(kernels.kernel_names(source, GROUP_SIZES))
    assert "warning" not in result.log, result.log


@pytest.mark.parametrize("arch", ARCHS)
def test_no_kernel_spills_registers(compiled, arch):
    spilled = {
        name: report.spill_bytes
        for source in kernels.SOURCES
        for name, report in compiled[source, arch].kernels.items()
        if report.spill_bytes
    }
    assert spilled == {}


def test_loads_are_16_bytes_wide_from_v2_on(compiled):
    """v1 reads K/V one element per instruction; v2 on (and prefill, of 16 int8 codes
    too) with 16-byte vector loads."""
    ptx = compiled["paged_attention", "sm_90"].ptx
    wide = {
        name: bool(re.search(r"ld\.global(\.nc)?\.v4\.", text))
        for name, text in ptx.items()
    }
    assert not any(
        wide[name] for name in wide if name.startswith("paged_attention_v1<")
    )
    prefills = [name for name in wide if re.match(r"paged_prefill(_int8)?<", name)]
    assert len(prefills) == 8 and all(wide[name] for name in prefills)
    assert all(
        wide[name] for name in wide if re.match(r"paged_attention_v[2-6]<", name)
    )


def test_a_compile_error_shows_nvrtcs_log(tmp_path):
    broken = tmp_path / "broken.cu"
    broken.write_text(
        "template <typename T> __global__ void k(T* x) { x[0] = undefined_name; }\n"
    )
    with pytest.raises(nvrtc.CompileError, match="undefined_name"):
        nvrtc.compile_cu(broken, ["k<float>"], "sm_90")


def test_v7_loads_its_int8_codes_8_bytes_at_a_time(compiled):
    """v7 reads K and V as 8 int8 codes per load instruction (one 8-byte vector), like
    fp16's lanes."""
    ptx = compiled["paged_attention", "sm_90"].ptx
    v7 = {
        name: text
        for name, text in ptx.items()
        if name.startswith("paged_attention_v7<")
    }
    assert v7 and all(
        re.search(r"ld\.global(\.nc)?\.(v4\.u16|v2\.u32|u64|v8\.u8)", text)
        for text in v7.values()
    )


def test_write_kv_int8_divides_exactly_and_rounds_half_to_even(compiled):
    """Its codes equal NumPy's bit for bit on a GPU too: x / scale is IEEE division
    (div.rn, not the approximate div.approx of fast math) and rintf rounds half to even
    (cvt.rni), as np.rint.
    """
    ptx = compiled["paged_attention", "sm_90"].ptx
    writes = {
        name: text for name, text in ptx.items() if name.startswith("write_kv_int8<")
    }
    assert len(writes) == 4
    for text in writes.values():
        assert re.search(r"div\.rn(\.ftz)?\.f32", text) and "div.approx" not in text
        assert re.search(r"cvt\.rni(\.ftz)?\.f32\.f32", text)
