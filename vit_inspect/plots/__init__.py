"""Pictures of results, one module per subject: `*_figure` draws a matplotlib Figure, `*_panel` an
(H, W, 3) uint8 picture with PIL (the app's fast path).
"""
