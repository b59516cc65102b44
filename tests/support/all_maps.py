"""The app's All maps view on a tiny random ViT, without a server: an `Inspector`, a session on a noise image,
and what `draw_panels` hands the mosaic (its maps, units and the notes of missing maps)."""
from __future__ import annotations

import numpy as np
from PIL import Image

from support import tiny_handle
from vit_inspect.core.geometry import InputGeometry
from vit_inspect.plots import maps as map_plots
from vit_inspect.ui.config import AppConfig
from vit_inspect.ui.inspector import Inspector
from vit_inspect.ui.model_cache import ModelCache
from vit_inspect.ui.panels import draw_panels
from vit_inspect.ui.view import READOUT, View

CONTROLS = dict(layer=1, head=0, mean_heads=True, query=READOUT, row=0, col=0, head_fusion="mean",
                discard_ratio=0.0, first_layer=0, last_layer=1, gradcam_layer=1, threshold=None, scale=None,
                rollout_method=None, discard=None)


def session_of():
    """(Inspector, tiny handle, a new session on a 48 x 40 noise image), as the page's image pass makes it."""
    handle = tiny_handle("cls")
    inspector = Inspector(AppConfig(device="cpu"), ModelCache(loader=lambda *a, **k: handle))
    picture = Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 40, 3), dtype=np.uint8))
    session = inspector._new_session(handle, inspector.default_key, picture, "noise.png", InputGeometry(),
                                     False, lambda *a, **k: None)
    return inspector, handle, session


def drawn(session, monkeypatch) -> dict:
    """What `draw_panels` hands the All maps mosaic: its map names and the notes of missing maps."""
    seen = {}
    real = map_plots.maps_panel

    def recording(rgb, maps, **kwargs):
        seen.update(names=list(maps), notes=dict(kwargs.get("notes") or {}), maps=maps,
                    units=kwargs.get("units", {}))
        return real(rgb, maps, **kwargs)

    monkeypatch.setattr(map_plots, "maps_panel", recording)
    seen["picture"] = draw_panels(("compare",), session, View.from_controls(session.result, **CONTROLS))[0]
    return seen
