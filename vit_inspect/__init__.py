"""vit_inspect: look inside Vision Transformers."""
