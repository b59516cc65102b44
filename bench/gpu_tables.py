"""BENCHMARKS.md's GPU tables from the files `bench/gpu_checks.sh` writes, and the goals checked against them:
written to OUTDIR/summary.md and printed, the goals and the parts' exits last.

Reads whichever of OUTDIR's files are there (a part that failed or was cut leaves its table out, or, for
`bench_large`, leaves its finished models' "raw:" lines in log.txt, which are read instead). The peak GPU memory
of each pass is compared with the figure this checkout's BENCHMARKS.md gives for it.

    python -m bench.gpu_tables OUTDIR [--keep]   # --keep: also the CSVs under bench/results BENCHMARKS.md cites
"""
from __future__ import annotations

import argparse
import csv
import json
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORDS = {"app": "app", "app_spill": "app, spill folder"}
GOALS = "ViT-B/16's pass ≤ 3× its floor; DINOv2-L/14's pass ≤ 1 s; the slowest common redraw ≤ 0.25× a forward"


def markdown(headers, rows) -> str:
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


@dataclass
class Table:
    """One table of the summary: its title, words before and after it, and, with ``--keep``, the CSV it goes to
    under bench/results (``name``, rows keyed by ``key``, with the ``context`` of the run that measured them)."""

    title: str
    headers: tuple
    rows: list
    before: str = ""
    after: str = ""
    name: str | None = None
    key: tuple = ("model, input",)
    context: dict | None = None

    def text(self) -> str:
        parts = [f"### {self.title}", self.before, markdown(self.headers, self.rows) if self.rows else "", self.after]
        return "\n\n".join(p for p in parts if p)


def log_sections(out: Path) -> dict[str, list[str]]:
    """Part name -> the lines log.txt holds between its "== NAME: at most" line and the next part's."""
    sections, name = {}, None
    path = out / "log.txt"
    for line in path.read_text(errors="replace").splitlines() if path.is_file() else []:
        start = re.match(r"== (\S+): at most", line)
        if start:
            name = start.group(1)
            sections[name] = []
        elif name is not None:
            sections[name].append(line)
    return sections


def large_runs(out: Path, file: str, part: str, sections: dict) -> tuple[list[dict], str]:
    """bench_large's raw results from ``file``, or from the "raw:" lines of its part in the log; and the source."""
    path = out / file
    if path.is_file():
        raw = json.loads(path.read_text())
        return raw["runs"], f"{raw['context']['command']} ({raw['context']['machine']}, {raw['context']['date']})"
    runs = [json.loads(line.split("raw: ", 1)[1]) for line in sections.get(part, []) if line.startswith("raw: ")]
    return runs, f"the log's raw lines of part {part}" if runs else ""


def published_peaks() -> dict[tuple[str, str, str], str]:
    """(model, pass, precision) -> "pass MB (baseline MB)" of the first table under BENCHMARKS.md's "## GPU"."""
    text = (REPO / "BENCHMARKS.md").read_text() if (REPO / "BENCHMARKS.md").is_file() else ""
    section = text.split("\n## GPU", 1)[1].split("\n## ", 1)[0] if "\n## GPU" in text else ""
    peaks = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 7 and re.match(r"\d+ MB \(\d+ MB\)", cells[6]):
            peaks[(cells[0], cells[1], cells[2])] = cells[6]
    return peaks


def ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1e3:.1f} ms"


