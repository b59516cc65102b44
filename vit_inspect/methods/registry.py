"""The one table of methods (timm's `_registry`): `register` puts a `Method` in it, and every consumer reads
`methods()` / `get`. Third-party methods arrive through entry points of the group `vit_inspect.methods`
(pytest's and pluggy's way), each naming one `Method` object; they are loaded once, on the first read of the
table. A plugin that fails to import, names no `Method`, or clashes with a name already taken is recorded in
`plugin_failures()` with a sentence and left out; it never takes the host down."""
from __future__ import annotations

from importlib.metadata import entry_points

from vit_inspect.methods.method import Method, MethodFailure

ENTRY_POINT_GROUP = "vit_inspect.methods"
BUILTIN_MODULE = "vit_inspect.methods.builtin"  # where the shipped methods' functions live

_TABLE: dict[str, Method] = {}  # name -> method, in registration order (built-ins first, then plugins)
_PLUGIN_FAILURES: dict[str, MethodFailure] = {}  # entry point name -> why it was left out
_plugins_loaded = False


def register(method: Method) -> Method:
    """Add `method` to the table; a name already taken is refused with a ValueError saying by what."""
    if not isinstance(method, Method):
        raise ValueError(f"only a vit_inspect.methods.Method can be registered, got {type(method).__name__}")
    if method.name in _TABLE:
        raise ValueError(f"a method named {method.name!r} is already registered ({_TABLE[method.name].title})")
    _TABLE[method.name] = method
    return method


def unregister(name: str) -> Method:
    """Take the method `name` out of the table and return it (a test's clean-up); KeyError if it is absent."""
    return _TABLE.pop(name)


def load_plugins() -> None:
    """Register every entry point of `ENTRY_POINT_GROUP`, once; each failure is recorded, never raised."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            method = point.load()
        except Exception as exc:  # a plugin's own import may raise anything: it is reported, not raised
            _PLUGIN_FAILURES[point.name] = MethodFailure(
                point.name, f"The plugin {point.value!r} failed to import: {type(exc).__name__}: {exc}")
            continue
        try:
            register(method)
        except ValueError as exc:
            _PLUGIN_FAILURES[point.name] = MethodFailure(point.name, f"The plugin {point.value!r} was refused: {exc}.")


def methods() -> dict[str, Method]:
    """name -> `Method`, every registered method (built-ins, then plugins), in registration order."""
    load_plugins()
    return dict(_TABLE)


def get(name: str) -> Method:
    """The method `name`; ValueError naming the choices for an unknown one."""
    table = methods()
    if name not in table:
        raise ValueError(f"unknown method {name!r}; choose one of {', '.join(table)}")
    return table[name]


def added() -> dict[str, Method]:
    """name -> `Method`, the registered methods that vit_inspect does not ship (plugins, and methods registered
    in code): the app draws these at their defaults beside the built-ins, which its views draw with their
    own settings."""
    return {name: m for name, m in methods().items() if m.compute.__module__ != BUILTIN_MODULE}


def plugin_failures() -> dict[str, MethodFailure]:
    """entry point name -> why that plugin is not in the table."""
    load_plugins()
    return dict(_PLUGIN_FAILURES)
