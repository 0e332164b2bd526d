"""Published weights: exact round trip, tied tensors stored apart, bytes checked, old versions pruned."""

import pytest
import torch

from rlcore.weights import WeightStore


def test_a_published_version_loads_back_exactly_and_checks_its_hash(tmp_path):
    shared = torch.randn(5, 3)
    weights = {
        "embed.weight": shared,
        "head.weight": shared,
        "bias": torch.arange(3.0),
    }  # tied, as in the tiny model
    store = WeightStore(tmp_path / "weights")
    published = store.publish(4, weights)
    assert published.path == tmp_path / "weights" / "v000004.safetensors"
    assert published.size_bytes == published.path.stat().st_size
    loaded = store.load(4, published.sha256)
    assert set(loaded) == set(weights)
    for name, tensor in weights.items():
        assert torch.equal(loaded[name], tensor), name
    assert not list((tmp_path / "weights").glob(".*tmp")), "no temporary file left behind"
    with pytest.raises(ValueError, match="do not match their sha256"):
        store.load(4, "0" * 64)


def test_republishing_the_same_weights_gives_the_same_hash_and_remove_deletes_what_is_named(tmp_path):
    store = WeightStore(tmp_path)
    weights = {"w": torch.ones(2, 2)}
    first = [store.publish(v, weights).sha256 for v in (0, 1, 2)]
    assert len(set(first)) == 1 and store.publish(1, weights).sha256 == first[0]
    assert store.publish(3, {"w": torch.zeros(2, 2)}).sha256 != first[0]
    store.remove({0, 2, 9})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v000001.safetensors", "v000003.safetensors"]
    with pytest.raises(FileNotFoundError):
        store.load(0, first[0])


def test_the_written_file_is_plain_safetensors_of_every_dtype_and_its_hash_is_the_files(tmp_path):
    import hashlib

    from safetensors.torch import load_file

    from rlcore.weights import write_safetensors

    tensors = {
        "f32": torch.randn(4, 3),
        "bf16": torch.randn(2, 5).to(torch.bfloat16),
        "f16": torch.randn(3).half(),
        "i64": torch.arange(7),
        "flag": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "strided": torch.randn(6, 6)[:, ::2],  # not contiguous
    }
    sha256, size = write_safetensors(tmp_path / "w.safetensors", tensors)
    data = (tmp_path / "w.safetensors").read_bytes()
    assert (sha256, size) == (hashlib.sha256(data).hexdigest(), len(data))
    loaded = load_file(tmp_path / "w.safetensors")
    assert set(loaded) == set(tensors)
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name
    with pytest.raises(ValueError, match="'c'.*cannot be published"):
        write_safetensors(tmp_path / "x.safetensors", {"c": torch.zeros(2, dtype=torch.complex64)})