def pass_row(r: dict, precision: str) -> tuple[list[object], dict]:
    """A row of the pass table and the figures the goals read."""
    events = r.get("event_s", {})
    has_head = r.get("floor_s") is not None
    base = "floor" if has_head else "forward"
    base_event, base_wall = events.get(base), r["floor_s"] if has_head else r["forward_s"]
    denominator = base_event or base_wall
    ratio = r["analysis_s"] / denominator
    peak = (f"{r['peak_gpu_analysis_MB']:.0f} MB ({r.get('peak_gpu_floor_MB', r.get('peak_gpu_forward_MB')):.0f} MB)"
            if "peak_gpu_analysis_MB" in r else "–")
    redraw = (f"{r['slowest_redraw_s']:.2f} s ({r['slowest_redraw']})" if r.get("slowest_redraw_s") is not None
              else "as float32")
    spilled = f", {r['spilled_MB']:.0f} MB spilled" if r.get("spilled_MB") else ""
    row = [r["model"], WORDS.get(r["design"], r["design"]) + spilled, precision, ms(r["analysis_s"]),
           f"{ratio:.2f}" + ("" if has_head else " ÷ a forward"),
           f"{ms(base_event)} ({ms(base_wall)})", peak, redraw]
    return row, {"model": r["model"], "design": r["design"], "precision": precision, "ratio": ratio,
                 "pass_s": r["analysis_s"], "peak": peak, "forward_s": r["forward_s"],
                 "redraw_ratio": r.get("redraw_ratio"), "slowest_redraw": r.get("slowest_redraw"),
                 "redraws_s": r.get("redraws_s", {})}


def pass_table(out: Path, sections: dict) -> tuple[Table | None, list[dict]]:
    rows, facts, sources = [], [], []
    for file, part, precision in (("large.json", "large", "float32"),
                                  ("large_half.json", "large-half", "autocast float16"),
                                  ("large_served.json", "large-served", "float32")):
        runs, source = large_runs(out, file, part, sections)
        if source:
            sources.append(f"`{source}`")
        for r in runs:
            row, fact = pass_row(r, precision)
            rows.append(row)
            facts.append(fact)
    order = {m: i for i, m in enumerate(dict.fromkeys(r[0] for r in rows))}
    rows.sort(key=lambda r: order[r[0]])
    headers = ("model, input", "pass", "precision", "pass", "÷ the floor (CUDA events)", "floor, CUDA events (wall)",
               "peak GPU memory: pass (baseline)", "slowest first redraw (host, 2 threads)")
    return (Table("The pass", headers, rows, before="; ".join(sources)) if rows else None), facts


def failed(found: dict) -> str | None:
    """The last line of a part's recorded error, or None."""
    return found["error"].strip().splitlines()[-1] if "error" in found else None


def redraw_table(extras: dict, facts: list[dict]) -> Table | None:
    """`bench_gpu_redraws`' table, and the same model's redraws with the spill folder (`bench_large`, "app_spill")."""
    from .bench_gpu_redraws import HEADERS, rows_of

    rows, notes = [], []
    for model, found in extras.get("redraws", {}).items():
        rows += [[model, f"failed: {failed(found)}"] + ["–"] * (len(HEADERS) - 2)] if failed(found) else rows_of(
            model, found)
    for fact in facts:
        if fact["design"] == "app_spill" and fact["redraws_s"]:
            drawn = fact["redraws_s"]
            first = drawn["attention, readout query"] + drawn["rollout, defaults"]
            notes.append(f"- {fact['model']}, with the spill folder (2 threads): the first view's attention maps "
                         f"{first:.3f} s = {first / fact['forward_s']:.1f}× a forward; the slowest redraw "
                         f"{max(drawn.values()):.3f} s ({fact['slowest_redraw']})")
    if not rows and not notes:
        return None
    threads = f"The host's redraws with torch's {extras.get('torch_threads')} threads (this machine's default)."
    return Table("Redraws from a GPU pass", HEADERS, rows, before=threads, after="\n".join(notes),
                 name="gpu_redraws", context=extras.get("context"))


def short_site(site: str, code: int = 70) -> str:
    """`bench_syncs.vit_inspect_site`'s "file:line  code  [in file:line]" with the code cut to ``code`` characters."""
    where, _, rest = site.partition("  ")
    text, _, inner = rest.partition("  [in ")
    text = text if len(text) <= code else text[:code - 1] + "…"
    return f"{where} `{text}`" + (f" [in {inner}" if inner else "")


