"""`python -m minipaged.bench NAME [--json]`: the benchmarks' command line.

The registry of benchmarks and the parser are in minipaged.bench.cli.
"""

import sys

from minipaged.bench.cli import main

sys.exit(main())
