"""vit_inspect: look inside Vision Transformers.

Load any timm or Hugging Face ViT as a `ViTHandle`, run one pass per image (`analyze_image`) and
read the maps and numbers from the cached `ImageAnalysis`; the ViT paper's Fig. 7 analyses come
from `model_report` and `dataset_attention_distance`. Nothing here imports gradio.
"""
from .ablation import AblationEffect, HeadImportance, ablation_effect, analyze_ablated, head_importance
from .analysis import (AttentionDistanceAccumulator, FilterPCA, attention_map, chefer_matrix, chefer_relevance,
                       distance_as_fraction_of_width, filter_pca, gradcam_from_tokens, mean_attention_distance,
                       pos_embed_similarity, readout, rollout, rollout_matrix)
from .capture import AttentionRecorder, capture_attention
from .errors import (CaptureError, ImageError, ModelNotFoundError, UnsupportedModelError, VitInspectError,
                     WeightsError, WeightsNotFoundError)
from .head_pass import HeadPass
from .images import ImageLimits, Preprocess, load_image
from .interventions import HeadMeans, ablate_heads, mean_head_outputs
from .models import DEFAULT_MODEL, ViTHandle, handle_from_hf, handle_from_timm, load_model, read_state_dict
from .module_spec import ModuleSpec, handle_from_module, load_model_file
from .pipeline import (DatasetDistance, ImageAnalysis, ModelReport, analyze_image, dataset_attention_distance,
                       model_report, pos_similarity_at)
from .tokens import TokenLayout

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MODEL", "AttentionDistanceAccumulator", "AttentionRecorder", "CaptureError", "DatasetDistance",
    "FilterPCA", "ImageAnalysis", "ImageError", "ImageLimits", "ModelNotFoundError", "ModelReport", "ModuleSpec",
    "Preprocess", "TokenLayout", "UnsupportedModelError", "ViTHandle", "VitInspectError", "WeightsError",
    "WeightsNotFoundError", "analyze_image", "attention_map", "capture_attention", "chefer_matrix",
    "chefer_relevance", "dataset_attention_distance", "distance_as_fraction_of_width", "filter_pca",
    "gradcam_from_tokens", "handle_from_hf", "handle_from_module", "handle_from_timm", "load_image", "load_model",
    "load_model_file", "mean_attention_distance", "model_report", "pos_embed_similarity", "pos_similarity_at",
    "read_state_dict", "readout", "rollout", "rollout_matrix",
    "AblationEffect", "HeadImportance", "HeadMeans", "HeadPass", "ablate_heads", "ablation_effect", "analyze_ablated",
    "head_importance", "mean_head_outputs",
]