def sync_table(extras: dict) -> Table | None:
    """Each pass's totals, then one row per site with its syncs in each pass (a column per pass)."""
    counts: dict[str, dict[str, int]] = {}
    lines = []
    for model, passes in extras.get("syncs", {}).items():
        if failed(passes):
            lines.append(f"- {model}: failed: {failed(passes)}")
            continue
        for name, listed in passes.items():
            syncs = listed.get("syncs", [])
            profile = listed.get("profile", {})
            waits = sum(v["count"] for k, v in profile.items() if k.endswith("Synchronize") or k == "cudaMemcpy")
            dtoh = {k: v for k, v in profile.items() if k.startswith("Memcpy DtoH")}
            lines.append(f"- {model}, {name} ({listed['store']} store{', spilled' if listed['spilled'] else ''}): "
                         f"{sum(n for _, n in syncs)} syncs, {sum(n for *_, n in listed['host_calls'])} host calls, "
                         f"{waits} waits in the CUDA runtime, {sum(v['count'] for v in dtoh.values())} copies to the "
                         f"host taking {sum(v['gpu_ms'] for v in dtoh.values()):.1f} ms of GPU time")
            for site, n in syncs:
                counts.setdefault(short_site(site), {})[f"{model}, {name}"] = n
    if not lines:
        return None
    columns = list(dict.fromkeys(column for per_pass in counts.values() for column in per_pass))
    rows = [[site] + [per_pass.get(column, "") for column in columns] for site, per_pass in counts.items()]
    return Table("The pass's synchronisations", ("where (first vit_inspect frame)", *columns), rows,
                 before="\n".join(lines), name="gpu_syncs", key=("where (first vit_inspect frame)",),
                 context=extras.get("context"))


def copy_table(extras: dict) -> Table | None:
    from .bench_host_copy import HEADERS, rows_of

    rows = []
    for model, found in extras.get("host_copy", {}).items():
        rows += [[model, f"failed: {failed(found)}", "–", "–"]] if failed(found) else rows_of(model, found)
    return Table("The copy of the queries and keys to the host", HEADERS, rows, name="gpu_host_copy",
                 context=extras.get("context")) if rows else None


def first_view_table(out: Path) -> Table | None:
    path = out / "first_view.json"
    if not path.is_file():
        return None
    found = json.loads(path.read_text())
    rows = [[name, "library calls", f"{r['pass_s']:.3f} s pass + {r['draw_s']:.3f} s drawing"]
            for name, r in found.get("library", {}).items()]
    api = found.get("api")
    if api and "error" not in api:
        rows.append(["DeiT-Ti/16, 224 (random weights), app.py with its spill folder", "gradio_client",
                     f"page load → first view {api['load_s']:.3f} s, new image → first view {api['image_s']:.3f} s "
                     f"(server up in {api['server_start_s']:.1f} s)"])
    elif api:
        rows.append(["app.py", "gradio_client", api["error"]])
    return Table("The first view without a browser", ("model, deployment", "through", "median"), rows,
                 name="gpu_first_view", key=("model, deployment", "through"), context=found.get("context"))


def ops_table(out: Path, top: int = 5) -> Table | None:
    """The largest additions of bench_pass_ops (its own CSV is what ``--keep`` copies)."""
    path = out / "pass_ops_cuda.csv"
    if not path.is_file():
        return None
    with path.open(newline="") as file:
        rows = list(csv.DictReader(file))
    shown = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        shown += [[model, r["operator"], r["baseline CPU ms"], r["pass CPU ms"], r["baseline GPU ms"], r["pass GPU ms"]]
                  for r in mine[:2 + top]]
    return Table("Where the pass's time goes (bench_pass_ops)",
                 ("model", "operator", "baseline CPU ms", "pass CPU ms", "baseline GPU ms", "pass GPU ms"), shown)


