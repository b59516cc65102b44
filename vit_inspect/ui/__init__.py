"""Pieces of the app (app.py): helpers for interfaces that serve untrusted clients, the per-image panels
and the class picker (no UI toolkit in these), what the controls ask to see (`view`), where a click on a
picture landed (`clicks`), and the app's Gradio tabs, one module each (`attention`, `faithfulness`,
`heads`, `model_tab`), which only app.py imports. The library never imports this package."""
