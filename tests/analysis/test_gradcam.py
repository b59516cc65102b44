import numpy as np
import pytest
import torch
from captum.attr import LayerGradCam
from support import make_layout
from torch import nn

from vit_inspect.analysis.gradcam import gradcam_from_tokens
from vit_inspect.core.tokens import TokenLayout

LAYOUTS = [make_layout(True, 0, 0, 2, 2), make_layout(False, 0, 0, 2, 3), make_layout(True, 1, 0, 2, 2),
           make_layout(True, 0, 4, 3, 2)]
LAYOUT_IDS = ["class", "no-prefix-2x3", "class+dist", "class+4reg-3x2"]


class PatchGrid(nn.Module):
    """(1, N, D) tokens -> (1, D, grid_h, grid_w) patch tokens, the layer captum's Grad-CAM looks at."""

    def __init__(self, layout: TokenLayout) -> None:
        super().__init__()
        self.layout = layout

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        patches = self.layout.patches(tokens, axis=1)  # (1, P, D)
        return patches.transpose(1, 2).reshape(1, -1, self.layout.grid_h, self.layout.grid_w)


class TinyTokenClassifier(nn.Module):
    """tokens -> Linear + tanh (the token layer) -> patch grid -> squared, pooled -> Linear; prefix tokens feed the logits too."""

    def __init__(self, layout: TokenLayout, embed_dim: int = 6, num_classes: int = 3) -> None:
        super().__init__()
        self.layout = layout
        self.mix = nn.Linear(embed_dim, embed_dim)
        self.grid = PatchGrid(layout)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(embed_dim, num_classes)
        self.prefix_head = nn.Linear(embed_dim, num_classes)

    def token_layer(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.mix(tokens))  # (1, N, D)

    def classify(self, mixed: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.pool(self.grid(mixed) ** 2).flatten(1))  # (1, classes)
        if self.layout.num_prefix_tokens:
            logits = logits + self.prefix_head(self.layout.split(mixed, axis=1)[0].mean(dim=1))
        return logits

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.classify(self.token_layer(tokens))


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_matches_captum_layer_gradcam(layout):
    torch.manual_seed(0)
    model = TinyTokenClassifier(layout).double()
    tokens = torch.randn(1, layout.num_tokens, 6, dtype=torch.float64)
    target = 1

    expected = LayerGradCam(model, model.grid).attribute(tokens, target=target, relu_attributions=False)  # (1, 1, gh, gw)

    mixed = model.token_layer(tokens)
    mixed.retain_grad()
    model.classify(mixed)[0, target].backward()
    activations = mixed[0].detach().numpy()  # (N, D)
    gradients = mixed.grad[0].numpy()  # (N, D)
    if layout.num_prefix_tokens:
        assert np.abs(layout.split(gradients, axis=0)[0]).sum() > 0  # prefix tokens matter to the logit

    cam = gradcam_from_tokens(activations, gradients, layout)

    assert cam.shape == (layout.grid_h, layout.grid_w)
    np.testing.assert_allclose(cam, expected[0, 0].detach().numpy(), rtol=1e-10, atol=1e-12)


def test_autograd_hand_check():
    # Class token + 1x2 grid, D = 2. Target y = s^2 + w . x_class with s = sum over patches of v . x_p,
    # so dy/dx_p = 2 s v for every patch: alpha = 2 s v and cam_p = 2 s (v . x_p).
    layout = make_layout(True, 0, 0, 1, 2)
    tokens = torch.tensor([[9.0, 9.0], [1.0, 2.0], [3.0, -1.0]], dtype=torch.float64, requires_grad=True)
    v = torch.tensor([1.0, 0.5], dtype=torch.float64)
    w = torch.tensor([2.0, -3.0], dtype=torch.float64)
    s = (tokens[1:] @ v).sum()
    (s ** 2 + tokens[0] @ w).backward()

    # v . x_1 = 2, v . x_2 = 2.5, s = 4.5: cam = 2 * 4.5 * [2, 2.5] = [18, 22.5]
    cam = gradcam_from_tokens(tokens.detach().numpy(), tokens.grad.numpy(), layout)
    np.testing.assert_allclose(cam, [[18.0, 22.5]])


def test_prefix_tokens_are_excluded_on_a_non_square_grid():
    layout = make_layout(True, 0, 4, 2, 3)  # patches are tokens 5..10
    rng = np.random.default_rng(0)
    activations = rng.normal(size=(layout.num_tokens, 4))
    gradients = rng.normal(size=(layout.num_tokens, 4))

    cam = gradcam_from_tokens(activations, gradients, layout)

    alpha = gradients[5:].mean(axis=0)
    expected = np.array([[activations[5 + 3 * row + col] @ alpha for col in range(3)] for row in range(2)])
    np.testing.assert_allclose(cam, expected)
    assert cam.min() < 0 < cam.max()  # signed: no ReLU
    activations[:5] = 1e6
    gradients[:5] = -1e6
    np.testing.assert_allclose(gradcam_from_tokens(activations, gradients, layout), expected)


def test_shape_errors():
    layout = make_layout(True, 0, 0, 1, 2)
    with pytest.raises(ValueError, match="both"):
        gradcam_from_tokens(np.zeros((3, 2)), np.zeros((3, 3)), layout)
    with pytest.raises(ValueError, match="tokens"):
        gradcam_from_tokens(np.zeros((4, 2)), np.zeros((4, 2)), layout)
