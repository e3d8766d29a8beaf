"""`python -m minipaged.bench {decode,memory,kernel,throughput,sharing} [--json]`.

Each benchmark is a function `bench_<name>(args) -> dict` registered with @command; it prints
a human summary itself (unless args.json) and returns the dict that --json prints.
"""

from __future__ import annotations

import argparse
import json
import sys

COMMANDS = {}  # name -> (function, add_arguments, help)


def command(name, help, add_arguments=lambda parser: None):
    """Register a benchmark: @command("decode", help=..., add_arguments=...) over bench_decode."""
    def register(fn):
        COMMANDS[name] = (fn, add_arguments, help)
        return fn
    return register


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minipaged.bench", description=__doc__)
    sub = parser.add_subparsers(dest="name", required=True)
    for name, (fn, add_arguments, help) in COMMANDS.items():
        p = sub.add_parser(name, help=help, description=help)
        p.add_argument("--json", action="store_true", help="print the result as one JSON document")
        add_arguments(p)
    args = parser.parse_args(argv)
    fn = COMMANDS[args.name][0]
    result = fn(args)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
