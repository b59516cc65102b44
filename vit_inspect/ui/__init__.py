"""Pieces of the Gradio app (app.py), one module per concern. Only app.py imports them; they never
import gradio, and the library never imports them."""
