"""Gradio tabs of the app, one module each; imported only by app.py (the library never imports gradio)."""
