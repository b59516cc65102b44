"""Comparing models: relative depth, resampling to a common grid, agreement numbers, DINO views."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from support import PHOTOS, tiny_handle, tiny_hf

from vit_inspect.analysis.compare import (
    common_grid,
    map_agreement,
    matching_layer,
    relative_depth,
    resample_map,
)
from vit_inspect.analysis.dino import feature_pca
from vit_inspect.analysis.masks import mass_mask
from vit_inspect.passes.pipeline import analyze_image
from vit_inspect.studies.comparison import (
    agreement_record,
    aligned_maps,
    compare_images,
    token_agreement,
)

# ------------------------------------------------------------------------------------ relative depth

def test_relative_depth_and_layer_mapping():
    assert relative_depth(5, 12) == 0.5 and relative_depth(11, 24) == 0.5 and relative_depth(11, 12) == 1.0
    assert matching_layer(5, 12, 24) == 11  # relative depth 6/12 <-> 12/24
    assert matching_layer(11, 12, 24) == 23 and matching_layer(0, 12, 24) == 1
    assert matching_layer(11, 24, 12) == 5 and matching_layer(10, 24, 12) == 5 and matching_layer(0, 24, 12) == 0
    assert [matching_layer(i, 12, 12) for i in range(12)] == list(range(12))
    assert [matching_layer(i, 12, 6) for i in range(12)] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    for depth, other in ((12, 24), (24, 12), (12, 7), (7, 12), (2, 3)):
        for layer in range(depth):
            mapped = matching_layer(layer, depth, other)
            # the shallowest layer at or beyond the same relative depth
            assert relative_depth(mapped, other) >= relative_depth(layer, depth) - 1e-12
            assert mapped == 0 or relative_depth(mapped - 1, other) < relative_depth(layer, depth)
    with pytest.raises(ValueError, match="out of range"):
        matching_layer(12, 12, 24)


# -------------------------------------------------------------------------------------- common grid

def test_resample_2x2_to_4x4_by_hand():
    grid = np.array([[0.0, 1.0], [2.0, 3.0]])
    out = resample_map(grid, (0, 0, 32, 32), (0, 0, 32, 32), (4, 4))
    # centres of a 4-cell axis sit at map coordinates -0.25, 0.25, 0.75, 1.25 -> clipped 0, .25, .75, 1
    expected_top = np.array([0.0, 0.25, 0.75, 1.0])
    np.testing.assert_allclose(out[0], expected_top)
    np.testing.assert_allclose(out[1], expected_top * 0.75 + (expected_top + 2) * 0.25)
    np.testing.assert_allclose(out[3], expected_top + 2)
    a, b = common_grid(grid, np.arange(16.0).reshape(4, 4))
    assert a.shape == b.shape == (4, 4)
    np.testing.assert_allclose(a, out)
    np.testing.assert_allclose(b, np.arange(16.0).reshape(4, 4))  # the finer map comes back unchanged


def test_common_grid_uses_only_the_shared_part_of_two_crops():
    # A covers x in [0, 4), B covers x in [2, 6): they share A's right column and B's left column
    a = np.array([[0.0, 1.0], [2.0, 3.0]])
    b = np.array([[1.0, 9.0], [3.0, -9.0]])
    ra, rb = common_grid(a, b, (0, 0, 4, 4), (2, 0, 6, 4))
    assert ra.shape == (2, 1)
    np.testing.assert_allclose(ra[:, 0], [1.0, 3.0])
    np.testing.assert_allclose(rb[:, 0], [1.0, 3.0])
    assert map_agreement(a, b, (0, 0, 4, 4), (2, 0, 6, 4), fraction=0.5).spearman == pytest.approx(1.0)
    with pytest.raises(ValueError, match="do not overlap"):
        common_grid(a, b, (0, 0, 4, 4), (5, 0, 9, 4))


# ------------------------------------------------------------------------------------ agreement

def test_identical_maps_agree_fully_and_reversed_maps_not_at_all():
    grid = np.arange(100.0).reshape(10, 10)
    same = map_agreement(grid, grid.copy())
    assert same.spearman == pytest.approx(1.0) and same.top_overlap == 1.0 and same.grid == (10, 10)
    reversed_ = map_agreement(grid, -grid)
    assert reversed_.spearman == pytest.approx(-1.0) and reversed_.top_overlap == 0.0
    # identical maps on different grids (a 5x5 block-average of the same ramp) still rank the same way
    coarse = grid.reshape(5, 2, 5, 2).mean(axis=(1, 3))
    assert map_agreement(coarse, grid).spearman > 0.99


# ------------------------------------------------------------------------------------ DINO masks

def test_mass_mask_on_a_grid_by_hand():
    grid = np.array([[0.5, 0.3], [0.15, 0.05]])
    np.testing.assert_array_equal(mass_mask(grid, 0.6), [[True, True], [False, False]])
    np.testing.assert_array_equal(mass_mask(grid, 0.5), [[True, False], [False, False]])
    np.testing.assert_array_equal(mass_mask(grid, 0.9), [[True, True], [True, False]])
    np.testing.assert_array_equal(mass_mask(grid * 7, 0.6), mass_mask(grid, 0.6))  # unnormalised
    assert not mass_mask(np.zeros((2, 3)), 0.6).any()
    with pytest.raises(ValueError, match="non-negative"):
        mass_mask(-grid, 0.6)


def test_mass_mask_matches_dino_code():
    """The formulation of DINO's visualize_attention.py: sort ascending, keep where cumsum > 1 - threshold."""
    rng = np.random.default_rng(1)
    for _ in range(20):
        attention = rng.dirichlet(np.full(14 * 14, 0.3)).reshape(14, 14)
        flat = torch.from_numpy(attention.ravel())[None]  # (1, P)
        values, index = torch.sort(flat)
        values = values / values.sum(dim=1, keepdim=True)
        keep_sorted = torch.cumsum(values, dim=1) > (1 - 0.6)
        dino = torch.zeros_like(keep_sorted).scatter(1, index, keep_sorted)[0].numpy().reshape(14, 14)
        np.testing.assert_array_equal(mass_mask(attention, 0.6), dino)


