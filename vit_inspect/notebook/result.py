"""`Analysis`: one analysed image with its model, which draws itself in Jupyter."""
from __future__ import annotations

import html
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.sae_file import SparseAutoencoder
from vit_inspect.core.sae_index import SAEIndex
from vit_inspect.core.sae_load import load_sae
from vit_inspect.methods import (MethodContext, MethodFailure, check_options, compute_map, get, method_arrays,
                                 method_record, methods)
from vit_inspect.notebook.display import preview_tag, topk_table
from vit_inspect.notebook.sae import FeatureTable, loaded_sae
from vit_inspect.passes.block_tokens import checked_layer
from vit_inspect.passes.concepts import DEFAULT_CONCEPTS, ImageConcepts, image_concepts, patch_similarity
from vit_inspect.passes.records import target_text
from vit_inspect.passes.result import ImageAnalysis
from vit_inspect.passes.sae import image_features
from vit_inspect.passes.targets import TARGET_METHODS, Target, TargetMaps, concept_target, feature_target, target_maps

LEGIBLE_SIDE = 128  # in the Jupyter view a smaller crop (CIFAR's 32 px) is enlarged to at least this, whole pixels


def legible(rgb: np.ndarray) -> np.ndarray:
    """(H, W, 3) uint8 enlarged by a whole factor (each pixel a block) until its shorter side is at least
    `LEGIBLE_SIDE`; a large enough image is returned as it is."""
    factor = -(-LEGIBLE_SIDE // min(rgb.shape[:2]))
    return rgb if factor <= 1 else np.repeat(np.repeat(rgb, factor, axis=0), factor, axis=1)


@dataclass(frozen=True)
class Analysis:
    """One image through one model (`vit_inspect.analyze`): the maps, the numbers and their figures.

    ``result`` is the pass's `ImageAnalysis` (plain arrays; every option of every map is computed from it
    without the model), ``handle`` the model, ``image`` the name the record carries. In Jupyter the object
    shows itself: the model, the top-5 classes and the main maps.
    """

    handle: ViTHandle  # the model the image went through
    result: ImageAnalysis  # the cached pass: attention, Grad-CAM, relevance, distances, probabilities
    image: str  # the image's path as given, or "image" for an image passed as pixels

    def top(self, k: int = 5) -> list[dict]:
        """The k most probable classes as {"index", "label", "prob"}, most probable first; empty for a
        model without a classification head."""
        return self.handle.top_labels(self.result.probs, k) if self.result.probs.size else []

    def map(self, name: str, **options) -> np.ndarray:
        """One (grid_h, grid_w) raw map, unnormalised, over the patch grid of the crop the model saw: any
        registered method (`vit-inspect methods`; `vit_inspect.methods`), with the options its compute takes.

        - ``"attention"``: one layer's attention probabilities from a query token (`ImageAnalysis.attention_map`;
          options ``layer`` (default the last), ``head`` (default: the mean of heads), ``query`` (default the
          readout: the class token, or the mean of patch queries; or a (row, col) patch)).
        - ``"rollout"``: attention rollout, Abnar & Zuidema 2020 (`ImageAnalysis.rollout`; options
          ``head_fusion``, ``discard_ratio``, ``residual``, ``start_layer``, ``end_layer``, ``query``, ``discard``).
        - ``"gradient_rollout"``: vit-explain's class-specific gradient rollout (`ImageAnalysis.gradient_rollout`).
        - ``"gradcam"``: Grad-CAM, Selvaraju et al. 2017, at the first LayerNorm of block ``layer`` (default the
          last), signed (activation × gradient).
        - ``"chefer"``: gradient-weighted attention, Chefer et al. 2021. ``"legrad"``: LeGrad, Bousselham et al.
          2025. ``"attnlrp"``: AttnLRP, Achtibat et al. 2024 (relevance in logit units; for a text prompt in
          units of its cosine similarity). ``"gradcam_relu"``: Grad-CAM after the ReLU.

        Raises ValueError for an unknown name or options the map does not take, for a map this model or
        pass does not have (gradient maps without a head; LeGrad and AttnLRP with ``relevance=False``), and
        with the method's sentence for a method that failed (`methods.MethodFailure`)."""
        try:
            method = get(name)
        except ValueError:
            raise ValueError(f"unknown map {name!r}; choose one of {', '.join(methods())}") from None
        check_options(method, options)
        values = compute_map(method, MethodContext(self.result, self.handle), **options)
        if isinstance(values, MethodFailure):
            raise ValueError(values.public)
        if values is None:
            why = ("it has no classification head" if self.result.target is None else
                   f"{name} needs analyze(..., relevance=True) and a timm or Hugging Face model")
            raise ValueError(f"{self.handle.name} has no {name} map in this result: {why}")
        return values

    def maps(self) -> dict[str, np.ndarray]:
        """Every map of the pass at its default options, by name (see `plots.maps.pass_maps`)."""
        from vit_inspect.plots.maps import pass_maps

        return pass_maps(self.result, self.handle)

    def title(self) -> str:
        """"model · image · class label (#index)" of the class the gradient maps explain, or 'prompt "text"'
        of a text prompt, each with what it is compared with."""
        result = self.result
        parts = [self.handle.name, Path(self.image).name]
        if result.target is not None:
            parts.append(target_text(self.handle, result.target, result.prompt))
            if result.contrast is not None:
                parts[-1] += f" versus {target_text(self.handle, result.contrast, result.versus)}"
        return " · ".join(parts)

    def show(self, name: str = "rollout", **options):
        """One map over the crop the model saw, with its colour bar and unit, as a matplotlib Figure
        (`plots.maps.maps_figure`); takes the names and options of `map`. A method drawn after a ReLU
        (`Method.relu`, Grad-CAM) is."""
        from vit_inspect.plots.maps import maps_figure

        values = self.map(name, **options)
        method = get(name)
        label = name if not options else f"{name} ({', '.join(f'{k}={v}' for k, v in options.items())})"
        return maps_figure(self.result.rgb, {label: values}, relu_names=(label,) if method.relu else (),
                           units={label: method.unit.format(score=self.result.score)}, title=self.title())

    def show_all(self):
        """Every map of the pass side by side at its default options (`maps`), as a matplotlib Figure."""
        from vit_inspect.plots.maps import maps_figure, titled_pass_maps

        maps, relu, units = titled_pass_maps(self.result, self.handle)
        return maps_figure(self.result.rgb, maps, relu_names=relu, units=units, title=self.title())

    def show_distance(self):
        """Mean attention distance per layer and head in input pixels (ViT paper, Fig. 7 right), a Figure."""
        from vit_inspect.plots.distance import attention_distance_figure

        return attention_distance_figure(self.result.mean_distance, image_width=self.result.layout.input_size[1],
                                         title=f"mean attention distance: {self.title()}")

    def concepts(self, k: int = DEFAULT_CONCEPTS, layer: int | None = None, seed: int = 0) -> ImageConcepts:
        """The ``k`` concepts of this image at block ``layer`` (default the last): deep feature factorisation
        (Collins et al. 2018) of the block's output patch tokens, each concept with its (grid_h, grid_w)
        heatmap, its area and its logits through the model's head (`passes.concepts.image_concepts`). Read from
        the pass's tokens, without the model, where the result kept them."""
        return image_concepts(self.handle, self.result, k, layer, seed)

    def show_concepts(self, k: int = DEFAULT_CONCEPTS, layer: int | None = None, seed: int = 0):
        """`concepts` as a matplotlib Figure: the crop, then each concept's heatmap with its colour bar, area,
        logit and the classes it reads as (`plots.concepts.concepts_figure`)."""
        from vit_inspect.plots.concepts import concepts_figure

        return concepts_figure(self.result.rgb, self.concepts(k, layer, seed), self.handle.label,
                               Path(self.image).name)

    def feature_maps(self, sae: SparseAutoencoder | str | os.PathLike, feature: int,
                     methods: tuple[str, ...] = TARGET_METHODS, gradcam_layer: int | None = None) -> TargetMaps:
        """Grad-CAM, LeGrad and AttnLRP (``methods``) of SAE feature ``feature``'s activation summed over the
        patch tokens of the crop the model saw (`passes.targets`: blocks up to the SAE's take part; Grad-CAM
        at the output of block ``gradcam_layer``, default the SAE's). ``sae``: an SAE or its file."""
        name = None if isinstance(sae, SparseAutoencoder) else str(sae)
        loaded = sae if name is None else load_sae(name, model=self.handle.name)
        return self._target_maps(feature_target(self.handle, loaded, feature, name), methods, gradcam_layer)

    def explain_feature(self, sae: SparseAutoencoder | str | os.PathLike, feature: int, method: str = "gradcam",
                        gradcam_layer: int | None = None) -> np.ndarray | None:
        """One (grid_h, grid_w) map of `feature_maps`: ``method`` is "gradcam", "legrad" or "attnlrp" (None
        for AttnLRP on a model whose attention its rules cannot follow)."""
        return self.feature_maps(sae, feature, (method,), gradcam_layer).maps[method]

    def concept_maps(self, index: int, k: int = DEFAULT_CONCEPTS, layer: int | None = None, seed: int = 0,
                     methods: tuple[str, ...] = TARGET_METHODS, gradcam_layer: int | None = None) -> TargetMaps:
        """Grad-CAM, LeGrad and AttnLRP of concept ``index`` of `concepts` (k, layer, seed as there): its
        coefficient (the projection on the pseudo-inverse of the concept parts) summed over the patches."""
        return self._target_maps(concept_target(self.handle, self.result, index, k, layer, seed), methods,
                                 gradcam_layer)

    def explain_concept(self, index: int, method: str = "gradcam", k: int = DEFAULT_CONCEPTS,
                        layer: int | None = None, seed: int = 0) -> np.ndarray | None:
        """One (grid_h, grid_w) map of `concept_maps`."""
        return self.concept_maps(index, k, layer, seed, (method,)).maps[method]

    def show_feature_maps(self, sae: SparseAutoencoder | str | os.PathLike, feature: int):
        """`feature_maps` as a matplotlib Figure whose title names the model, image, SAE, block and feature."""
        from vit_inspect.plots.maps import target_maps_figure

        return target_maps_figure(self.result.rgb, self.feature_maps(sae, feature),
                                  f"{self.handle.name} · {Path(self.image).name}")

    def show_concept_maps(self, index: int, k: int = DEFAULT_CONCEPTS, layer: int | None = None, seed: int = 0):
        """`concept_maps` as a matplotlib Figure whose title names the model, image, block, k, concept and seed."""
        from vit_inspect.plots.maps import target_maps_figure

        return target_maps_figure(self.result.rgb, self.concept_maps(index, k, layer, seed),
                                  f"{self.handle.name} · {Path(self.image).name}")

    def _target_maps(self, target: Target, methods: tuple[str, ...], gradcam_layer: int | None) -> TargetMaps:
        return target_maps(self.handle, MethodContext(self.result, self.handle).model_input(), target, methods,
                           gradcam_layer)

    def similarity(self, patch: tuple[int, int], layer: int | None = None,
                   other: Analysis | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """(this image's, ``other``'s or None) (grid_h, grid_w) cosine similarity of patch ``patch`` = (row, col)'s
        token at block ``layer`` (default the last) to every patch token (`passes.concepts.patch_similarity`);
        ``other`` is an `Analysis` of another image through the same model."""
        if other is not None and other.handle.name != self.handle.name:
            raise ValueError(f"other is an analysis of {other.handle.name}, not of {self.handle.name}")
        return patch_similarity(self.handle, self.result, patch, layer, None if other is None else other.result)

    def show_similarity(self, patch: tuple[int, int], layer: int | None = None, other: Analysis | None = None):
        """`similarity` as a matplotlib Figure on the fixed range [-1, 1], the query patch outlined
        (`plots.concepts.similarity_figure`)."""
        from vit_inspect.plots.concepts import similarity_figure

        own, theirs = self.similarity(patch, layer, other)
        block = checked_layer(layer, self.result.depth)
        row, col = patch
        maps = {f"{Path(self.image).name}, patch ({row}, {col})": (self.result.rgb, own)}
        if other is not None:
            maps[Path(other.image).name] = (other.result.rgb, theirs)
        return similarity_figure(maps, (int(row), int(col)), f"{self.handle.name} · cosine similarity of patch "
                                 f"({row}, {col})'s token at block {block} output to every patch token")

    def features(self, sae: str | os.PathLike | SparseAutoencoder, top: int = 10,
                 patch: tuple[int, int] | None = None, index: str | os.PathLike | SAEIndex | None = None
                 ) -> FeatureTable:
        """The image's top ``top`` features of ``sae`` (a file, or a loaded `SparseAutoencoder`) by activation
        summed over its patches, or at one (row, col) ``patch``; each with its peak, the patch of the peak and a
        label from the feature index (``index``, or the one beside the SAE file). One forward up to the SAE's
        block (`passes.sae.image_features`); the table shows itself in Jupyter, ``.rows`` are dicts."""
        loaded = loaded_sae(self.handle, sae, index)
        found = image_features(self.handle, loaded.sae, self.result.rgb, top, patch, loaded.index)
        where = "summed over the patches" if patch is None else f"at patch {tuple(patch)}"
        title = (f"{self.handle.name} · {Path(self.image).name} · block {found.layer} output · {loaded.name} · "
                 f"activation {where}")
        return FeatureTable(title, found, loaded)

    def show_feature(self, sae: str | os.PathLike | SparseAutoencoder, feature: int,
                     index: str | os.PathLike | SAEIndex | None = None):
        """Feature ``feature`` of ``sae``: its activation over the image with a colour bar and, with a feature
        index (``index``, or the one beside the SAE file), its top patches over the index's folder, as a matplotlib
        Figure (`plots.sae.feature_figure`) titled with model, image, block, SAE, feature and label."""
        from vit_inspect.plots.sae import feature_figure

        table = self.features(sae, 1, None, index)
        fmap = table.found.feature_map(feature)
        entry = table.sae.index.feature(feature) if table.sae.index is not None else None
        label = f" · {entry.label}" if entry is not None and entry.label else ""
        title = (f"{self.handle.name} · {Path(self.image).name} · block {table.found.layer} output · "
                 f"{table.sae.name} · feature {int(feature)}{label}")
        return feature_figure(self.result.rgb, fmap, title, entry,
                              table.sae.index.patch_size if table.sae.index is not None else None)

    def record(self) -> dict:
        """The JSON object `vit-inspect analyze` prints for this image (`methods.method_record`): model,
        weights, classes, geometry, top-5, mean attention distance and every recorded method's map, rounded
        for JSON."""
        return method_record(self.handle, self.result, self.image)

    def to_npz(self, path: str | os.PathLike | None = None) -> Path:
        """Write the pass's arrays and the recorded methods' maps at full precision (`methods.method_arrays`)
        and ``record``, the
        `record` as a JSON string, to a compressed ``.npz`` file (default: ``<image stem>.npz`` in the current
        folder; a folder the path names is made); returns its path. Read it back with ``np.load(path)`` and
        ``json.loads(str(f["record"]))``."""
        path = Path(path) if path is not None else Path(f"{Path(self.image).stem or 'image'}.npz")
        path.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        np.savez_compressed(buffer, record=np.array(json.dumps(self.record())),
                            **method_arrays(self.handle, self.result))
        path.write_bytes(buffer.getvalue())
        return path

    def _repr_html_(self) -> str:
        """Jupyter's view: the title, the top-5 classes and every map of the pass (PIL panels, drawn in ms),
        a small crop enlarged to be seen (`legible`)."""
        from vit_inspect.plots.maps import maps_panel, titled_pass_maps

        maps, relu, units = titled_pass_maps(self.result, self.handle)
        picture = maps_panel(legible(self.result.rgb), maps, relu_names=relu, units=units)
        top = topk_table(self.top()) if self.result.probs.size else "<p>This model has no classification head.</p>"
        return (f"<div><p><b>{html.escape(self.title())}</b></p>{top}"
                f"{preview_tag(picture, 'maps of ' + self.title())}</div>")

    def __repr__(self) -> str:
        top = self.top(1)
        best = f", top-1 {top[0]['label']} ({top[0]['prob']:.1%})" if top else ""
        layout = self.result.layout
        return (f"Analysis({self.handle.name}, {self.image!r}, {layout.grid_h}x{layout.grid_w} patches, "
                f"{self.result.depth} layers x {self.result.num_heads} heads{best})")
