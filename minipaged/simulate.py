"""`python -m minipaged.simulate`: the real scheduler on a virtual clock (minipaged.bench.simulate)."""

from minipaged.bench.simulate import build_parser, main

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    raise SystemExit(main())