# ------------------------------------------------------------------------------------ feature PCA

def _planted(grid_h=6, grid_w=8, dim=16, seed=0):
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:grid_h, :grid_w]
    pattern = np.exp(-((yy - 2.0) ** 2 + (xx - 5.0) ** 2) / 4.0)  # a blob: the planted part
    direction = rng.normal(size=dim)
    direction /= np.linalg.norm(direction)
    features = 10.0 * pattern[..., None] * direction + 0.01 * rng.normal(size=(grid_h, grid_w, dim))
    return features, pattern


def test_feature_pca_first_component_is_the_planted_direction():
    features, pattern = _planted()
    pca = feature_pca([features])
    expected = (pattern - pattern.min()) / (pattern.max() - pattern.min())
    np.testing.assert_allclose(pca.rgb[0][..., 0], expected, atol=0.02)  # red = the planted part
    assert pca.explained_variance_ratio[0] > 0.99
    assert pca.rgb[0].shape == (6, 8, 3) and pca.foreground[0].all() and pca.threshold is None
    assert pca.rgb[0].min() >= 0.0 and pca.rgb[0].max() <= 1.0


def test_feature_pca_joint_fit_gives_matching_parts_matching_colours():
    features, pattern = _planted()
    moved = np.ascontiguousarray(features[:, ::-1][:5])  # the same part, mirrored, on a 5x8 grid
    pca = feature_pca([features, moved])
    np.testing.assert_allclose(pca.rgb[1], pca.rgb[0][:, ::-1][:5], atol=1e-9)
    assert pca.rgb[0][2, 5, 0] == pytest.approx(1.0) and pca.rgb[1][2, 2, 0] == pytest.approx(1.0)


