import io
import subprocess
import sys

import matplotlib
import numpy as np
import pytest
from PIL import Image

from vit_inspect.plots.canvas import (
    CAPTION_LINE_PIXELS,
    COLORBAR_PIXELS,
    MOSAIC_GAP,
    figure_to_png,
    figure_to_rgb,
    map_range,
)
from vit_inspect.plots.distance import attention_distance_figure
from vit_inspect.plots.heads import (
    LENS_PLOT_PIXELS,
    NOT_FINITE_COLOR,
    head_heatmap_panel,
    lens_panel,
)
from vit_inspect.plots.maps import (
    HEAD_TILE_PIXELS,
    MARKER_COLOR,
    heads_panel,
    map_panel,
    maps_figure,
    maps_panel,
    overlay,
)

PATCH = 15  # odd patch side: bilinear upsampling hits the grid value exactly at pixel (7, 7) of each patch
GRID_H, GRID_W = 2, 3
GRAY = np.full((GRID_H * PATCH, GRID_W * PATCH, 3), 128, dtype=np.uint8)  # (30, 45, 3)


def centre(image: np.ndarray, row: int, col: int) -> np.ndarray:
    return image[row * PATCH + PATCH // 2, col * PATCH + PATCH // 2].astype(int)


def blend(value: float, alpha: float = 0.55, cmap: str = "inferno") -> np.ndarray:
    """Expected pixel over GRAY for a normalised map value."""
    colour = np.asarray(matplotlib.colormaps[cmap](value)[:3])
    return np.rint(((1 - alpha) * 128 / 255 + alpha * colour) * 255).astype(int)


def one_hot_map(row: int, col: int, low: float = 0.0) -> np.ndarray:
    grid_map = np.full((GRID_H, GRID_W), low)
    grid_map[row, col] = 1.0
    return grid_map


def test_overlay_shape_dtype_and_hot_patch():
    out = overlay(GRAY, one_hot_map(1, 2))
    assert out.shape == GRAY.shape and out.dtype == np.uint8
    np.testing.assert_array_equal(centre(out, 1, 2), blend(1.0))
    np.testing.assert_array_equal(centre(out, 0, 0), blend(0.0))
    hot = centre(out, 1, 2).sum()
    assert all(hot > centre(out, row, col).sum() + 100 for row in range(GRID_H) for col in range(GRID_W)
               if (row, col) != (1, 2))


def test_overlay_normalises_min_max_and_blends_with_alpha():
    scaled = overlay(GRAY, 10.0 * one_hot_map(1, 2, low=-5.0), cmap="viridis", alpha=1.0)
    np.testing.assert_array_equal(scaled, overlay(GRAY, one_hot_map(1, 2), cmap="viridis", alpha=1.0))
    np.testing.assert_array_equal(centre(scaled, 1, 2), blend(1.0, alpha=1.0, cmap="viridis"))
    np.testing.assert_array_equal(overlay(GRAY, one_hot_map(1, 2), alpha=0.0), GRAY)


def test_overlay_relu():
    grid_map = np.array([[-1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    plain = overlay(GRAY, grid_map)
    np.testing.assert_array_equal(centre(plain, 0, 0), blend(0.0))
    np.testing.assert_array_equal(centre(plain, 0, 1), blend(0.5))
    rectified = overlay(GRAY, grid_map, relu=True)
    np.testing.assert_array_equal(centre(rectified, 0, 0), blend(0.0))
    np.testing.assert_array_equal(centre(rectified, 0, 1), blend(0.0))
    np.testing.assert_array_equal(centre(rectified, 1, 2), blend(1.0))


@pytest.mark.parametrize("grid_map", [np.zeros((GRID_H, GRID_W)), np.full((GRID_H, GRID_W), 3.5),
                                      np.full((GRID_H, GRID_W), -2.0)])
def test_constant_map_shows_the_colormap_low_end(grid_map):
    out = overlay(GRAY, grid_map, relu=True)
    np.testing.assert_array_equal(out, np.broadcast_to(blend(0.0), out.shape))


def test_marker_outlines_the_patch():
    flat = overlay(GRAY, np.zeros((GRID_H, GRID_W)))
    out = overlay(GRAY, np.zeros((GRID_H, GRID_W)), marker=(1, 2))
    top, left, bottom, right = PATCH, 2 * PATCH, 2 * PATCH - 1, 3 * PATCH - 1  # patch (1, 2) spans rows 15..29, cols 30..44
    for y, x in [(top, left), (top, left + 7), (bottom, right), (top + 7, left), (top + 7, right)]:
        np.testing.assert_array_equal(out[y, x], MARKER_COLOR)
    np.testing.assert_array_equal(centre(out, 1, 2), centre(flat, 1, 2))
    np.testing.assert_array_equal(out[:PATCH], flat[:PATCH])  # nothing outside the patch changes
    np.testing.assert_array_equal(out[:, :2 * PATCH], flat[:, :2 * PATCH])
    with pytest.raises(ValueError, match="outside"):
        overlay(GRAY, np.zeros((GRID_H, GRID_W)), marker=(2, 0))


def test_overlay_rejects_bad_images():
    with pytest.raises(ValueError, match="uint8"):
        overlay(GRAY.astype(np.float32), np.zeros((GRID_H, GRID_W)))


def test_maps_figure_shows_each_overlay_with_its_title():
    maps = {"rollout": one_hot_map(0, 1), "grad-cam": np.array([[-1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])}
    fig = maps_figure(GRAY, maps, relu_names=("grad-cam",), marker=(0, 0))
    panels = [ax for ax in fig.axes if ax.images]  # the other axes are the colour bars, one per map
    assert [ax.get_title() for ax in panels] == ["rollout", "grad-cam"] and len(fig.axes) == 4
    np.testing.assert_array_equal(panels[0].images[0].get_array(), overlay(GRAY, maps["rollout"], marker=(0, 0)))
    np.testing.assert_array_equal(panels[1].images[0].get_array(),
                                  overlay(GRAY, maps["grad-cam"], relu=True, marker=(0, 0)))
    with pytest.raises(ValueError, match="no maps"):
        maps_figure(GRAY, {})


def test_maps_mosaic_lays_out_one_map_panel_per_map_under_the_title():
    maps = {"rollout": one_hot_map(0, 1), "grad-cam": np.array([[-1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]),
            "third": np.arange(6.0).reshape(GRID_H, GRID_W)}
    shown = maps_panel(GRAY, maps, relu_names=("grad-cam",), marker=(0, 0), units={"rollout": "fraction"},
                        ranges={"third": (0.0, 10.0)}, title="model M · class 5", columns=2)
    first = map_panel(GRAY, maps["rollout"], "rollout", "fraction", *map_range(maps["rollout"], False), marker=(0, 0))
    second = map_panel(GRAY, maps["grad-cam"], "grad-cam", "value", *map_range(maps["grad-cam"], True), relu=True,
                       marker=(0, 0))
    third = map_panel(GRAY, maps["third"], "third", "value", 0.0, 10.0, marker=(0, 0))  # its fixed range
    assert map_range(maps["grad-cam"], True) == (0.0, 1.0)  # ReLU'd: the -1 is not in the range
    title_h = CAPTION_LINE_PIXELS + 8  # one line
    row_h = max(first.shape[0], second.shape[0])
    assert shown.shape == (title_h + row_h + MOSAIC_GAP + third.shape[0], 2 * first.shape[1] + MOSAIC_GAP, 3)
    top, right = title_h, first.shape[1] + MOSAIC_GAP
    np.testing.assert_array_equal(shown[top:top + first.shape[0], :first.shape[1]], first)
    np.testing.assert_array_equal(shown[top:top + second.shape[0], right:right + second.shape[1]], second)
    np.testing.assert_array_equal(shown[top + row_h + MOSAIC_GAP:, :third.shape[1]], third)
    assert (shown[top:, first.shape[1]:right] == 255).all() and (shown[top + row_h + MOSAIC_GAP:, third.shape[1]:] == 255).all()
    assert (shown[:title_h] < 100).sum() > 40  # the title's black text
    untitled = maps_panel(GRAY, maps, relu_names=("grad-cam",), marker=(0, 0), units={"rollout": "fraction"},
                           ranges={"third": (0.0, 10.0)}, columns=2)
    np.testing.assert_array_equal(untitled, shown[title_h:])
    one_row = maps_panel(GRAY, maps, relu_names=("grad-cam",), marker=(0, 0), units={"rollout": "fraction"},
                          ranges={"third": (0.0, 10.0)})  # four columns by default: one row
    assert one_row.shape[1] == 3 * first.shape[1] + 2 * MOSAIC_GAP
    with pytest.raises(ValueError, match="no maps"):
        maps_panel(GRAY, {})
    with pytest.raises(ValueError, match="columns"):
        maps_panel(GRAY, maps, columns=0)


def test_heads_mosaic_lays_out_every_head_on_one_colour_range_with_one_colour_bar():
    maps = np.stack([one_hot_map(0, 0), one_hot_map(1, 2), 0.5 * one_hot_map(0, 1)])  # (3, 2, 3), range 0..1
    masks = np.zeros((3, GRID_H, GRID_W), dtype=bool)
    masks[1, 1, 2] = True
    shown = heads_panel(GRAY, maps, ["h0", "h1", "h2"], "weight", title="layer 4", masks=masks, columns=2)
    title_h, head_h = CAPTION_LINE_PIXELS + 8, CAPTION_LINE_PIXELS + 4  # one line each
    tile_h = head_h + GRAY.shape[0]  # a 30 x 45 crop is not scaled
    grid_w = 2 * GRAY.shape[1] + MOSAIC_GAP
    assert shown.shape == (title_h + 2 * tile_h + MOSAIC_GAP, grid_w + COLORBAR_PIXELS, 3)
    for index, (row, col) in enumerate([(0, 0), (0, 1), (1, 0)]):
        top, left = title_h + row * (tile_h + MOSAIC_GAP) + head_h, col * (GRAY.shape[1] + MOSAIC_GAP)
        expected = overlay(GRAY, maps[index], vmin=0.0, vmax=1.0, mask=masks[index])  # shared: head 2 peaks at 0.5
        np.testing.assert_array_equal(shown[top:top + GRAY.shape[0], left:left + GRAY.shape[1]], expected)
        assert (shown[top - head_h:top, left:left + GRAY.shape[1]] < 100).any()  # its title
    bar = shown[title_h + head_h + 1:title_h + 2 * tile_h + MOSAIC_GAP - 1, grid_w + 14]  # inside the outline
    assert tuple(bar[0]) != tuple(bar[-1]) and (bar[-1] < 20).all()  # inferno: bright at the top, black at 0
    assert (shown[:title_h] < 100).sum() > 20
    large = np.zeros((2 * HEAD_TILE_PIXELS, 3 * HEAD_TILE_PIXELS, 3), dtype=np.uint8)  # scaled to fit a tile
    wide = heads_panel(large, maps, ["a", "b", "c"], "weight", columns=3)
    assert wide.shape[1] == 3 * HEAD_TILE_PIXELS + 2 * MOSAIC_GAP + COLORBAR_PIXELS
    assert wide.shape[0] == head_h + round(HEAD_TILE_PIXELS * 2 / 3)
    scaled = np.zeros((round(HEAD_TILE_PIXELS * 2 / 3), HEAD_TILE_PIXELS, 3), dtype=np.uint8)  # the photo, scaled
    np.testing.assert_array_equal(wide[head_h:, :HEAD_TILE_PIXELS], overlay(scaled, maps[0], vmin=0.0, vmax=1.0))
    with pytest.raises(ValueError, match="3 maps but 2 titles"):
        heads_panel(GRAY, maps, ["a", "b"], "weight")


def test_heatmap_panel_colours_each_cell_on_a_scale_centred_on_zero_and_gives_the_cells_box():
    values = np.array([[1.0, -3.0], [0.5, 0.0], [0.0, 2.0]])  # (3 layers, 2 heads), max |value| 3
    image, box = head_heatmap_panel(values, "drop (tiny, class 3)", "logits", selected=(1, 0))
    x0, y0, x1, y1 = box
    assert (x1 - x0, y1 - y0) == (2 * 80, 3 * 34)  # cells of 130 x 133 wanted, clipped to 80 x 34
    colours = matplotlib.colormaps["RdBu_r"]
    for (layer, head), value in np.ndenumerate(values):  # -3 -> the map's low end, 0 -> its middle, 3 -> its top
        expected = (np.array(colours((value + 3.0) / 6.0)[:3]) * 255).astype(np.uint8)
        np.testing.assert_array_equal(image[int(y0) + layer * 34 + 17, int(x0) + head * 80 + 40], expected)
    inside = image[int(y0) + 34:int(y0) + 68, int(x0):int(x0) + 80]  # the selected cell: a 2-pixel black outline
    assert (inside[[0, 1, -2, -1], :] == 0).all() and (inside[:, [0, 1, -2, -1]] == 0).all()
    assert (inside[2:-2, 2:-2] == inside[17, 40]).all() and (inside[17, 40] > 200).all()  # 0.5 of 3: pale red
    other = image[int(y0):int(y0) + 34, int(x0) + 80:int(x0) + 160]  # not selected: one colour to its edges
    assert (other == other[0, 0]).all()
    bar = image[int(y0) + 1:int(y1) - 1, int(x1) + 14]  # the colour bar, inside its outline: top +3, bottom -3
    ramp = colours(np.linspace(1.0, 0.0, int(y1 - y0)))[:, :3]  # its rows, the outline drawn over the first and last
    np.testing.assert_array_equal(bar, (ramp[1:-1] * 255).astype(np.uint8))
    assert (image[:int(y0)] < 100).sum() > 20  # the title
    plain, plain_box = head_heatmap_panel(values, "", "logits")
    assert plain_box[1] == y0 - CAPTION_LINE_PIXELS - 8 and plain.shape[0] == image.shape[0] - CAPTION_LINE_PIXELS - 8
    flat, flat_box = head_heatmap_panel(np.full((2, 2), 7.0), "t", "nats", diverging=False)  # no range: the low end
    np.testing.assert_array_equal(flat[int(flat_box[1]) + 5, int(flat_box[0]) + 5],
                                  (np.array(matplotlib.colormaps["viridis"](0.0)[:3]) * 255).astype(np.uint8))
    tall, tall_box = head_heatmap_panel(np.zeros((40, 16)), "t", "nats")  # DINOv2-g: cells of 16 x 10 pixels
    assert (tall_box[2] - tall_box[0], tall_box[3] - tall_box[1]) == (16 * 16, 40 * 10)
    with pytest.raises(ValueError, match="depth, heads"):
        head_heatmap_panel(np.zeros(3), "t", "u")
    gaps, gaps_box = head_heatmap_panel(np.array([[np.nan, 1.0], [-np.inf, -0.5]]), "t", "u")  # grey, out of the range
    corner = [(int(gaps_box[1]) + 17 + 34 * layer, int(gaps_box[0]) + 40 + 80 * head)
              for layer in (0, 1) for head in (0, 1)]  # cell centres: (0, 0), (0, 1), (1, 0), (1, 1)
    np.testing.assert_array_equal([gaps[y, x] for y, x in corner[::2]], [NOT_FINITE_COLOR, NOT_FINITE_COLOR])
    np.testing.assert_array_equal(gaps[corner[1]], (np.array(colours(1.0)[:3]) * 255).astype(np.uint8))  # 1 = max
    np.testing.assert_array_equal(gaps[corner[3]], (np.array(colours(0.25)[:3]) * 255).astype(np.uint8))  # -0.5


def test_lens_panel_puts_each_block_at_its_rank_on_a_log_axis_coloured_by_probability():
    ranks, probs = np.array([100, 10, 1, 1]), np.array([0.0, 0.25, 0.5, 1.0])
    shown = lens_panel(ranks, probs, "lens (tiny)")
    plain = lens_panel(ranks, probs, "")
    band = CAPTION_LINE_PIXELS + 8
    np.testing.assert_array_equal(shown[band:], plain)
    left, top = 56, 8  # the axes' corner; two decades over 230 pixels: rank 10 halfway down
    width, height = LENS_PLOT_PIXELS
    xs = left + (np.arange(4) + 0.5) * width / 4
    ys = top + np.array([2.0, 1.0, 0.0, 0.0]) / 2 * (height - 1)
    viridis = matplotlib.colormaps["viridis"]
    for x, y, p in zip(xs, ys, probs):  # each dot's centre is the colour of its probability
        np.testing.assert_array_equal(plain[int(round(y)), int(round(x))], (np.array(viridis(p)[:3]) * 255).astype(np.uint8))
    assert plain.shape == (top + height + 40, left + width + COLORBAR_PIXELS, 3)
    assert (plain[top + 100, left + 10] == 255).all()  # empty axes are white
    deep = lens_panel(np.array([1, 2000]), np.array([0.5, 0.1]), "")  # down to 10^4
    y = top + np.log10(2000) / 4 * (height - 1)  # 3.3 of the 4 decades down: pixel 197
    np.testing.assert_array_equal(deep[int(round(y)), int(round(left + 0.75 * width))],
                                  (np.array(viridis(0.1)[:3]) * 255).astype(np.uint8))
    with pytest.raises(ValueError, match="one rank and one probability"):
        lens_panel(np.array([1, 2]), np.array([0.5]), "t")
    with pytest.raises(ValueError, match="start at 1"):
        lens_panel(np.array([0, 2]), np.array([0.5, 0.4]), "t")


def test_attention_distance_figure():
    distances = np.array([[10.0, 20.0, 30.0], [40.0, 50.0, 60.0]])  # (depth=2, heads=3) px

    fig = attention_distance_figure(distances, highlight=(1, None), image_width=224, title="ViT-T")

    ax, = fig.axes
    assert ax.get_xlabel() == "network depth (layer)"
    assert ax.get_ylabel() == "mean attention distance (pixels)"
    assert ax.get_title() == "ViT-T"
    heads, highlighted = ax.collections
    np.testing.assert_array_equal(heads.get_offsets(), [[0, 10], [0, 20], [0, 30], [1, 40], [1, 50], [1, 60]])
    np.testing.assert_array_equal(highlighted.get_offsets(), [[1, 40], [1, 50], [1, 60]])
    assert highlighted.get_sizes()[0] > heads.get_sizes()[0]
    assert not np.allclose(highlighted.get_facecolors()[0], heads.get_facecolors()[0])
    secondary, = ax.child_axes
    assert secondary.get_ylabel() == "fraction of image width"

    one_head = attention_distance_figure(distances, highlight=(0, 2))
    np.testing.assert_array_equal(one_head.axes[0].collections[1].get_offsets(), [[0, 30]])
    assert one_head.axes[0].child_axes == []
    with pytest.raises(ValueError, match="head 3"):
        attention_distance_figure(distances, highlight=(0, 3))


def test_figure_rendering():
    fig = attention_distance_figure(np.ones((2, 2)))
    png = figure_to_png(fig)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    rgb = figure_to_rgb(fig)
    with Image.open(io.BytesIO(png)) as picture:
        np.testing.assert_array_equal(np.asarray(picture.convert("RGB")), rgb)
    assert rgb.dtype == np.uint8 and rgb.min() < 128 < rgb.max()  # dark points and text on a white background


LONG_TITLE = "vit_base_patch16_224.augreg2_in21k_ft_in1k, chelsea.png, class Egyptian cat (#285): " * 2


def white_border(rgb: np.ndarray, pixels: int = 2) -> bool:
    """Nothing drawn within ``pixels`` of the picture's edges: no text or axes runs off it."""
    return all((edge >= 250).all() for edge in (rgb[:pixels], rgb[-pixels:], rgb[:, :pixels], rgb[:, -pixels:]))


@pytest.mark.parametrize("name", ["distance", "heatmap", "lens", "filters", "position", "maps"])
def test_command_line_figures_are_never_clipped(name):
    """A title or label wider or taller than its figure grows the saved picture (the command line's `model`
    figure once lost both ends of its title): every figure the command line writes has a white border."""
    from vit_inspect.analysis.filters import FilterPCA
    from vit_inspect.plots import heads, model

    rng = np.random.default_rng(0)
    rgb = (rng.random((224, 224, 3)) * 255).astype(np.uint8)
    figures = {
        "distance": lambda: attention_distance_figure(rng.random((12, 3)) * 100, image_width=224,
                                                      title=f"mean attention distance: {LONG_TITLE}"),
        "heatmap": lambda: heads.head_heatmap_figure(rng.normal(size=(12, 3)), f"attention entropy ({LONG_TITLE})",
                                                     "nats"),
        "lens": lambda: heads.lens_figure(np.arange(12, 0, -1), np.linspace(0, 1, 12), LONG_TITLE),
        "filters": lambda: model.filter_pca_figure(FilterPCA(rng.random((28, 16, 16, 3)), np.full(28, 0.01)),
                                                   model=LONG_TITLE.replace(", ", "_").replace(" ", "_")),
        "position": lambda: model.pos_similarity_figure(rng.random((14, 14, 14, 14)), title=LONG_TITLE),
        "maps": lambda: maps_figure(rgb, {"attention": rng.random((14, 14))}, title=LONG_TITLE),
    }
    picture = figure_to_rgb(figures[name]())
    assert white_border(picture)
    assert (picture[: picture.shape[0] // 3] < 128).any()  # the title is drawn, at the top


def test_plotting_does_not_import_pyplot():
    code = "import sys, vit_inspect.plots.canvas; assert 'matplotlib.pyplot' not in sys.modules, 'pyplot imported'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_distance_scatter_once_renders_on_its_first_draw_and_keeps_it(monkeypatch):
    from vit_inspect.plots import distance as distance_plots

    distances = np.array([[10.0, 50.0, 90.0], [30.0, 70.0, 110.0]])
    rendered = []
    render = distance_plots.attention_distance_panel
    monkeypatch.setattr(distance_plots, "attention_distance_panel", lambda *a, **k: rendered.append(a) or render(*a, **k))
    once = distance_plots.DistanceScatterOnce(distances, image_width=224, title="t")
    distances[0, 0] = 99.0  # the holder keeps its own copy
    assert rendered == []  # nothing rendered for a new image until a panel needs it
    first, again = once.draw((1, 2)), once.draw((0, None))
    assert len(rendered) == 1  # rendered once, kept for every later highlight
    alike = render(np.array([[10.0, 50.0, 90.0], [30.0, 70.0, 110.0]]), image_width=224, title="t")
    np.testing.assert_array_equal(first, alike.draw((1, 2)))
    np.testing.assert_array_equal(again, alike.draw((0, None)))


def test_distance_scatter_paints_highlight_where_the_dot_is():
    import matplotlib.colors

    from vit_inspect.plots.distance import (
        HEAD_COLOR,
        HIGHLIGHT_COLOR,
        attention_distance_panel,
    )

    distances = np.array([[10.0, 50.0, 90.0], [30.0, 70.0, 110.0]])  # (depth 2, heads 3)
    scatter = attention_distance_panel(distances, image_width=224, title="t")
    head_rgb = np.array(matplotlib.colors.to_rgb(HEAD_COLOR)) * 255
    red = np.array(matplotlib.colors.to_rgb(HIGHLIGHT_COLOR)) * 255
    # every head's dot is where the background says it is, in the head colour
    for layer in range(2):
        for head in range(3):
            x, y = np.round(scatter.points[layer, head]).astype(int)
            assert np.abs(scatter.background[y, x] - head_rgb).max() < 30
    # a higher distance is drawn higher up (smaller row), a later layer further right
    assert scatter.points[0, 2, 1] < scatter.points[0, 0, 1] and scatter.points[1, 0, 0] > scatter.points[0, 0, 0]
    drawn = scatter.draw((1, 2))
    x, y = np.round(scatter.points[1, 2]).astype(int)
    assert np.abs(drawn[y, x] - red).max() < 2
    changed = np.argwhere(np.any(drawn != scatter.background, axis=-1))  # (n, 2) rows, cols
    legend_x, legend_y = scatter.legend
    in_legend = (np.abs(changed[:, 0] - legend_y) <= 7) & (changed[:, 1] >= legend_x)
    assert np.abs(changed[~in_legend] - [y, x]).max() <= scatter.radius + 1  # else only the legend's words
    assert in_legend.any()  # they name the highlight: a whole layer's words differ from one head's
    words = slice(int(legend_y) - 7, int(legend_y) + 8), slice(int(legend_x), None)
    assert not np.array_equal(drawn[words], scatter.draw((0, None))[words])
    assert not np.array_equal(drawn[words], scatter.draw((1, 1))[words])
    whole_layer = scatter.draw((0, None))
    assert all(np.abs(whole_layer[int(round(py)), int(round(px))] - red).max() < 2 for px, py in scatter.points[0])
    with pytest.raises(ValueError):
        scatter.draw((2, 0))


def test_distance_scatter_puts_dots_on_a_linear_axis_from_zero_under_the_title():
    from vit_inspect.plots.canvas import SCATTER_PLOT_PIXELS
    from vit_inspect.plots.distance import attention_distance_panel

    distances = np.array([[10.0, 50.0, 90.0], [30.0, 70.0, 110.0]])
    scatter = attention_distance_panel(distances, image_width=224, title="t")
    untitled = attention_distance_panel(distances, image_width=224)
    np.testing.assert_allclose(scatter.points[..., 1] - untitled.points[..., 1], CAPTION_LINE_PIXELS + 8)
    np.testing.assert_array_equal(scatter.background[CAPTION_LINE_PIXELS + 8:], untitled.background)
    plot_h = SCATTER_PLOT_PIXELS[1]
    highest = 1.08 * 110 + 1  # the axis runs from 0 to this, bottom to top
    rows = untitled.points[..., 1]
    np.testing.assert_allclose(rows, 8 + plot_h - 1 - distances / highest * (plot_h - 1))  # linear, 0 at the bottom
    np.testing.assert_allclose(untitled.points[:, :, 0], [[62 + 95] * 3, [62 + 285] * 3])  # layer centres, 190 px apart
    assert attention_distance_panel(distances).background.shape[1] == untitled.background.shape[1] - 66  # no fraction axis
    fixed = attention_distance_panel(distances, image_width=224, selectable=False)  # nothing to select (a dataset's mean)
    assert fixed.legend is None
    np.testing.assert_array_equal(fixed.points, untitled.points)
    differ = np.argwhere(np.any(fixed.background != untitled.background, axis=-1))
    assert len(differ) and differ[:, 0].min() >= 8 + plot_h + 36  # only the legend, under the axes, lost an entry
    assert differ[:, 1].min() >= 62 + 86 - 6  # the selected entry; the head entry stays
    with pytest.raises(ValueError, match="depth, heads"):
        attention_distance_panel(np.zeros(3))
    with pytest.raises(ValueError, match="finite"):
        attention_distance_panel(np.array([[np.nan, 1.0]]))


# ------------------------------------------------------------------------------------------------ PNG

def _png_chunks(data: bytes) -> list[tuple[bytes, bytes, int]]:
    """[(type, data, stored CRC)] of a PNG file, read by hand."""
    import struct

    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, at = [], 8
    while at < len(data):
        (length,) = struct.unpack(">I", data[at:at + 4])
        kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length:at + 12 + length])
        chunks.append((kind, body, crc))
        at += 12 + length
    return chunks


def test_png_bytes_by_hand():
    """A 2 x 2 greyscale picture: the header's fields, the rows' filter types (0 for the first row, 2 "Up"
    after it) and their bytes (each minus the byte above, modulo 256), and every chunk's CRC-32."""
    import zlib

    from vit_inspect.plots.canvas import PNG_LEVEL, encode_png

    data = encode_png(np.array([[10, 250], [5, 3]], dtype=np.uint8))
    chunks = _png_chunks(data)
    assert [kind for kind, _, _ in chunks] == [b"IHDR", b"IDAT", b"IEND"]
    assert chunks[0][1] == bytes([0, 0, 0, 2, 0, 0, 0, 2, 8, 0, 0, 0, 0])  # width 2, height 2, 8 bits, grey
    assert zlib.decompress(chunks[1][1]) == bytes([0, 10, 250, 2, (5 - 10) % 256, (3 - 250) % 256])
    assert chunks[1][1][:2] == zlib.compress(b"", PNG_LEVEL)[:2]  # the zlib header of the level used
    assert chunks[2][1] == b""
    assert all(crc == zlib.crc32(kind + body) for kind, body, crc in chunks)


@pytest.mark.parametrize("shape", [(1, 1), (37, 53), (37, 53, 3), (5, 7, 4), (200, 3, 3)])
def test_png_round_trips_through_pil_exactly(shape):
    from vit_inspect.plots.canvas import encode_png

    rng = np.random.default_rng(sum(shape))
    picture = rng.integers(0, 256, shape).astype(np.uint8)
    picture[:, ::3] = 255  # bytes next to 0 and 255 wrap around in the filter
    picture[::2, 1::3] = 0
    data = encode_png(picture)
    with Image.open(io.BytesIO(data)) as decoded:
        decoded.verify()  # PIL checks every chunk's CRC
    with Image.open(io.BytesIO(data)) as decoded:
        assert decoded.mode == {1: "L", 3: "RGB", 4: "RGBA"}[1 if len(shape) == 2 else shape[2]]
        np.testing.assert_array_equal(np.asarray(decoded), picture)


def test_png_of_a_map_panel_is_small_and_exact():
    from PIL import Image

    from vit_inspect.plots.canvas import encode_png
    from vit_inspect.plots.maps import map_panel

    rgb = np.random.default_rng(1).integers(0, 256, (224, 224, 3)).astype(np.uint8) // 2 + 60
    grid = np.add.outer(np.arange(14.0), np.arange(14.0))
    panel = map_panel(rgb, grid, "a caption\nits second line", "attention weight")
    data = encode_png(panel)
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(data))), panel)
    assert len(data) < 0.75 * panel.nbytes  # compressed, not stored


@pytest.mark.parametrize("bad", [np.zeros((4, 4), np.float32), np.zeros((4, 4, 2), np.uint8),
                                 np.zeros((0, 4, 3), np.uint8), np.zeros((2, 2, 2, 3), np.uint8)])
def test_png_refuses_what_it_cannot_write(bad):
    from vit_inspect.plots.canvas import encode_png

    with pytest.raises(ValueError, match="uint8 picture"):
        encode_png(bad)


def test_png_is_drawn_by_chromium_to_the_same_pixels():
    """An independent decoder: the browser that shows the app's maps draws the bytes on a canvas."""
    import base64

    from support.browser import CHROMIUM, CHROMIUM_ARGS, require_browser, sync_api
    require_browser()  # skips (or, in CI, fails) without a browser

    from vit_inspect.plots.canvas import encode_png

    rng = np.random.default_rng(7)
    pictures = [rng.integers(0, 256, (29, 41, 3)).astype(np.uint8), rng.integers(0, 256, (13, 9)).astype(np.uint8)]
    urls = ["data:image/png;base64," + base64.b64encode(encode_png(p)).decode() for p in pictures]
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            drawn = browser.new_page().evaluate(
                """async urls => Promise.all(urls.map(async url => {
                    const img = new Image(); img.src = url; await img.decode();
                    const canvas = document.createElement("canvas"); canvas.width = img.width; canvas.height = img.height;
                    const context = canvas.getContext("2d"); context.drawImage(img, 0, 0);
                    return [img.width, img.height, Array.from(context.getImageData(0, 0, img.width, img.height).data)];
                }))""", urls)
        finally:
            browser.close()
    for picture, (width, height, rgba) in zip(pictures, drawn):
        rgba = np.array(rgba, dtype=np.uint8).reshape(height, width, 4)
        expected = picture if picture.ndim == 3 else np.repeat(picture[..., None], 3, axis=2)
        assert (width, height) == picture.shape[1::-1]
        np.testing.assert_array_equal(rgba[..., :3], expected)
        assert (rgba[..., 3] == 255).all()
