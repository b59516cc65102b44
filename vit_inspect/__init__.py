"""vit_inspect: look inside Vision Transformers.

In a notebook one call does it: ``r = vit_inspect.analyze("cat.png", model="deit_tiny_patch16_224")``, then
``r.show("rollout")``, ``r.show_all()`` and ``r.record()`` (`vit_inspect.notebook`). Underneath: load any timm
or Hugging Face ViT as a `ViTHandle` (`load_model`), run one pass per image (`analyze_image`) and read the maps
and numbers from the cached `ImageAnalysis`; the ViT paper's Fig. 7 analyses come from `model_report` and
`dataset_attention_distance`. Everything else is reachable by its subpackage: `core` (models, images,
geometry), `analysis` (pure functions of arrays), `passes` (the pass and what it records), `studies`
(questions that run the model many times), `plots`, `jobs` (folder-level engines), and on top `notebook`,
`cli` and `ui` (the app). Nothing here imports gradio.
"""
from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.handle import DEFAULT_MODEL, ViTHandle
from vit_inspect.core.hf_models import handle_from_hf
from vit_inspect.core.images import ImageLimits
from vit_inspect.core.load import load_model
from vit_inspect.core.module_spec import ModuleSpec, handle_from_module
from vit_inspect.core.timm_models import handle_from_timm
from vit_inspect.jobs.distance import DatasetDistance, dataset_attention_distance
from vit_inspect.notebook import Analysis, analyze, class_concepts
from vit_inspect.passes.options import PassOptions
from vit_inspect.passes.pipeline import analyze_image
from vit_inspect.passes.result import ImageAnalysis
from vit_inspect.passes.targets import explain_feature
from vit_inspect.studies.class_concepts import ClassConcepts, class_concept_heatmaps
from vit_inspect.studies.model_report import ModelReport, model_report

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MODEL", "Analysis", "ClassConcepts", "DatasetDistance", "ImageAnalysis", "ImageLimits", "ModelReport",
    "ModuleSpec", "PassOptions", "ViTHandle", "VitInspectError", "analyze", "analyze_image", "class_concept_heatmaps",
    "class_concepts", "dataset_attention_distance", "explain_feature", "handle_from_hf", "handle_from_module",
    "handle_from_timm", "load_model", "model_report",
]