def test_feature_pca_background_removal_keeps_the_planted_object():
    rng = np.random.default_rng(3)
    grid_h, grid_w, dim = 8, 8, 12
    obj = np.zeros((grid_h, grid_w), dtype=bool)
    obj[2:6, 3:6] = True  # the object, near the centre
    basis = np.linalg.qr(rng.normal(size=(dim, dim)))[0]
    features = 0.05 * rng.normal(size=(grid_h, grid_w, dim))
    features[obj] += 5.0 * basis[0]  # object vs background along one direction
    features[obj] += rng.normal(size=(obj.sum(), 1)) * basis[1]  # variation inside the object along another
    pca = feature_pca([features], background_threshold=0.5)
    np.testing.assert_array_equal(pca.foreground[0], obj)
    assert (pca.rgb[0][~obj] == 0).all() and pca.threshold == 0.5
    inside = pca.rgb[0][obj][:, 0]  # red follows the within-object direction
    within = (features[obj] @ basis[1])
    assert abs(np.corrcoef(inside, within)[0, 1]) > 0.99


# ------------------------------------------------------------------------------------ on models

def test_patch_features_are_the_last_block_output(tiny_kind):
    handle = tiny_handle(tiny_kind)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 52, 3), dtype=np.uint8))
    result = analyze_image(handle, image)
    layout = result.layout
    pixels, _ = handle.preprocess.apply(image)
    with torch.no_grad():
        last = handle.model.forward_intermediates(pixels, indices=1, norm=False, intermediates_only=True)[0]
    expected = last[0].permute(1, 2, 0).numpy()  # (grid_h, grid_w, D), timm's own patch-token reshape
    assert result.patch_features.shape == (layout.grid_h, layout.grid_w, handle.embed_dim)
    assert result.patch_features.dtype == np.float16
    np.testing.assert_allclose(result.patch_features.astype(np.float32), expected, rtol=2e-3, atol=2e-3)


def test_class_and_distillation_tokens_of_a_distilled_model():
    handle = tiny_handle("distilled")
    result = analyze_image(handle, Image.open(PHOTOS / "rocket.jpg"))
    layout = result.layout
    mean_heads = result.attention_stack().astype(np.float32).mean(axis=1)  # (depth, N, N)
    np.testing.assert_allclose(result.attention_map(1, None, "distillation"),
                               layout.to_grid(layout.patches(mean_heads[1, 1])), rtol=1e-6)
    scores = token_agreement(result)
    assert set(scores) == {"layer 0", "layer 1", "rollout"}
    expected = map_agreement(layout.to_grid(layout.patches(mean_heads[0, 0])),
                             layout.to_grid(layout.patches(mean_heads[0, 1])))
    assert scores["layer 0"].spearman == pytest.approx(expected.spearman)
    with pytest.raises(ValueError, match="no class and distillation"):
        token_agreement(analyze_image(tiny_handle("cls"), Image.open(PHOTOS / "rocket.jpg")))


def test_a_model_against_itself_agrees_fully_and_depths_are_aligned():
    from timm.models.vision_transformer import VisionTransformer

    from vit_inspect.core.timm_models import handle_from_timm

    image = Image.open(PHOTOS / "chelsea.png")
    handle = tiny_handle("cls")
    same = compare_images(handle, handle, image)
    for aligned in aligned_maps(same):
        assert aligned.layer_a == aligned.layer_b == 1
        assert aligned.agreement.spearman == pytest.approx(1.0) and aligned.agreement.top_overlap == 1.0
    torch.manual_seed(1)
    deeper = handle_from_timm(VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=4, num_heads=2,
                                                num_classes=10, dynamic_img_size=True).eval(), name="tiny-depth4",
                              device="cpu", input_size=(32, 32))
    pair = compare_images(handle, deeper, image)
    record = agreement_record(pair, aligned_maps(pair, layer_a=0))
    assert [(r["layer_a"], r["layer_b"]) for r in record["attention_by_layer"]] == [(0, 1), (1, 3)]
    assert record["maps"]["attention"]["layer_b"] == 1 and record["depth_b"] == 4
    assert set(record["maps"]) == {"attention", "rollout", "gradcam", "chefer"}
    assert pair.nbytes() == pair.a.nbytes() + pair.b.nbytes()


