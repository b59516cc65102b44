"""The `analyze` record and ``.npz`` arrays with every registered method's map: the pass's own record
(`passes.records`) and, by the registry, the default map of each method that asks to be recorded."""
from __future__ import annotations

import numpy as np

from vit_inspect.core.handle import ViTHandle
from vit_inspect.methods.compute import compute_maps
from vit_inspect.methods.method import MethodContext, MethodFailure
from vit_inspect.methods.registry import methods
from vit_inspect.passes.records import analysis_arrays, analysis_record, rounded
from vit_inspect.passes.result import ImageAnalysis


def recorded_maps(handle: ViTHandle, result: ImageAnalysis) -> tuple[dict[str, np.ndarray], dict[str, MethodFailure]]:
    """(name -> float64 map, name -> failure) of every registered method with `Method.record`, at its default
    options; a method with passes of its own runs on `handle` with the crop the pass saw."""
    return compute_maps(MethodContext(result, handle), tuple(n for n, m in methods().items() if m.record))


def method_record(handle: ViTHandle, result: ImageAnalysis, image: str) -> dict:
    """The JSON object `analyze` prints: `passes.records.analysis_record`, one key per recorded method
    (its map rounded for JSON, null where the pass cannot have it), and ``left_out`` (method -> why it
    failed) when a method failed."""
    maps, failures = recorded_maps(handle, result)
    record = analysis_record(handle, result, image)
    record |= {name: rounded(maps.get(name)) for name, m in methods().items() if m.record}
    if failures:
        record["left_out"] = {name: failure.public for name, failure in failures.items()}
    return record


def method_arrays(handle: ViTHandle, result: ImageAnalysis) -> dict[str, np.ndarray]:
    """`passes.records.analysis_arrays`, and the map of every recorded method it does not hold, at full
    precision (float64)."""
    arrays = analysis_arrays(result)
    return arrays | {name: values for name, values in recorded_maps(handle, result)[0].items() if name not in arrays}
