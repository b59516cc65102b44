"""The pictures of a model's own parameters (`vit_inspect.plots.model`): filter components and position-embedding
similarity, as matplotlib figures and as PIL pictures."""
import matplotlib
import numpy as np
import pytest

from vit_inspect.analysis.filters import FilterPCA
from vit_inspect.plots.canvas import CAPTION_LINE_PIXELS, COLORBAR_PIXELS, MOSAIC_GAP
from vit_inspect.plots.model import (
    FILTER_CAPTION_PIXELS,
    FILTER_TILE_PIXELS,
    SIMILARITY_PIXELS,
    filter_pca_figure,
    filter_pca_panel,
    pos_similarity_figure,
    pos_similarity_panel,
    similarity_mosaic,
)

GRID_H, GRID_W = 2, 3


def test_filter_pca_figure():
    rng = np.random.default_rng(0)
    ratios = np.array([0.5, 0.2, 0.1, 0.05, 0.04, 0.03, 0.02, 0.01, 0.01, 0.01])
    pca = FilterPCA(components=rng.normal(size=(10, 4, 2, 3)), explained_variance_ratio=ratios)

    fig = filter_pca_figure(pca, ncols=4)

    assert len(fig.axes) == 10
    assert fig.get_suptitle() == "RGB embedding filters (first 10 principal components)"
    assert [ax.get_title() for ax in fig.axes[:3]] == ["50.0%", "20.0%", "10.0%"]
    tile = np.asarray(fig.axes[0].images[0].get_array())
    assert tile.shape == (4, 2, 3)
    assert tile.min() == 0.0 and tile.max() == 1.0
    first = pca.components[0]
    np.testing.assert_allclose(tile, (first - first.min()) / (first.max() - first.min()))
    named = filter_pca_figure(pca, ncols=4, model="deit_tiny_patch16_224")
    assert named.get_suptitle() == "deit_tiny_patch16_224\nRGB embedding filters (first 10 principal components)"


def test_pos_similarity_figure():
    rng = np.random.default_rng(0)
    similarity = rng.uniform(-1, 1, size=(GRID_H, GRID_W, GRID_H, GRID_W))

    mosaic = similarity_mosaic(similarity)
    assert mosaic.shape == (GRID_H * (GRID_H + 1) - 1, GRID_W * (GRID_W + 1) - 1)
    for row in range(GRID_H):
        for col in range(GRID_W):
            top, left = row * (GRID_H + 1), col * (GRID_W + 1)
            np.testing.assert_array_equal(mosaic[top:top + GRID_H, left:left + GRID_W], similarity[row, col])
    assert np.isnan(mosaic[GRID_H]).all() and np.isnan(mosaic[:, GRID_W]).all()  # blank separators
    assert np.isfinite(mosaic).sum() == similarity.size

    fig = pos_similarity_figure(similarity)
    ax, colorbar = fig.axes
    assert colorbar.get_ylabel() == "cosine similarity"
    np.testing.assert_array_equal(ax.images[0].get_array().filled(np.nan), mosaic)
    assert ax.images[0].get_clim() == (-1.0, 1.0)
    assert ax.get_xlabel() == "input patch column" and ax.get_ylabel() == "input patch row"
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(c) for c in range(GRID_W)]  # 0-based, as patches are
    assert [t.get_text() for t in ax.get_yticklabels()] == [str(r) for r in range(GRID_H)]


def test_filter_pca_panel_tiles_by_hand():
    """Each component min-max scaled on its own to rint(255 x), magnified by whole pixels (4 x 2 filters: 26x, to
    104 x 52 pixels, wide enough for the caption), under its variance caption band, four to a row MOSAIC_GAP apart, under the heading."""
    rng = np.random.default_rng(0)
    ratios = np.array([0.5, 0.2, 0.1, 0.05, 0.04, 0.03, 0.02, 0.01, 0.01, 0.01])
    pca = FilterPCA(components=rng.normal(size=(10, 4, 2, 3)), explained_variance_ratio=ratios)

    panel = filter_pca_panel(pca, "model X", ncols=4)

    scale = FILTER_CAPTION_PIXELS // 2
    assert scale == 26 > FILTER_TILE_PIXELS // 4
    caption = CAPTION_LINE_PIXELS + 8  # one line: "50.0%"
    tile_h, tile_w = 4 * scale + caption, 2 * scale
    grid_h = 3 * tile_h + 2 * MOSAIC_GAP  # 4 + 4 + 2 tiles
    assert panel.shape[1] == 4 * tile_w + 3 * MOSAIC_GAP
    band = panel.shape[0] - grid_h
    assert band >= 2 * CAPTION_LINE_PIXELS + 8  # the model's name and the heading
    for index, (row, col) in ((0, (0, 0)), (5, (1, 1)), (9, (2, 1))):
        component = pca.components[index]
        expected = np.rint((component - component.min()) / (component.max() - component.min()) * 255).astype(np.uint8)
        expected = np.repeat(np.repeat(expected, scale, axis=0), scale, axis=1)
        top, left = band + row * (tile_h + MOSAIC_GAP) + caption, col * (tile_w + MOSAIC_GAP)
        np.testing.assert_array_equal(panel[top:top + 4 * scale, left:left + tile_w], expected)
        assert panel[top:top + 4 * scale, left:left + tile_w].min() == 0
        assert panel[top:top + 4 * scale, left:left + tile_w].max() == 255
    assert (panel[band + tile_h:band + tile_h + MOSAIC_GAP] == 255).all()  # the gap between two rows
    assert (panel[band:band + caption] < 128).any()  # the first tile's caption is written
    untitled = filter_pca_panel(pca, ncols=4)
    assert panel.shape[0] - untitled.shape[0] == CAPTION_LINE_PIXELS  # one line more: the title


