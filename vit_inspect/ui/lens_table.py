"""The Heads section's logit-lens table: one row per block, from the lens the pass recorded."""
from __future__ import annotations

from vit_inspect.passes.records import lens_record
from vit_inspect.passes.result import ImageAnalysis


def lens_table(handle, result: ImageAnalysis) -> tuple[list[str], list[list], str]:
    """(headers, one row per block, note) of the logit lens recorded in the pass: per readout (the model's
    own; distilled DeiT also the class and distillation tokens), the final class's rank and probability
    and the top-5 after each block."""
    record = lens_record(handle, result)
    if "note" in record:
        return ["note"], [[record["note"]]], record["note"]
    names = [name for name in record if isinstance(record[name], dict)]
    headers = ["after block"]
    for name in names:
        headers += [f"{name}: rank of final class", f"{name}: its prob", f"{name}: top-5"]
    rows = []
    for block in range(result.depth):
        row: list = [block]
        for name in names:
            layer = record[name]["layers"][block]
            row += [layer["rank"], layer["prob"], ", ".join(f"{t['label']} {t['prob']:.2f}" for t in layer["top"])]
        rows.append(row)
    settled = ", ".join(f"{name} from block {record[name]['settled_at_block']} on" for name in names
                        if record[name]["settled_at_block"] is not None)
    note = (f"Final class: {record['final_label']} (#{record['final_class']}). "
            + (f"It is the lens's top class for good: {settled} (blocks 0 to {result.depth - 1})." if settled else ""))
    return headers, rows, note


def lens_widths(headers: list[str]) -> list[str]:
    """The lens table's column widths: one readout's four columns share the page's width, its top-5 wrapped in
    the widest; several readouts' columns (distilled DeiT: ten) keep their own widths, the table scrolling
    sideways with the block column pinned."""
    return ["10%", "12%", "12%", "66%"] if len(headers) == 4 else []
