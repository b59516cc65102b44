"""Fixtures of the UI tests: the app served in-process (one server per test module), a client per test,
and random weights of timm's smallest ViT for a second model."""
from __future__ import annotations

import pytest
from gradio_client import Client
from support.app import Server


@pytest.fixture(scope="module")
def server():
    served = Server()
    yield served
    served.demo.close()


@pytest.fixture
def client(server) -> Client:
    return Client(server.url, verbose=False)


@pytest.fixture(scope="module")
def tiny_weights(tmp_path_factory):
    """Random weights of timm's `test_vit` (6 layers, 2 heads, 160-pixel input) in a .safetensors file."""
    import timm
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("weights") / "tiny_random_test_vit.safetensors"
    save_file(timm.create_model("test_vit", pretrained=False).state_dict(), str(path))
    return path
