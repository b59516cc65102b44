"""SAE features in a notebook: an SAE given as a path or as loaded, its index beside it, and the table of an
image's features (`Analysis.features`)."""
from __future__ import annotations

import html
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.sae_file import SparseAutoencoder
from vit_inspect.core.sae_index import SAEIndex, index_path, read_index
from vit_inspect.core.sae_load import load_sae
from vit_inspect.passes.sae import ImageFeatures


@dataclass(frozen=True)
class LoadedSAE:
    """An SAE with the name shown for it and its feature index (None without one)."""

    sae: SparseAutoencoder
    name: str  # the file's name, or "SAE (F features, block L)" for one passed loaded
    index: SAEIndex | None


def loaded_sae(handle: ViTHandle, sae: str | os.PathLike | SparseAutoencoder,
               index: str | os.PathLike | SAEIndex | None = None) -> LoadedSAE:
    """`sae` loaded when a path (`load_sae`), with `index`: a path or a loaded index, or by default the index
    beside the SAE file when there is one. An index of another SAE is refused when given, and only warned about
    when found beside the SAE (the features are then shown without labels)."""
    if isinstance(sae, SparseAutoencoder):
        model, name, beside = sae, f"SAE ({sae.info.features} features, block {sae.info.layer})", None
    else:
        model, name, beside = load_sae(sae, model=handle.name), Path(sae).name, index_path(sae)
    if isinstance(index, SAEIndex):
        from vit_inspect.core.sae_index import check_index_fits

        check_index_fits(index, model)
        return LoadedSAE(model, name, index)
    if index is not None:
        return LoadedSAE(model, name, read_index(index, model))
    if beside is not None and beside.is_file():
        try:
            return LoadedSAE(model, name, read_index(beside, model))
        except VitInspectError as exc:
            warnings.warn(f"the index beside the SAE is not used: {exc}", stacklevel=3)
    return LoadedSAE(model, name, None)


@dataclass(frozen=True)
class FeatureTable:
    """An image's top SAE features (`Analysis.features`): ``rows`` as dicts, an HTML table in Jupyter."""

    title: str  # model · image · block · SAE, and where the features were ranked
    found: ImageFeatures  # the codes of every patch and the ranked features
    sae: LoadedSAE

    @property
    def rows(self) -> list[dict]:
        """{feature, activation, peak, peak_patch, label} per feature, largest activation first."""
        return [f.as_dict() for f in self.found.features]

    def _repr_html_(self) -> str:
        body = "".join(f"<tr><td>{r['feature']}</td><td>{r['activation']:.3f}</td><td>{r['peak']:.3f}</td>"
                       f"<td>{tuple(r['peak_patch'])}</td><td>{html.escape(r['label'])}</td></tr>" for r in self.rows)
        return (f"<div><p><b>{html.escape(self.title)}</b></p><table><thead><tr><th>feature</th><th>activation</th>"
                "<th>peak</th><th>peak patch</th><th>label (index)</th></tr></thead>"
                f"<tbody>{body}</tbody></table></div>")

    def __repr__(self) -> str:
        lines = [self.title] + [f"  {r['feature']:>6}  {r['activation']:8.3f}  peak {r['peak']:.3f} at "
                                f"{tuple(r['peak_patch'])}  {r['label']}" for r in self.rows]
        return "\n".join(lines)
