"""The command line, `vit-inspect` (or `python -m vit_inspect`): one module per command.
"""
