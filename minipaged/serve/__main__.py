"""`python -m minipaged.serve`: the server's command line (cli.py); `--help` lists its options.
"""

import sys

from minipaged.serve.cli import main

sys.exit(main())