def _in_their_package(fn):
    fn.__module__ = "their_package"  # not vit_inspect's own: an added method, as a plugin's is
    return fn


def test_added_methods_computed_from_the_pass_are_compared_too():
    """A method added to the registry that reads the pass is aligned and scored beside the built-in kinds, under
    its registered title; one with passes of its own (a comparison keeps no model) and one that fails are left
    out, and the built-in kinds are unchanged."""
    from vit_inspect.analysis.compare import map_agreement as agreement_of
    from vit_inspect.methods import Method, registry
    from vit_inspect.plots import compare as compare_plots

    added = [Method(name="twice_first_layer", title="first layer's attention, doubled", unit="attention weight × 2",
                    paper="a test", reads="attention",
                    compute=_in_their_package(lambda context: 2.0 * context.result.attention_map(0))),
             Method(name="own_logit", title="the logit, everywhere", unit="{score}", paper="a test",
                    reads="own passes", forwards=1, sanity=False,
                    compute=_in_their_package(lambda context: np.ones((4, 4)))),
             Method(name="always_fails", title="fails", unit="value", paper="a test", reads="attention",
                    compute=_in_their_package(lambda context: 1 / 0))]
    for method in added:
        registry.register(method)
    try:
        handle = tiny_handle("cls")
        pair = compare_images(handle, handle, Image.open(PHOTOS / "chelsea.png"), None, (32, 48))
        aligned = {item.kind: item for item in aligned_maps(pair)}
        assert list(aligned) == ["attention", "rollout", "gradcam", "chefer", "twice_first_layer"]
        item = aligned["twice_first_layer"]
        assert item.title == "first layer's attention, doubled" and not item.layered and not item.relu
        np.testing.assert_array_equal(item.map_a, 2.0 * pair.a.attention_map(0))
        assert item.agreement == agreement_of(item.map_a, item.map_b, pair.box_a, pair.box_b, 0.1)
        assert aligned["attention"].title == "raw attention (mean of heads)" and aligned["attention"].layered
        assert aligned["gradcam"].relu and not aligned["rollout"].layered
        assert set(agreement_record(pair, list(aligned.values()))["maps"]) == set(aligned)
        with_added = compare_plots.aligned_maps_panel(pair, list(aligned.values()), "A", "B")
        without = compare_plots.aligned_maps_panel(pair, list(aligned.values())[:4], "A", "B")
        assert with_added.shape[1] == without.shape[1] and with_added.shape[0] > without.shape[0]  # one row more
    finally:
        for method in added:
            registry.unregister(method.name)


# ------------------------------------------------------------------------------------ figures and CLI

