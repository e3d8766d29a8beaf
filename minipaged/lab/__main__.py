"""`python -m minipaged.lab`: list the labs, or grade one (`check N my_file.py`), then watch the
participant's piece serve the model with the engine's own outputs beside it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from minipaged.lab.check import check
from minipaged.lab.labs import LABS
from minipaged.llm import CommandParser, number

EPILOG = """\
examples:
  cp labs/lab1_demand_paging.py my_paging.py      # then fill in the bodies
  python -m minipaged.lab check 1 my_paging.py
  python -m minipaged.lab check 1 --solution       # the engine's own code passes"""


def build_parser() -> CommandParser:
    parser = CommandParser(prog="python -m minipaged.lab", epilog=EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           description="Labs: write a piece of the engine yourself; a check grades it, "
                                       "then it serves the model.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("list", help="the labs, their starters and times")
    grade = sub.add_parser("check", help="grade a lab file, then run the engine with it")
    grade.add_argument("number", type=number(int, 1, len(LABS)), metavar="N", help="the lab's number")
    grade.add_argument("file", nargs="?", type=Path, help="your copy of the lab's starter")
    grade.add_argument("--solution", action="store_true", help="grade the engine's own code instead")
    grade.add_argument("--model", help="a model folder or hub id (default: SmolLM2-135M-Instruct; "
                                       "'random': a small random model)")
    grade.add_argument("--picture", type=Path, help="where to write the SVG frame map (default: labN_frames.svg)")
    grade.add_argument("--no-engine", action="store_true", help="grade the properties only")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "list":
        for lab in LABS.values():
            print(f"{lab.number}. {lab.title}  (labs/{lab.starter}, about {lab.minutes} min; needs {lab.needs})")
        return 0
    if (args.file is None) == (not args.solution):
        parser.error("check takes a file or --solution (one of them)")
    picture = args.picture or Path(f"lab{args.number}_frames.svg")
    try:
        return check(LABS[args.number], args.file, args.model, picture, engine=not args.no_engine)
    except BrokenPipeError:  # `| head`: stop quietly, as the chat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
