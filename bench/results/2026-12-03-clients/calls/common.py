"""What every client's script shares (standard library only: each runs in its own
library's venv): the server's address, and `call`, which runs one typical call and
prints one JSON line: the library, the call, ok or the error, and what came back."""

import json
import os
import sys
import time
import traceback

BASE = os.environ.get("BASE", "http://127.0.0.1:8000")
MODEL = os.environ.get("MODEL", "HuggingFaceTB/SmolLM2-135M-Instruct")
LIB = os.path.basename(sys.argv[0]).removesuffix(".py")


def call(name):
    """Decorator: run the function now; its return value is what came back (shown
    cut short), an exception is the failure."""

    def run(fn):
        started = time.monotonic()
        try:
            got = fn()
            line = {"ok": True, "got": repr(got)[:300]}
        except Exception as error:  # noqa: BLE001 - every failure is a result
            last = traceback.extract_tb(error.__traceback__)[-1]
            line = {
                "ok": False,
                "error": f"{type(error).__name__}: {str(error)[:400]}",
                "where": f"{os.path.basename(last.filename)}:{last.lineno}",
            }
        line = {
            "lib": LIB,
            "call": name,
            "s": round(time.monotonic() - started, 1),
        } | line
        print(json.dumps(line), flush=True)
        return fn

    return run
