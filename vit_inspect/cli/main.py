"""The command line, `vit-inspect` (or `python -m vit_inspect`): one subcommand per module of this package.

`analyze` prints one JSON object per image on its own line and writes figures under `--out`; `model`
prints one JSON object with the model-level (ViT Fig. 7) analyses; `heads`, `evaluate` and `compare`
likewise print JSON; `methods` lists the registered methods; `sanity` prints a table per image, or with
`--json` one JSON object per line. Progress goes to stderr (one line rewritten on a terminal, a line per update
elsewhere); an error is one line on stderr and a non-zero exit.
"""
from __future__ import annotations

import argparse
import sys

from vit_inspect.cli import analyze, compare, evaluate, heads, methods, model, sanity
from vit_inspect.cli.common import end_progress_line
from vit_inspect.core.errors import VitInspectError

# each adds its subcommand with `add_parser(sub)`
COMMANDS = (analyze, model, heads, evaluate, compare, sanity, methods)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vit-inspect", description="Look inside Vision Transformers.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (VitInspectError, ValueError, OSError) as exc:
        end_progress_line()
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
