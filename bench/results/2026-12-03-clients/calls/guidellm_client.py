"""guidellm's synthetic benchmark (`guidellm run`), as its users start it: concurrent
streams of synthetic prompts (64 tokens in, 16 out) against the server, for chat
completions at 8 and 16 streams and for completions and the Responses API at 8.
A run passes when every request succeeded (no errored, none incomplete)."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common import BASE, call

GUIDELLM = str(Path(sys.executable).parent / "guidellm")
TOKENIZER = os.environ.get(
    "TOKENIZER",
    str(Path.home() / ".cache/minipaged/SmolLM2-135M-Instruct-from-gguf-v1"),
)
OUT = Path(os.environ.get("GUIDELLM_OUT", tempfile.mkdtemp(prefix="guidellm-")))


def benchmark(streams: int, route: str, requests: int) -> dict:
    report = OUT / f"{route.strip('/').replace('/', '_')}-{streams}.json"
    done = subprocess.run(
        [
            GUIDELLM,
            "run",
            "--backend",
            f"kind=openai_http,target={BASE},request_format={route}",
            "--profile",
            f"kind=concurrent,streams={streams}",
            "--constraint",
            f"kind=max_requests,count={requests}",
            "--data",
            "kind=synthetic_text,prompt_tokens=64,output_tokens=16",
            "--tokenizer",
            f"kind=huggingface_auto,model={TOKENIZER}",
            "--output",
            f"kind=json,path={report}",
            "--disable-console-interactive",
        ],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if done.returncode != 0:
        raise RuntimeError(f"rc={done.returncode}: {done.stderr.strip()[-400:]}")
    state = json.loads(report.read_text())["benchmarks"][0]["scheduler_state"]
    counts = {
        key: state[key]
        for key in ("successful_requests", "errored_requests", "cancelled_requests")
    }
    assert (
        counts["successful_requests"] == requests and not counts["errored_requests"]
    ), counts
    return counts


for streams, route, requests in (
    (8, "/v1/chat/completions", 16),
    (16, "/v1/chat/completions", 32),
    (8, "/v1/completions", 16),
    (8, "/v1/responses", 16),
):

    @call(f"run concurrent@{streams} {route} ({requests} requests)")
    def _(streams=streams, route=route, requests=requests):
        return benchmark(streams, route, requests)
