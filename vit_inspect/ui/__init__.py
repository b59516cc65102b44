"""Helpers for user interfaces that serve untrusted clients (no dependency on any UI toolkit), and the
app's Gradio tabs, one module each (`faithfulness`), which only app.py imports."""
