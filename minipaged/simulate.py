"""`python -m minipaged.simulate`: the simulator's command line. A door only: the code
lives in minipaged/tools/ (docs/reading.md), apart from the engine a student reads."""

import sys

if __name__ == "__main__":
    from minipaged.tools.simulate import main

    sys.exit(main())
