"""Time from pressing Enter to the first answer character in `python -m minipaged.chat`.

Drives the chat through a pseudo-terminal (pexpect), as a person would, for a few
messages of one conversation, and prints each latency and the median (the first includes
warm-up):

    .venv/bin/python scripts/chat_latency.py [--model FOLDER]
"""

import argparse
import statistics
import sys
import time

import pexpect

MESSAGES = [
    "What is the capital of France?",
    "Name three colors.",
    "What is 2+2?",
    "Tell me about paging in operating systems.",
    "Thanks!",
]

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default=None, help="default: the offline SmolLM2 folder"
    )
    args = parser.parse_args()
    if args.model is None:
        from minipaged.model.offline import offline_default_model

        args.model = str(offline_default_model())
    command = [
        "-m",
        "minipaged.chat",
        "--model",
        args.model,
        "--max-tokens",
        "48",
        "--temperature",
        "0",
    ]
    chat = pexpect.spawn(sys.executable, command, encoding="utf-8", timeout=300)
    chat.expect("you> ")
    latencies = []
    for message in MESSAGES:
        chat.sendline(message)
        start = time.perf_counter()
        chat.expect("assistant> ")
        chat.expect(r"\S")  # the first character of the answer
        latencies.append(time.perf_counter() - start)
        chat.expect("you> ")
    chat.sendeof()
    chat.expect(pexpect.EOF)
    print(
        "first answer character after Enter (s):",
        [round(t, 3) for t in latencies],
        "median",
        round(statistics.median(latencies), 3),
    )
