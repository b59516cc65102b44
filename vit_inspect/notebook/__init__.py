"""The library made for notebooks: one call per image, a result that draws itself.

    import vit_inspect as vi
    r = vi.analyze("cat.png", model="deit_tiny_patch16_224")
    r                      # in Jupyter: the top-5 classes and the main maps
    r.show("rollout")      # one map as a matplotlib Figure
    r.show_all()           # every map of the pass side by side
    r.record()             # the JSON record `vit-inspect analyze` prints
    c = vi.class_concepts("cats/", target=285)   # a class's concepts over a folder of its images (CRAFT)

`analyze` loads the model as `load_model` does (weights from ``checkpoints/`` first, then the Hugging Face
hub) and keeps the last two models loaded, so a notebook that analyses many images loads each model once.
Inside a running IPython kernel, importing this package makes matplotlib Figures display as PNG when a
cell returns one, as ``%matplotlib inline`` does; nothing changes outside IPython.
"""
from vit_inspect.notebook.api import analyze, class_concepts
from vit_inspect.notebook.display import figures_inline
from vit_inspect.notebook.result import Analysis

figures_inline()

__all__ = ["Analysis", "analyze", "class_concepts", "figures_inline"]
