"""The command line, `vit-inspect` (or `python -m vit_inspect`): one subcommand per module of this package.

`analyze` prints one JSON object per image on its own line and writes figures under `--out`; `model`
prints one JSON object with the model-level (ViT Fig. 7) analyses; `heads`, `evaluate` and `compare`
likewise print JSON; `concepts` prints a table of one image's concepts, or with `--json` one JSON object;
`methods` lists the registered methods; `sanity` prints a table per image, or with `--json` one JSON object per
line. Progress goes to stderr (one line rewritten on a terminal, a line per update
elsewhere); an error is one line on stderr and a non-zero exit. An image too small for the model to see more than
a blur of it (`core.geometry.enlarged_blur`) is analysed, with a "warning:" line on stderr.
"""
from __future__ import annotations

import argparse
import sys
import warnings

from vit_inspect.cli import analyze, compare, concepts, evaluate, heads, methods, model, sae, sanity
from vit_inspect.cli.common import end_progress_line
from vit_inspect.core.errors import SmallImageWarning, VitInspectError

# each adds its subcommand with `add_parser(sub)`
COMMANDS = (analyze, model, heads, evaluate, compare, sanity, methods, concepts, sae)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vit-inspect", description="Look inside Vision Transformers.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def warning_lines(shown):
    """A `warnings.showwarning` printing a `SmallImageWarning` as one "warning: ..." line on stderr (as an error
    is one "error: ..." line), and passing every other warning to ``shown``."""
    def show(message, category, *rest, **kwargs):
        if issubclass(category, SmallImageWarning):
            print(f"warning: {message}", file=sys.stderr, flush=True)
        else:
            shown(message, category, *rest, **kwargs)
    return show


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with warnings.catch_warnings():
        warnings.simplefilter("always", SmallImageWarning)  # one line for every small image, not the first only
        warnings.showwarning = warning_lines(warnings.showwarning)
        try:
            args.func(args)
        except (VitInspectError, ValueError, OSError) as exc:
            end_progress_line()
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
