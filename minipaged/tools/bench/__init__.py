"""Benchmarks: what the vLLM paper measures, on this machine (`python -m minipaged.bench
NAME`).

One module per benchmark (decode, memory, kernel, throughput, sharing, serve; paper:
fragmentation and chunked; latency: latency and calibrate), what they share in
common.py, the command line in cli.py, the synthetic workloads in workload.py and the
simulator in simulate.py.
"""
