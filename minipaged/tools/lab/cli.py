"""`python -m minipaged.lab`: list the labs, show a lab's next hint (`hint N`), or grade
one (`check N my_file.py`), then watch the participant's piece serve the model beside
the engine's.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from minipaged.llm import CommandParser, number
from minipaged.tools.lab import hints
from minipaged.tools.lab.check import check
from minipaged.tools.lab.labs import LABS, LABS_DIR

EPILOG = """\
examples (in the repository, after `source .venv/bin/activate`):
  cp labs/lab1_demand_paging.py my_paging.py      # then fill in the bodies
  python -m minipaged.lab check 1 my_paging.py
  python -m minipaged.lab hint 1                   # the next hint; \
again for the one after
  python -m minipaged.lab check 1 --solution       # the engine's own code passes"""
PICTURES = LABS_DIR / "pictures"


def build_parser() -> CommandParser:
    parser = CommandParser(
        prog="python -m minipaged.lab",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Labs: write a piece of the engine yourself; a check grades it, "
            "then it serves the model."
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("list", help="the labs, their meetings, starters and times")
    hint = sub.add_parser(
        "hint",
        help="the next hint of a lab (run again for the next, more concrete one)",
    )
    hint.add_argument(
        "number", type=number(int, 1, len(LABS)), metavar="N", help="the lab's number"
    )
    hint.add_argument(
        "which",
        nargs="?",
        type=number(int, 1),
        metavar="K",
        help="show hint K instead of the next",
    )
    hint.add_argument("--reset", action="store_true", help="start the lab's hints over")
    grade = sub.add_parser(
        "check", help="grade a lab file, then run the engine with it"
    )
    grade.add_argument(
        "number", type=number(int, 1, len(LABS)), metavar="N", help="the lab's number"
    )
    grade.add_argument(
        "file", nargs="?", type=Path, help="your copy of the lab's starter"
    )
    grade.add_argument(
        "--solution", action="store_true", help="grade the engine's own code instead"
    )
    grade.add_argument(
        "--model",
        help=(
            "a model folder or hub id (default: SmolLM2-135M-Instruct; "
            "'random': a small random model)"
        ),
    )
    grade.add_argument(
        "--pictures",
        type=Path,
        default=PICTURES,
        metavar="DIR",
        help="the folder the check writes its pictures in (default: labs/pictures)",
    )
    grade.add_argument(
        "--no-engine", action="store_true", help="grade the properties only"
    )
    grade.add_argument(
        "--time-limit",
        type=number(int, 1, 600),
        metavar="S",
        help="each property's time limit in seconds (default: the lab's, 10 s)",
    )
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "list":
        for lab in LABS.values():
            print(
                f"{lab.number}. {lab.title}  (meeting {lab.meeting};"
                f" labs/{lab.starter}, about {lab.minutes} min; needs {lab.needs})"
            )
        return 0
    if args.command == "hint":
        if args.reset and args.which is not None:
            parser.error("hint takes K or --reset, not both")
        try:
            print(*hints.show(LABS[args.number], args.which, args.reset), sep="\n")
        except ValueError as error:
            parser.error(str(error))
        return 0
    if (args.file is None) == (not args.solution):
        parser.error("check takes a file or --solution (one of them)")
    try:
        lab = LABS[args.number]
        if args.time_limit:
            lab = dataclasses.replace(lab, seconds=args.time_limit)
        return check(
            lab, args.file, args.model, args.pictures, engine=not args.no_engine
        )
    except BrokenPipeError:  # `| head`: stop quietly, as the chat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
