"""python -m minipaged.bench kernel without a GPU: a clear message, not a traceback."""

import pytest

from minipaged.backend import cuda_available
from minipaged.tools.bench import cli as bench_cli


@pytest.mark.skipif(
    cuda_available(), reason="this machine has a GPU: the benchmark would run"
)
def test_the_kernel_benchmark_says_it_needs_a_cuda_device():
    with pytest.raises(
        SystemExit, match="needs a CUDA device.*minipaged.attention.emulated"
    ):
        bench_cli.main(["kernel", "--json"])
