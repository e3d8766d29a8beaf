"""What the five doors (`python -m minipaged.chat`, serve, bench, lab, simulate) share:
Ctrl-C ends a command as a shell's own commands end, with one line on stderr and exit
code 130 (128 + SIGINT), never a KeyboardInterrupt traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

# what a shell reports for a command that Ctrl-C ended: 128 + SIGINT (2)
INTERRUPTED = 130


@contextmanager
def ctrl_c_ends_quietly() -> Iterator[None]:
    """Run a command inside: a KeyboardInterrupt that reaches here (Ctrl-C while it
    loads, works or waits) prints one line and exits with code 130. A command that
    handles Ctrl-C itself (the chat stops an answer; the server shuts down) still
    does."""
    try:
        yield
    except KeyboardInterrupt:
        # a fresh line first: the terminal echoed ^C where the output stood
        print("\nstopped (Ctrl-C)", file=sys.stderr, flush=True)
        sys.exit(INTERRUPTED)