def test_figures_name_both_models_layers_and_carry_colour_bars():
    from vit_inspect.plots import compare as compare_plots
    from vit_inspect.studies.comparison import last_layer_heads

    handle = tiny_handle("cls")
    pair = compare_images(handle, handle, Image.open(PHOTOS / "chelsea.png"), None, (32, 48))
    aligned = aligned_maps(pair, layer_a=0)
    fig = compare_plots.aligned_maps_figure(pair, aligned, "A: tiny", "B: tiny wide")
    texts = [t.get_text() for sub in fig.subfigs for t in [sub._suptitle] + [ax.title for ax in sub.axes]]
    assert any("A: tiny, layer 0 (relative depth 0.50)" in t for t in texts)
    assert any(t.startswith("raw attention") and "Spearman" in t for t in texts)
    assert sum(ax.get_label() == "<colorbar>" for sub in fig.subfigs for ax in sub.axes) == len(aligned)
    maps, masks = last_layer_heads(pair.a)
    assert maps.shape == masks.shape == (2, 4, 4)
    np.testing.assert_array_equal(masks[1], mass_mask(pair.a.attention_map(1, 1), 0.6))
    heads = compare_plots.dino_heads_figure(pair.a, maps, masks, "A: tiny", 0.6)
    assert "60% of the mass" in heads._suptitle.get_text()
    distance = compare_plots.compare_distance_figure([pair.a.mean_distance, pair.b.mean_distance], ["A", "B"],
                                                     [32, 48])
    assert [len(c.get_offsets()) for c in distance.axes[0].collections] == [4, 4]  # 2 layers x 2 heads each
    np.testing.assert_allclose(sorted(set(np.round(distance.axes[0].collections[0].get_offsets()[:, 0] + 0.0375, 6))),
                               [0.5, 1.0])  # relative depths (l+1)/L, model A drawn a little to the left
    assert compare_plots.side_by_side([np.zeros((2, 3, 3), np.uint8), np.zeros((4, 1, 3), np.uint8)], gap=2).shape == (4, 6, 3)


def test_compare_distance_picture_puts_each_models_heads_at_their_relative_depth_and_distance():
    """Every head a dot in its model's colour at x = (l + 1) / L plus the model's side offset (A left, B right),
    y linear from 0 (bottom) to 1.08 x the largest + 1 (top), under a one-line title; a legend line per model."""
    from vit_inspect.plots import compare as compare_plots
    from vit_inspect.plots.canvas import CAPTION_LINE_PIXELS, rgb_of
    from vit_inspect.plots.compare import (
        COMPARE_PLOT_PIXELS,
        MODEL_COLORS,
        compare_distance_panel,
    )

    a = np.array([[10.0, 20.0], [30.0, 40.0]])  # depth 2, heads 2
    b = np.array([[5.0], [15.0], [25.0], [35.0]])  # depth 4, heads 1
    picture, (at_a, at_b) = compare_distance_panel([a, b], ["A: two", "B: four"], [32, 48], title="t")
    untitled, (plain_a, _) = compare_distance_panel([a, b], ["A: two", "B: four"], [32, 48], title="")
    band = CAPTION_LINE_PIXELS + 8
    np.testing.assert_array_equal(picture[band:], untitled)
    np.testing.assert_allclose(at_a[..., 1] - plain_a[..., 1], band)
    plot_w, plot_h = COMPARE_PLOT_PIXELS
    left, top, highest = 62, 8, 1.08 * 40.0 + 1.0
    # by hand: A's offset -0.5 * 0.15 / 2 = -0.0375, B's +0.5 * 0.15 / 4 = 0.01875; the axis runs 0..1.05
    np.testing.assert_allclose(plain_a[:, 0, 0], left + (np.array([0.5, 1.0]) - 0.0375) / 1.05 * (plot_w - 1))
    np.testing.assert_allclose(at_b[:, 0, 0], left + (np.array([0.25, 0.5, 0.75, 1.0]) + 0.01875) / 1.05 * (plot_w - 1))
    np.testing.assert_allclose(plain_a[..., 1], top + plot_h - 1 - a / highest * (plot_h - 1))
    np.testing.assert_allclose(at_b[..., 1] - band, top + plot_h - 1 - b / highest * (plot_h - 1))
    for centres, colour in ((at_a, MODEL_COLORS[0]), (at_b, MODEL_COLORS[1])):
        for x, y in np.round(centres.reshape(-1, 2)).astype(int):
            np.testing.assert_array_equal(picture[y, x], rgb_of(colour))
    bottom = band + top + plot_h - 1
    for index, colour in enumerate(MODEL_COLORS):  # each legend line starts with its model's dot
        np.testing.assert_array_equal(picture[bottom + 48 + 18 * index, left + 8], rgb_of(colour))
    long_name = "B: " + "a_very_long_model_name_" * 4
    wider, _ = compare_distance_panel([a, b], ["A: two", long_name], [32, 48])
    assert wider.shape[1] > untitled.shape[1]  # the legend fits: the picture widens for it
    assert compare_plots.DEPTH_AXIS_END == 1.05
    with pytest.raises(ValueError, match="one name"):
        compare_distance_panel([a, b], ["A"], [32, 48])
    with pytest.raises(ValueError, match="finite"):
        compare_distance_panel([a, b * np.nan], ["A", "B"], [32, 48])
    with pytest.raises(ValueError, match="depth, heads"):
        compare_distance_panel([a, np.zeros(3)], ["A", "B"], [32, 48])


