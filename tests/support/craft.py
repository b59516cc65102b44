"""craft-xai, imported without TensorFlow: its sampler module imports TensorFlow for its TensorFlow sampler only
(the Halton sampler, the estimators and the torch `Craft` never touch it)."""
from __future__ import annotations

import importlib
import sys
import types


def import_craft(name: str):
    """The craft-xai module ``name``, imported with an empty stand-in for TensorFlow that is removed again at once:
    left in `sys.modules`, it would tell every other package that TensorFlow is installed (Quantus asks
    `importlib.util.find_spec("tensorflow")`, which raises on a module without a spec)."""
    stand_in = "tensorflow" not in sys.modules
    if stand_in:
        sys.modules["tensorflow"] = types.ModuleType("tensorflow")
    try:
        return importlib.import_module(name)
    finally:
        if stand_in:
            del sys.modules["tensorflow"]
