"""The Gradio app (app.py builds it with `demo.build_demo`): helpers for interfaces that serve untrusted
clients, the per-image panels and the class picker (no UI toolkit in these), what the controls ask to see
(`view`), where a click on a picture landed (`clicks`), the page-wide handlers (`inspector`), the input
column (`inputs`) and the tabs, one module each (`tabs`). The library never imports this package."""