def test_dino_heads_picture_scales_each_head_and_brightens_its_mass():
    """Each head min-max scaled on its own (so an affine change of one head's map draws the same picture), its
    overlay on 0..1 with the patches outside its mass set dimmed found once, the title naming the mass."""
    from vit_inspect.plots import compare as compare_plots
    from vit_inspect.plots.canvas import normalized
    from vit_inspect.plots.maps import overlay
    from vit_inspect.studies.comparison import last_layer_heads

    handle = tiny_handle("cls")
    pair = compare_images(handle, handle, Image.open(PHOTOS / "chelsea.png"), None, (32, 48))
    maps, masks = last_layer_heads(pair.a, 0.6)
    picture = compare_plots.dino_heads_panel(pair.a, maps, masks, "A: tiny", 0.6)
    for head in range(maps.shape[0]):
        tile = overlay(pair.a.rgb, normalized(maps[head], relu=False), vmin=0.0, vmax=1.0, mask=masks[head])
        assert len(_found_at(picture, tile)) == 1, head
    assert masks[0].any() and not masks[0].all()  # some patches dimmed: the mask shows
    shifted = maps.copy()
    shifted[1] = 10.0 * shifted[1] + 3.0
    np.testing.assert_array_equal(compare_plots.dino_heads_panel(pair.a, shifted, masks, "A: tiny", 0.6), picture)
    assert not np.array_equal(compare_plots.dino_heads_panel(pair.a, maps, masks, "A: tiny", 0.9), picture)  # title
    with pytest.raises(ValueError, match="one shape"):
        compare_plots.dino_heads_panel(pair.a, maps, masks[:1], "A: tiny", 0.6)


