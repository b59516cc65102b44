"""`TokenLayout.join` is the inverse of `split`, for every prefix layout."""
from __future__ import annotations

import pytest
import torch
from support import make_layout


@pytest.mark.parametrize("cls, dist, reg", [(True, 0, 0), (False, 0, 0), (True, 1, 0), (True, 0, 4)])
def test_join_undoes_split(cls, dist, reg):
    layout = make_layout(cls, dist, reg, grid_h=2, grid_w=3)
    x = torch.randn(2, layout.num_tokens, 5)
    prefix, patches = layout.split(x, axis=1)
    assert torch.equal(layout.join(prefix, patches, axis=1), x)
    with pytest.raises(ValueError, match="prefix and 6 patch tokens"):
        layout.join(prefix, patches[:, 1:], axis=1)
