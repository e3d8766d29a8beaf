"""`python -m minipaged.chat`: talk to the model in a terminal, answers streamed token by token.

Each turn is rendered with the model's chat template over the whole conversation so far and
streamed through `LLM.stream`. Reads one message per line when standard input is a pipe, so
`echo "What is the capital of France?" | python -m minipaged.chat` works in scripts and tests.
"""

from __future__ import annotations

import argparse
import sys

from minipaged.engine import LLM
from minipaged.sampling import SamplingParams


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m minipaged.chat", description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="hub id or local folder (default: SmolLM2-135M-Instruct, offline-capable)")
    p.add_argument("--device", default=None, choices=["cpu", "cuda"], help="default: cuda when usable")
    p.add_argument("--max-tokens", type=int, default=256, help="longest answer, in tokens (default 256)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); higher = more varied")
    p.add_argument("--top-p", type=float, default=0.9, help="nucleus sampling mass when temperature > 0")
    p.add_argument("--seed", type=int, default=None, help="make sampled answers reproducible")
    p.add_argument("--system", default=None, help="system prompt (default: the model's own)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p,
                            max_tokens=args.max_tokens, seed=args.seed)
    interactive = sys.stdin.isatty()
    print("loading model...", file=sys.stderr, flush=True)
    llm = LLM(args.model, device=args.device)
    print(f"{llm.model_name} ready on {llm.device} in {llm.load_seconds:.1f} s. "
          + ("Type a message; Ctrl-D quits." if interactive else ""), file=sys.stderr, flush=True)
    history = [{"role": "system", "content": args.system}] if args.system else []
    while True:
        try:
            line = input("you> " if interactive else "")
        except EOFError:
            break
        if not line.strip():
            continue
        history.append({"role": "user", "content": line})
        prompt = {"prompt_token_ids": llm.tokenizer.encode_chat(history)}
        print("assistant> " if interactive else "", end="", flush=True)
        answer = ""
        try:
            for piece in llm.stream(prompt, params):
                answer += piece
                print(piece, end="", flush=True)
        except ValueError as error:  # e.g. the conversation outgrew the context
            print(f"[not answered: {error}]", flush=True)
            history.pop()
            continue
        print(flush=True)
        history.append({"role": "assistant", "content": answer})
    return 0


if __name__ == "__main__":
    sys.exit(main())