def test_feature_pca_picture_by_hand():
    """The crop under its title, its three components as rint(255 x) blocks of the crop's pixels below it (each
    patch 2 x 2 here), and a black-to-colour scale bar per channel."""
    from vit_inspect.analysis.dino import FeaturePCA
    from vit_inspect.plots import compare as compare_plots

    rng = np.random.default_rng(0)
    crop = rng.integers(0, 256, size=(4, 6, 3), dtype=np.uint8)
    colours = rng.uniform(size=(2, 3, 3))
    colours[0, 0] = 0.0  # a removed background patch: black
    pca = FeaturePCA(rgb=(colours,), foreground=(colours.any(-1),), explained_variance_ratio=np.array([0.5, 0.3, 0.1]),
                     threshold=0.4)
    picture = compare_plots.feature_pca_panel([crop], pca, ["img.png"], "A: tiny")

    [(crop_y, crop_x)] = _found_at(picture, crop)
    expected = np.rint(np.repeat(np.repeat(colours, 2, axis=0), 2, axis=1) * 255.0).astype(np.uint8)
    [(y, x)] = _found_at(picture, expected)
    assert x == crop_x == 0 and y > crop_y + 4
    assert (picture[y:y + 2, x:x + 2] == 0).all()
    for label, colour in (("PC1 score, min-max (50% of variance)", (255, 0, 0)),
                          ("PC3 score, min-max (10% of variance)", (0, 0, 255))):
        bar = compare_plots._channel_bar(label, colour)
        assert len(_found_at(picture, bar)) == 1
        ramp = bar[2 + compare_plots.CHANNEL_BAR_PIXELS[1] // 2, 8:8 + compare_plots.CHANNEL_BAR_PIXELS[0]]
        np.testing.assert_array_equal(ramp[1], np.rint(np.array(colour) / (len(ramp) - 1)).astype(np.uint8))
        np.testing.assert_array_equal(ramp[len(ramp) // 2], np.rint(np.array(colour) * (len(ramp) // 2) / (len(ramp) - 1)))
    with pytest.raises(ValueError, match="1 crops, 1 PCA images and 2 titles"):
        compare_plots.feature_pca_panel([crop], pca, ["a", "b"], "A: tiny")


def _found_at(picture: np.ndarray, block: np.ndarray) -> list[tuple[int, int]]:
    """Every (row, col) where ``block`` lies in ``picture`` pixel for pixel."""
    height, width = block.shape[:2]
    hits = np.argwhere((picture[:picture.shape[0] - height + 1, :picture.shape[1] - width + 1] == block[0, 0]).all(-1))
    return [(y, x) for y, x in hits if np.array_equal(picture[y:y + height, x:x + width], block)]


def test_the_apps_aligned_maps_picture_shows_each_models_map_panel_per_kind():
    from vit_inspect.plots import compare as compare_plots
    from vit_inspect.plots.canvas import MOSAIC_GAP, map_range
    from vit_inspect.plots.maps import map_panel

    handle = tiny_handle("cls")
    pair = compare_images(handle, handle, Image.open(PHOTOS / "chelsea.png"), None, (32, 48))
    aligned = aligned_maps(pair, layer_a=0)
    picture = compare_plots.aligned_maps_panel(pair, aligned, "A: tiny", "B: tiny wide")
    attention = aligned[0]
    assert attention.kind == "attention" and attention.layer_b == 0
    panels = [map_panel(result.rgb, grid_map, f"{name}, layer 0 (relative depth 0.50)",  # attention: no class
                        "map value", *map_range(grid_map, False))
              for result, name, grid_map in ((pair.a, "A: tiny", attention.map_a), (pair.b, "B: tiny wide", attention.map_b))]
    [(row, left)] = _found_at(picture, panels[0])  # model A's, at the left of the first row
    assert left == 0 and row > 0  # under the titles
    assert _found_at(picture, panels[1]) == [(row, panels[0].shape[1] + MOSAIC_GAP)]  # model B's beside it
    gradcam = next(item for item in aligned if item.kind == "gradcam")  # after a ReLU, its own range
    relu_panel = map_panel(pair.b.rgb, gradcam.map_b, f"B: tiny wide, layer 0 (relative depth 0.50), class "
                           f"{pair.b.target}", "map value (ReLU)", *map_range(gradcam.map_b, True), relu=True)
    assert len(_found_at(picture, relu_panel)) == 1
    named = compare_plots.aligned_maps_panel(pair, aligned, "A: tiny", "B: tiny wide", classes=("cat (#3)", "cat (#3)"))
    relu_named = map_panel(pair.b.rgb, gradcam.map_b, "B: tiny wide, layer 0 (relative depth 0.50), class cat (#3)",
                           "map value (ReLU)", *map_range(gradcam.map_b, True), relu=True)
    assert len(_found_at(named, relu_named)) == 1  # the class in words where the caller names it
    assert picture.shape[0] > sum(max(p.shape[0] for p in panels) for _ in aligned)  # one row per kind, titled
    with pytest.raises(ValueError, match="no maps"):
        compare_plots.aligned_maps_panel(pair, [], "A", "B")


def test_both_models_explain_one_class_when_asked_and_label_sets_are_compared():
    from vit_inspect.studies.comparison import same_labels

    a, b = tiny_handle("cls"), tiny_handle("cls", seed=1)
    picture = Image.open(PHOTOS / "chelsea.png")
    own = compare_images(a, b, picture)
    assert (own.a.target, own.b.target) == (int(own.a.probs.argmax()), int(own.b.probs.argmax()))
    wanted = next(i for i in range(10) if i not in (own.a.target, own.b.target))
    one = compare_images(a, b, picture, target_a=wanted, target_b=wanted)
    assert one.a.target == one.b.target == wanted
    assert same_labels(a, b)
    from vit_inspect.core.hf_models import handle_from_hf

    seven = handle_from_hf(tiny_hf(), name="tiny-hf", device="cpu")  # 7 classes: another label set
    assert not same_labels(a, seven) and not same_labels(seven, a)


@pytest.mark.slow
def test_compare_command_writes_figures_and_agreement_json(capsys, tmp_path):
    import json

    from support import DEIT_WEIGHTS

    from vit_inspect.cli.main import main

    if not DEIT_WEIGHTS.is_file():
        pytest.skip("real DeiT-Ti weights not found")
    args = ["compare", str(PHOTOS / "chelsea.png"), "--model", "deit_tiny_patch16_224", "--model",
            "deit_tiny_patch16_224", "--weights-a", str(DEIT_WEIGHTS), "--weights-b", str(DEIT_WEIGHTS),
            "--input-size-b", "224x320", "--layer", "5", "--device", "cpu", "--out", str(tmp_path / "out")]
    assert main(args) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["input_size_b"] == [224, 320] and record["label_b"].startswith("B: deit_tiny")
    assert record["maps"]["attention"]["layer_a"] == record["maps"]["attention"]["layer_b"] == 5
    # the same weights on a wider crop of the same photo: the maps agree, not perfectly
    for kind in ("attention", "rollout", "gradcam", "chefer"):
        assert 0.5 < record["maps"][kind]["spearman"] < 1.0, kind
    assert record["maps"]["rollout"]["grid"] == [14, 14]  # A's crop lies inside B's: A's grid covers the region
    assert json.loads((tmp_path / "out" / "agreement.json").read_text())[0]["maps"] == record["maps"]
    for name in ("chelsea_maps", "chelsea_distance", "chelsea_heads_a", "chelsea_heads_b", "feature_pca_a",
                 "feature_pca_b", "fig7_filters", "fig7_pos_similarity"):
        assert (tmp_path / "out" / f"{name}.png").read_bytes()[:4] == b"\x89PNG", name
    assert main(["compare", str(PHOTOS / "chelsea.png"), "--model", "deit_tiny_patch16_224",
                 "--out", str(tmp_path)]) == 1
    assert "exactly two models" in capsys.readouterr().err


def test_fig7_position_similarity_is_drawn_on_each_models_input_grid(monkeypatch):
    from vit_inspect.plots import model as model_plots
    from vit_inspect.plots.compare import fig7_images
    from vit_inspect.studies.model_report import pos_similarity_at

    handle = tiny_handle("cls")  # 8x8 patches, native 32x32: a 4x4 grid
    drawn = []
    real = model_plots.pos_similarity_figure
    monkeypatch.setattr(model_plots, "pos_similarity_figure",
                        lambda similarity, title: drawn.append((similarity, title)) or real(similarity, title))
    labels = ["A: tiny (32×32)", "B: tiny (32×48)"]
    fig7_images([handle, handle], labels, [None, (32, 48)])
    (native, title_a), (wide, title_b) = drawn
    assert native.shape == (4, 4, 4, 4) and title_a == "A: tiny (32×32): position embedding similarity, 4×4 grid"
    assert wide.shape == (4, 6, 4, 6) and title_b == "B: tiny (32×48): position embedding similarity, 4×6 grid"
    np.testing.assert_array_equal(wide, pos_similarity_at(handle, (4, 6)))  # interpolated as the model does
