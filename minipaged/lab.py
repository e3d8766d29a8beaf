"""`python -m minipaged.lab`: the labs' checker and hints. A door only: the code lives
in minipaged/tools/ (docs/reading.md), apart from the engine a student reads."""

import sys

if __name__ == "__main__":
    from minipaged.tools.lab.cli import main

    sys.exit(main())