def test_filter_pca_panel_grey_and_refusals():
    pca = FilterPCA(components=np.arange(24, dtype=float).reshape(2, 3, 4, 1) * [[[[1]]], [[[-1]]]],
                    explained_variance_ratio=np.array([0.6, 0.4]))
    panel = filter_pca_panel(pca, ncols=2)
    scale = FILTER_TILE_PIXELS // 4
    band = panel.shape[0] - (3 * scale + CAPTION_LINE_PIXELS + 8)
    first = panel[band + CAPTION_LINE_PIXELS + 8:, :4 * scale]
    assert (first[..., 0] == first[..., 1]).all() and (first[..., 1] == first[..., 2]).all()  # grey
    assert first[0, 0, 0] == 0 and first[-1, -1, 0] == 255  # 0..11 rising: black at the top left, white last
    second = panel[band + CAPTION_LINE_PIXELS + 8:, 4 * scale + MOSAIC_GAP:]
    assert second[0, 0, 0] == 255 and second[-1, -1, 0] == 0  # the negated component: its own min-max
    with pytest.raises(ValueError, match="1- or 3-channel"):
        filter_pca_panel(FilterPCA(np.zeros((1, 2, 2, 2)), np.ones(1)))
    with pytest.raises(ValueError, match="ncols"):
        filter_pca_panel(pca, ncols=0)


def test_similarity_panel_cells_colour_bar_and_refusal():
    """Every mosaic cell is viridis((v + 1) / 2) as a square of whole pixels, separators white, at
    (24 + 8 digits, 6) without a title; the colour bar runs from viridis(1) at the top to viridis(0)."""
    rng = np.random.default_rng(1)
    similarity = rng.uniform(-1, 1, size=(GRID_H, GRID_W, GRID_H, GRID_W))
    similarity[0, 0, 0, 0], similarity[1, 2, 1, 2] = 1.0, -1.0

    panel = pos_similarity_panel(similarity, title="")

    mosaic = similarity_mosaic(similarity)  # (5, 11)
    scale = round(SIMILARITY_PIXELS / max(mosaic.shape))
    x0, y0 = 24 + 8, 6
    assert panel.shape[1] == x0 + mosaic.shape[1] * scale + COLORBAR_PIXELS
    viridis = matplotlib.colormaps["viridis"]
    for i in range(mosaic.shape[0]):
        for j in range(mosaic.shape[1]):
            block = panel[y0 + i * scale:y0 + (i + 1) * scale, x0 + j * scale:x0 + (j + 1) * scale]
            if np.isnan(mosaic[i, j]):
                expected = [255, 255, 255]
            else:
                expected = (np.asarray(viridis((mosaic[i, j] + 1) / 2)[:3]) * 255).astype(np.uint8)
            assert (block == expected).all(), (i, j)
    top_left = panel[y0, x0]
    np.testing.assert_array_equal(top_left, (np.asarray(viridis(1.0)[:3]) * 255).astype(np.uint8))
    bar_x = x0 + mosaic.shape[1] * scale + 8 + 6
    body_h = mosaic.shape[0] * scale
    np.testing.assert_array_equal(panel[y0 + 1, bar_x], (np.asarray(viridis(1 - 1 / (body_h - 1))[:3]) * 255).astype(np.uint8))
    np.testing.assert_array_equal(panel[y0 + body_h - 2, bar_x],
                                  (np.asarray(viridis(1 / (body_h - 1))[:3]) * 255).astype(np.uint8))
    assert (panel[y0 + body_h + 3:y0 + body_h + 34, x0:x0 + mosaic.shape[1] * scale] < 128).any()  # numbers, label
    titled_panel = pos_similarity_panel(similarity, title="model X")
    assert titled_panel.shape[0] == panel.shape[0] + CAPTION_LINE_PIXELS + 8
    np.testing.assert_array_equal(titled_panel[CAPTION_LINE_PIXELS + 8:], panel)
    with pytest.raises(ValueError, match="grid_h, grid_w, grid_h, grid_w"):
        pos_similarity_panel(np.zeros((2, 3, 3, 2)))
