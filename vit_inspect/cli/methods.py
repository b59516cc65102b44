"""`vit-inspect methods`: every registered method (`vit_inspect.methods`) with its paper, unit and cost in
passes, and whether the faithfulness and sanity studies score it; plugins that failed to load, with why.
With `--json` one JSON object: `methods` (name -> title, paper, unit, reads, forwards, backwards, cost,
faithfulness, sanity, record, signed, relu, cmap, time_limit_s) and `failed_plugins` (entry point -> sentence)."""
from __future__ import annotations

import argparse
import json

from vit_inspect.methods import Method, methods, plugin_failures


def add_parser(sub) -> None:
    parser = sub.add_parser("methods", help="list the registered methods: paper, unit, cost, what scores them")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    parser.set_defaults(func=run)


def method_entry(method: Method) -> dict:
    return {"title": method.title, "paper": method.paper, "unit": method.unit, "reads": method.reads,
            "forwards": method.forwards, "backwards": method.backwards, "cost": method.cost(),
            "faithfulness": method.faithfulness, "sanity": method.sanity, "record": method.record,
            "signed": method.signed, "relu": method.relu, "cmap": method.cmap, "time_limit_s": method.time_limit}


def run(args: argparse.Namespace) -> None:
    table, failed = methods(), plugin_failures()
    if args.json:
        print(json.dumps({"methods": {name: method_entry(m) for name, m in table.items()},
                          "failed_plugins": {name: f.public for name, f in failed.items()}}), flush=True)
        return
    lines = ["| method | what it is | paper | unit | cost in passes | faithfulness | sanity |",
             "| --- |" + " --- |" * 6]
    for name, m in table.items():
        cells = [m.title, m.paper, m.unit, m.cost(), "yes" if m.faithfulness else "no", "yes" if m.sanity else "no"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for name, failure in failed.items():
        lines.append(f"plugin {name} not loaded: {failure}")
    print("\n".join(lines), flush=True)
