"""The Compare tab through the app's API: a second model from uploaded weights, one comparison, and
hostile values answered with sentences."""
from __future__ import annotations

import pytest
from gradio_client import handle_file  # noqa: E402
from support.app import APP_MARKS, CHELSEA, refused

pytestmark = [*APP_MARKS, pytest.mark.slow]  # slow: served app with a second model


def test_compare_through_the_api(server, client, tiny_weights):
    assert "Load model B first" in refused(client, handle_file(str(CHELSEA)), "", 0.6, False, 0.5,
                                           api_name="/compare_models")
    status = client.predict("test_vit", handle_file(str(tiny_weights)), api_name="/compare_load_model")
    assert "6 layers × 2 heads" in status and "/tmp" not in status and "**Model B**" in status
    for size, message in (("tall", "must look like 224x320"), ("8x8", "smaller than one"),
                          ("4000x4000", "more than 1024 patches")):
        assert message in refused(client, handle_file(str(CHELSEA)), size, 0.6, False, 0.5,
                                  api_name="/compare_models")
    for mass, message in ((7.0, "must be between 0.05 and 1, not 7"), ("nan", "not NaN"), ([1], "not a list")):
        assert message in refused(client, handle_file(str(CHELSEA)), "", mass, False, 0.5,
                                  api_name="/compare_models")
    forwards = server.forwards
    outputs = client.predict(handle_file(str(CHELSEA)), "192x192", 0.6, True, 0.5, api_name="/compare_models")
    assert server.forwards == forwards + 1  # model A: one pass
    layer, note, top_a, top_b, maps, table = outputs[:6]
    assert "A's layer 11, the last (relative depth 1.00) ↔ B's layer 5, the last (relative depth 1.00)" in note
    assert top_a["label"].split(" (#")[0].split(",")[0] in ("Egyptian cat", "tabby", "tiger cat")
    rows = table["data"]
    assert [r[0].split(" (")[0] for r in rows] == ["raw attention", "attention rollout", "Grad-CAM",
                                                  "gradient-weighted attention"]
    assert all(-1.0 <= float(r[2]) <= 1.0 and 0.0 <= float(r[3]) <= 1.0 for r in rows)
    assert rows[0][4] == "14×14"  # A's 14x14 grid is the finer one (B: 192 px / 16 = 12)
    relayered = client.predict(0, api_name="/compare_layer")
    assert "A's layer 0 (relative depth 0.08) ↔ B's layer 0 (relative depth 0.17)" in relayered[2]
    assert server.forwards == forwards + 1
    from PIL import Image

    width = (lambda output: Image.open(output if isinstance(output, str) else output["path"]).size[0])
    single = width(outputs[11])
    assert "between 1 and 7 more images" in refused(client, [handle_file(str(CHELSEA))] * 8, False, 0.5,
                                                       api_name="/compare_joint_pca")
    joint_a, joint_b, _ = client.predict([handle_file(str(CHELSEA.parent / "coffee.png"))], False, 0.5,
                                      api_name="/compare_joint_pca")
    assert server.forwards == forwards + 2  # one forward of model A for the added image, no backward
    assert width(joint_a) > single and width(joint_b) > single  # a second column: both images, one joint fit
    heads_a, heads_b = client.predict(0.3, api_name="/compare_mass")
    assert width(heads_a) > 0 and width(heads_b) > 0
    assert server.forwards == forwards + 2
