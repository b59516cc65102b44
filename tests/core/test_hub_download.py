"""A web user's hub id is downloaded only as far as the server's bounds allow (`hub.fetch_configs`,
`hub.fetch_weights`).

The real hub client and transformers run in a fresh interpreter against `fake_hub.FakeHub` on a
loopback port (huggingface_hub reads HF_ENDPOINT when imported); the hub's log says which files were
downloaded. Each repository holds a 2-block, 32-dim ViT classifier (96 kB of float32 weights).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from support import REPO
from support.fake_hub import FakeHub

from vit_inspect.core import hub

pytestmark = pytest.mark.slow  # a loopback hub serving real downloads

MIB = 2 ** 20
PATCH_KEY = "vit.embeddings.patch_embeddings.projection.weight"
CLIENT = """
import json, sys
from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.load import load_model
report = {}
for repo, bound in json.loads(sys.argv[1]):
    try:
        handle = load_model(repo, device="cpu", allow_local_dirs=False, max_model_bytes=bound)
        state = handle.model.state_dict()
        report[repo] = {"patch_sum": float(state[%r].double().sum()), "depth": handle.depth,
                        "dtype": str(next(handle.model.parameters()).dtype)}
    except VitInspectError as exc:
        report[repo] = {"error": type(exc).__name__, "message": str(exc), "public": exc.public}
