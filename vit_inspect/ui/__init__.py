"""Pieces of the app (app.py), one module per concern, and helpers for interfaces that serve untrusted
clients. None of them imports gradio or any UI toolkit; the library never imports them."""
