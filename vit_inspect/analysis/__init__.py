"""Analyses of a ViT: pure functions from plain arrays to raw numbers (no clamping, normalising or upsampling)."""
from vit_inspect.analysis.attention_distance import (AttentionDistanceAccumulator, distance_as_fraction_of_width,
                                                     distances_per_image, mean_attention_distance)
from vit_inspect.analysis.attention_maps import Query, attention_map, prefix_shares, readout
from vit_inspect.analysis.chefer import chefer_matrix, chefer_relevance
from vit_inspect.analysis.classes import class_name, search_classes
from vit_inspect.analysis.concepts import Factorisation, deep_feature_factorization
from vit_inspect.analysis.entropy import attention_entropy
from vit_inspect.analysis.filters import FilterPCA, filter_pca
from vit_inspect.analysis.gradcam import gradcam_from_tokens
from vit_inspect.analysis.legrad import legrad_map, patch_relevance
from vit_inspect.analysis.masks import mass_mask
from vit_inspect.analysis.pos_embed import pos_embed_similarity
from vit_inspect.analysis.rollout import (gradient_fused_attention, gradient_rollout, gradient_rollout_matrix,
                                          rollout, rollout_matrix)
from vit_inspect.analysis.similarity import cosine_similarity

__all__ = [
    "AttentionDistanceAccumulator",
    "Factorisation",
    "FilterPCA",
    "Query",
    "attention_entropy",
    "attention_map",
    "chefer_matrix",
    "class_name",
    "chefer_relevance",
    "cosine_similarity",
    "deep_feature_factorization",
    "distance_as_fraction_of_width",
    "distances_per_image",
    "filter_pca",
    "gradcam_from_tokens",
    "gradient_fused_attention",
    "gradient_rollout",
    "gradient_rollout_matrix",
    "mass_mask",
    "legrad_map",
    "mean_attention_distance",
    "patch_relevance",
    "pos_embed_similarity",
    "prefix_shares",
    "readout",
    "rollout",
    "rollout_matrix",
    "search_classes",
]