def goals(facts: list[dict], extras: dict, sections: dict) -> list[str]:
    lines = [f"Goals: {GOALS}."]
    published = published_peaks()
    for f in facts:
        words = f"{f['model']}, {WORDS.get(f['design'], f['design'])}, {f['precision']}: pass {ms(f['pass_s'])}"
        if f["model"].startswith("ViT-B/16") and f["design"] == "app":
            words += f", {f['ratio']:.2f}× the floor ({'met' if f['ratio'] <= 3 else 'NOT met'})"
        if f["model"].startswith("DINOv2-L") and f["design"] == "app":
            words += f" ({'met' if f['pass_s'] <= 1 else 'NOT met'}: ≤ 1 s)"
        before = published.get((f["model"], WORDS.get(f["design"], f["design"]), f["precision"]))
        words += f"; peak {f['peak']}" + (f", BENCHMARKS: {before}" if before else "")
        if f["redraw_ratio"] is not None:
            words += f"; slowest redraw {f['redraw_ratio']:.1f}× a forward ({f['slowest_redraw']})"
        lines.append("- " + words)
    for model, r in extras.get("redraws", {}).items():
        if "host_s" in r:
            first = r["host_s"]["attention, readout query"] + r["host_s"]["rollout, defaults"]
            met = "met" if first <= 0.25 * r["forward_s"] else "NOT met"
            lines.append(f"- {model}: the first view's attention maps from a GPU pass {first / r['forward_s']:.1f}× a "
                         f"forward on the host ({met}: ≤ 0.25×)")
    tests = [line for line in sections.get("gpu-tests", []) if re.search(r"\d+ (passed|failed|error)", line)]
    lines.append(f"- GPU tests (test_transfers.py, test_host_copy.py, the GPU pass equal to the CPU's): "
                 f"{tests[-1].strip() if tests else 'no summary line in the log'}")
    return lines


def keep(out: Path, tables: list[Table]) -> None:
    """The CSVs under bench/results: bench_large's from its JSON files (`bench_large.from_json`), bench_pass_ops'
    as it came, every other table's with its run's context (`common.report`)."""
    from .bench_large import from_json
    from .common import RESULTS, report

    found = [out / name for name in ("large.json", "large_half.json", "large_served.json") if (out / name).is_file()]
    if found:
        from_json(found)
    if (out / "pass_ops_cuda.csv").is_file():
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "pass_ops_cuda.csv").write_bytes((out / "pass_ops_cuda.csv").read_bytes())
    for table in tables:
        if table.name and table.rows and table.context:
            report(table.name, table.headers, table.rows, key=table.key, context=table.context)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--keep", action="store_true", help="also write the tables' CSVs under bench/results")
    args = parser.parse_args()
    out = args.outdir
    sections = log_sections(out)
    extras = json.loads((out / "extras.json").read_text()) if (out / "extras.json").is_file() else {}
    table, facts = pass_table(out, sections)
    tables = [table]
    for build in (lambda: redraw_table(extras, facts), lambda: sync_table(extras), lambda: copy_table(extras),
                  lambda: first_view_table(out), lambda: ops_table(out)):
        try:
            tables.append(build())
        except Exception as exc:  # raw results of another shape: said, and the other tables still rendered
            tables.append(Table("A table that could not be rendered", ("error",), [[f"{type(exc).__name__}: {exc}"]]))
    tables = [t for t in tables if t is not None]
    log = (out / "log.txt").read_text(errors="replace").splitlines() if (out / "log.txt").is_file() else []
    done = next((i for i, line in enumerate(log) if line.startswith("== all parts done")), len(log))
    exits = [line for line in log[:done] if re.match(r"== \S+: (exit|skipped)", line)]  # not a summary's copy
    text = "\n\n".join(t.text() for t in tables) + "\n\n" + "\n".join(goals(facts, extras, sections)) \
        + "\n\nParts:\n" + "\n".join(exits) + "\n"
    if args.keep:
        keep(out, tables)
    try:
        (out / "summary.md").write_text(text)
    except OSError:  # a folder fetched read-only: printed only
        pass
    print(text)

if __name__ == "__main__":
    main()
