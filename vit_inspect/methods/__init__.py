"""The method registry: every map is one `Method` in one table, which every consumer reads.

`methods()` lists them (the built-ins of `builtin`, then the plugins of the entry point group
`vit_inspect.methods`), `get` finds one, `compute_map` / `compute_maps` run them so that a failing method
gives a `MethodFailure` instead of an exception. See the docs page "Adding a method".
"""
from vit_inspect.methods import builtin  # noqa: F401  (registers the built-in methods)
from vit_inspect.methods.compute import check_options, compute_map, compute_maps
from vit_inspect.methods.method import READS, Method, MethodContext, MethodFailure
from vit_inspect.methods.records import method_arrays, method_record, recorded_maps
from vit_inspect.methods.registry import (ENTRY_POINT_GROUP, added, get, load_plugins, methods, plugin_failures, register,
                                          unregister)

__all__ = ["ENTRY_POINT_GROUP", "Method", "MethodContext", "MethodFailure", "READS", "added", "check_options", "compute_map",
           "compute_maps", "get", "load_plugins", "method_arrays", "method_record", "methods", "plugin_failures",
           "recorded_maps", "register", "unregister"]
