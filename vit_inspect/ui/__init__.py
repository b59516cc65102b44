"""Pieces of the app (app.py): helpers for interfaces that serve untrusted clients, the per-image panels
and the class picker (no UI toolkit in these), and the app's Gradio tabs, one module each (`faithfulness`),
which only app.py imports. The library never imports this package."""