print(json.dumps(report))
""" % PATCH_KEY

# The probe's two seconds ran out while the hub is up: the load reads the local cache only. Its config is
# there, under refs/main, as any earlier download of the repository leaves it.
OFFLINE = """
from huggingface_hub import hf_hub_download
from vit_inspect.core import hub
hf_hub_download("org/offline", "config.json")
hub.probe_endpoint = lambda *args, **kwargs: False
"""


def _tiny_vit(seed: int):
    from safetensors.torch import save
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                       image_size=32, patch_size=8, num_labels=3, architectures=["ViTForImageClassification"])
    torch.manual_seed(seed)
    state = {k: v.contiguous() for k, v in ViTForImageClassification(config).state_dict().items()}
    return config.to_dict(), state, save


def _repos() -> tuple[dict, dict, dict]:
    """(repos, listed sizes, the patch-embedding sum each loadable repo's weights hold)."""
    repos, sums = {}, {}
    preprocessor = json.dumps({"do_resize": True, "size": {"height": 32, "width": 32}, "image_mean": [0.5] * 3,
                               "image_std": [0.5] * 3, "image_processor_type": "ViTImageProcessor"}).encode()
    config, state, save = _tiny_vit(0)
    padding = {"padding": torch.zeros(3 * MIB // 4)}  # 3 MiB that no model parameter takes
    text = lambda value: json.dumps(value).encode()  # noqa: E731
    repos["org/small"] = {"config.json": text(config), "preprocessor_config.json": preprocessor,
                          "model.safetensors": save(state)}
    sums["org/small"] = float(state[PATCH_KEY].double().sum())
    repos["org/padded"] = {"config.json": text(config), "model.safetensors": save({**state, **padding})}
    repos["org/big-config"] = {"config.json": text({**config, "padding": " " * (5 * MIB)}),
                               "model.safetensors": save(state)}
    # transformers takes the file the config names, not model.safetensors
    repos["org/named"] = {"config.json": text({**config, "transformers_weights": "other.safetensors"}),
                          "model.safetensors": save(state), "other.safetensors": save({**state, **padding})}
    _, shard_state, _ = _tiny_vit(1)
    keys = sorted(shard_state)
    halves = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    total = sum(v.numel() * v.element_size() for v in shard_state.values())
    repos["org/sharded"] = {"config.json": text(config), "model.safetensors.index.json": text(
        {"metadata": {"total_size": total}, "weight_map": {k: shard for shard, names in halves.items() for k in names}}),
        **{shard: save({k: shard_state[k] for k in names}) for shard, names in halves.items()},
        "unrelated.safetensors": save(padding)}  # not named by the index: not counted, not fetched
    sums["org/sharded"] = float(shard_state[PATCH_KEY].double().sum())
    _, bin_state, _ = _tiny_vit(2)
    import io
    buffer = io.BytesIO()
    torch.save(bin_state, buffer)
    repos["org/bin-only"] = {"config.json": text(config), "pytorch_model.bin": buffer.getvalue()}
    sums["org/bin-only"] = float(bin_state[PATCH_KEY].double().sum())
    repos["org/no-size"] = {"config.json": text(config), "model.safetensors": save(state)}
    listed = {"org/no-size": {"model.safetensors": None}}
    # a config whose model alone is over the bound: refused from it, its weights never fetched
    wide = {**config, "hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 4}
    repos["org/wide"] = {"config.json": text(wide), "model.safetensors": b"never read"}
    # an image processor whose constructor downloads a file from another repository (with the server's token)
    repos["org/oneformer"] = {"config.json": text(config), "model.safetensors": save(state),
                              "preprocessor_config.json": text({"image_processor_type": "OneFormerImageProcessor",
                                                                "repo_path": "org/secret", "class_info_file": "big.json"})}
    repos["org/secret"] = {"big.json": text({"0": {"name": "x", "isthing": 1}})}
    repos["org/huge-input"] = {"config.json": text(config), "model.safetensors": save(state),
                               "preprocessor_config.json": text({"image_processor_type": "ViTImageProcessor",
                                                                 "size": {"height": 60000, "width": 60000}})}
    repos["org/float64"] = {"config.json": text({**config, "dtype": "float64"}), "model.safetensors": save(state)}
    repos["org/offline"] = dict(repos["org/padded"])  # loaded while the probe says the hub does not answer
    return repos, listed, sums


@pytest.fixture(scope="module")
def hub_run(tmp_path_factory):
    """One client run over every repository, each with a 1 MiB model bound; then the same padded repository
    without a bound (the command line's load) in a second run."""
    repos, listed, sums = _repos()
    fake = FakeHub(repos, listed)
    home = tmp_path_factory.mktemp("hf")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env |= {"HF_ENDPOINT": fake.url, "HF_HOME": str(home), "OMP_NUM_THREADS": "1"}

    def run(pairs, offline=False):
        script = OFFLINE + CLIENT if offline else CLIENT
        done = subprocess.run([sys.executable, "-c", script, json.dumps(pairs)], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    try:
        bounded = run([[repo, MIB] for repo in repos if repo not in ("org/secret", "org/offline")])
        before = len(fake.log)
        unbounded = run([["org/padded", None]])
        unanswered = run([["org/offline", MIB]], offline=True)
        yield bounded | unanswered, unbounded, fake, sums, before
    finally:
        fake.close()


def test_repositories_within_the_bound_load_their_own_weights(hub_run):
    report, _, fake, sums, _ = hub_run
    for repo in ("org/small", "org/sharded", "org/bin-only"):
        assert "error" not in report[repo], report[repo]
        assert report[repo]["depth"] == 2
        assert report[repo]["patch_sum"] == pytest.approx(sums[repo], abs=1e-9)
    assert fake.downloaded("org/small") == ["config.json", "preprocessor_config.json", "model.safetensors"]
    assert fake.downloaded("org/sharded") == ["config.json", "model.safetensors.index.json",
                                              "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert fake.downloaded("org/bin-only") == ["config.json", "pytorch_model.bin"]


def test_weights_over_the_bound_are_refused_before_they_are_downloaded(hub_run):
    """The config (96 kB of float32 parameters) passes the 1 MiB model bound; the weights file carries 3 MiB
    more. Before: transformers downloaded all of it to disk, then loaded the model."""
    report, unbounded, fake, _, before = hub_run
    padded = report["org/padded"]
    assert padded["error"] == "ModelTooLargeError"
    assert padded["public"] == ("'org/padded' keeps 3.1 MiB of weights (model.safetensors), more than the 1.0 MiB "
                                "this server allows one model; refusing to download them.")
    assert fake.downloaded("org/padded", upto=before) == ["config.json"]
    # the command line's load (no bound) is unchanged: it downloads them and loads the model
    assert "error" not in unbounded["org/padded"], unbounded["org/padded"]
    assert "model.safetensors" in fake.downloaded("org/padded")[1:]


def test_the_weights_file_the_config_names_is_the_one_sized(hub_run):
    report, _, fake, _, _ = hub_run
    assert report["org/named"]["error"] == "ModelTooLargeError"
    assert "(other.safetensors)" in report["org/named"]["public"]
    assert fake.downloaded("org/named") == ["config.json"]


def test_a_model_over_the_bound_is_refused_from_its_config_before_its_weights(hub_run):
    report, _, fake, _, _ = hub_run
    assert report["org/wide"]["error"] == "ModelTooLargeError"
    # patch embedding 8*8*3*128 + 128, class token and 17 positions 18*128, per block 3*(128^2 + 128) +
    # (128^2 + 128) + 2*256 + (128*512 + 512) + (512*128 + 128) = 198,272, final norm 256, head 128*3 + 3
    assert 24_704 + 2_304 + 4 * 198_272 + 256 + 387 == 820_739
    assert report["org/wide"]["public"].startswith("'org/wide' has 820,739 parameters (3.1 MiB in float32), more "
                                                   "than the 1.0 MiB this server allows one model")
    assert fake.downloaded("org/wide") == ["config.json"]


def test_only_known_image_processors_are_built(hub_run):
    """Before: AutoImageProcessor built the class preprocessor_config.json named; OneFormer's constructor
    downloaded 'big.json' from another repository (unsized, with the server's token)."""
    report, _, fake, _, _ = hub_run
    assert report["org/oneformer"]["error"] == "UnsupportedModelError"
    assert report["org/oneformer"]["public"] == (
        "'org/oneformer' asks for the image processor 'OneFormerImageProcessor'; vit_inspect reads the settings of "
        "ViTImageProcessor, DeiTImageProcessor, BeitImageProcessor, BitImageProcessor, CLIPImageProcessor only.")
    assert not any("/org/secret/" in path for _, path in fake.log)


def test_the_input_size_a_repository_asks_for_is_bounded_at_load(hub_run):
    """60000 x 60000 pixels at 8-pixel patches: 7500^2 = 56,250,000 patches + the class token."""
    report, _, _, _, _ = hub_run
    assert report["org/huge-input"]["error"] == "UnsupportedModelError"
    assert report["org/huge-input"]["public"].startswith(
        "'org/huge-input' asks for 60000x60000-pixel inputs in its own files, which this server does not run: "
        "The input size 60000x60000 gives 56250001 tokens")


def test_weights_load_in_float32_whatever_the_config_says(hub_run):
    """The bound counts float32 parameters; a config's "dtype": "float64" doubled the memory before."""
    report, _, _, _, _ = hub_run
    assert report["org/float64"]["dtype"] == "torch.float32"


def test_a_hub_that_does_not_answer_the_probe_is_read_from_the_cache_only(hub_run):
    """Before: only the config was read offline; the weights load ran online, unsized, and downloaded them."""
    report, _, fake, _, _ = hub_run
    assert report["org/offline"]["error"] == "WeightsError"
    assert fake.downloaded("org/offline") == ["config.json"]  # the script's own download


def test_a_large_config_or_an_unsized_file_is_refused_unread(hub_run):
    report, _, fake, _, _ = hub_run
    assert report["org/big-config"]["public"] == ("'org/big-config' has a config.json of 5.0 MiB, more than the "
                                                  "4.0 MiB this server reads; refusing to download it.")
    assert fake.downloaded("org/big-config") == []
    assert report["org/no-size"]["public"] == ("The Hugging Face hub did not give the size of 'model.safetensors' in "
                                               "'org/no-size'; refusing to download it.")
    assert fake.downloaded("org/no-size") == ["config.json"]


def test_weight_files_follows_transformers_order():
    """Hand-made listings: the first of model.safetensors, its index, pytorch_model.bin, its index; the
    config's name first of all; an index's shards, each once, and only those."""
    none = lambda name: pytest.fail(f"read {name}")  # noqa: E731
    every = dict.fromkeys([hub.SAFE_WEIGHTS, hub.SAFE_INDEX, hub.PICKLE_WEIGHTS, hub.PICKLE_INDEX], 1)
    assert hub.weight_files(every, None, none) == ["model.safetensors"]
    assert hub.weight_files({hub.PICKLE_WEIGHTS: 1, hub.PICKLE_INDEX: 1}, None, none) == ["pytorch_model.bin"]
    assert hub.weight_files({"config.json": 1}, None, none) == []
    index = {"weight_map": {"a": "s2.safetensors", "b": "s1.safetensors", "c": "s2.safetensors"}}
    listing = {hub.SAFE_INDEX: 1, hub.PICKLE_WEIGHTS: 1, "s1.safetensors": 1, "s2.safetensors": 1}
    assert hub.weight_files(listing, None, lambda name: index) == [hub.SAFE_INDEX, "s1.safetensors", "s2.safetensors"]
    assert hub.weight_files({**every, "x.safetensors": 1}, "x.safetensors", none) == ["x.safetensors"]
    with pytest.raises(hub.ModelNotFoundError, match="does not hold"):
        hub.weight_files(every, "x.safetensors", none)
    with pytest.raises(hub.ModelNotFoundError, match="names 's1.safetensors'"):
        hub.weight_files({hub.SAFE_INDEX: 1}, None, lambda name: index)
    with pytest.raises(hub.ModelNotFoundError, match="no weight_map"):
        hub.weight_files({hub.SAFE_INDEX: 1}, None, lambda name: {"weight_map": [1]})


def test_the_served_page_refuses_an_oversized_hub_repository_with_a_sentence(tmp_path):
    """`python app.py` with the hub on a loopback port: Change model's /load_model with a repository listing
    a 6 GiB weights file for a 96 kB config (the default --memory-budget is 4 GiB) answers a sentence and
    fetches only its config files; the real small repository then loads and analyses a photo."""
    from gradio_client import Client
    from support.app import analyze, app_process, free_port, refused

    repos, _, _ = _repos()
    fake = FakeHub({"org/small": repos["org/small"], "org/huge": repos["org/small"]},
                   {"org/huge": {"model.safetensors": 6 * 2 ** 30}})
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "GRADIO_TEMP_DIR")}
    env |= {"HF_ENDPOINT": fake.url, "HF_HOME": str(tmp_path / "hf"), "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    server = app_process(port, env)
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        assert refused(client, "org/huge", None, api_name="/load_model") == (
            "'org/huge' keeps 6.0 GiB of weights (model.safetensors), more than the 4.0 GiB this server allows one "
            "model; refusing to download them.")
        assert fake.downloaded("org/huge") == ["config.json", "preprocessor_config.json"]
        client.predict("org/small", None, api_name="/load_model")
        predictions = analyze(client)["predictions"]  # the three classes of the loaded model, top first
        assert sorted(c["label"] for c in predictions["confidences"]) == ["LABEL_0 (#0)", "LABEL_1 (#1)", "LABEL_2 (#2)"]
        assert fake.downloaded("org/small") == ["config.json", "preprocessor_config.json", "model.safetensors"]
        server.terminate()
        log, _ = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
        fake.close()
    assert "Traceback" not in log
