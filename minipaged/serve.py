"""`python -m minipaged.serve`: the OpenAI-compatible server and its dashboard. A door
only: the code lives in
minipaged/tools/ (docs/reading.md), apart from the engine a student reads."""

import sys

if __name__ == "__main__":
    from minipaged.tools.serve.cli import main

    sys.exit(main())
