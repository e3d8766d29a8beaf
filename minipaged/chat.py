"""`python -m minipaged.chat`: the chat in a terminal. A door only: the code lives in
minipaged/tools/ (docs/reading.md), apart from the engine a student reads."""

import sys

if __name__ == "__main__":
    from minipaged.tools.chat import main

    sys.exit(main())
