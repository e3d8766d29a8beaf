"""python -m minipaged.serve --help"""

import sys

from minipaged.serve.cli import main

sys.exit(main())
