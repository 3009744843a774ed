"""Clear words (issue 27, item 11): a file refused because it holds pickled code says so (not
"truncated or corrupt"), and a batch whose samples have another shape names the batch, the
epoch and both shapes instead of torch's ``mat1 and mat2 shapes cannot be multiplied``."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

import hybridnb as hn
from hybridnb.saving import ModelFileError
from hybridnb.train import checkpoint
from hybridnb.train.trainer import Trainer

torch.set_num_threads(1)


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


# ---------------------------------------------------------------- files that hold pickled code
def test_a_whole_pickled_model_is_refused_as_code_not_as_corrupt(tmp_path):
    path = tmp_path / "whole.pt"
    torch.save(net(), path)  # the module object, pickled: loading it would run code
    with pytest.raises(ModelFileError) as caught:
        hn.load(path, net())
    message = str(caught.value)
    assert str(path) in message and "pickled" in message
    assert "torch.nn.modules.container.Sequential" in message  # what it holds, named
    assert "trainer.save" in message and "state_dict()" in message  # what to do
    assert "weights_only=False" in message and "trust" in message
    assert "corrupt" not in message


def test_a_checkpoint_holding_objects_is_refused_as_code(tmp_path):
    path = tmp_path / "last.pt"
    torch.save({"format": checkpoint.FORMAT, "model": net()}, path)
    with pytest.raises(checkpoint.CheckpointError) as caught:
        checkpoint.load(path)
    message = str(caught.value)
    assert str(path) in message and "pickled" in message and "corrupt" not in message


def test_a_truncated_model_file_is_still_called_truncated(tmp_path):
    path = tmp_path / "model.pt"
    Trainer(net(), device="cpu", live=False, isolate=False).save(path)
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(ModelFileError, match="truncated") as caught:
        hn.load(path, net())
    assert "pickled" not in str(caught.value)


# ---------------------------------------------------------------- a sample of another shape
class OneOdd(Dataset):
    """128 samples of 8 features, except item ``odd`` (9 features): a real data bug."""

    def __init__(self, odd=40):
        g = torch.Generator().manual_seed(0)
        self.x, self.odd = torch.randn(128, 9, generator=g), odd
        self.read: list[int] = []  # the items in the order the (shuffled) loader read them
        self.y = torch.sin(self.x[:, :8].sum(1, keepdim=True))

    def __len__(self):
        return 128

    def __getitem__(self, i):
        self.read.append(i)
        return (self.x[i] if i == self.odd else self.x[i, :8]), self.y[i]


def test_a_batch_of_another_sample_shape_names_the_batch_and_both_shapes():
    data = OneOdd(40)
    tr = Trainer(net(), device="cpu", batch_size=1, epochs=1, lr=1e-2, seed=0, live=False,
                 isolate=False)
    with pytest.raises(ValueError) as caught:
        tr.fit(data)
    assert data.read[0] == 0  # fit looked at the first item before starting (its structure)
    batch = data.read[1:].index(40)  # then one sample per batch
    assert batch > 0
    message = str(caught.value)
    assert f"batch {batch} of epoch 0" in message and "training" in message
    assert "(9,)" in message and "(8,)" in message
    assert "mat1" not in message
    assert tr.global_step == batch  # the good batches before it were trained


def test_samples_of_different_shapes_inside_one_batch_name_that_batch():
    data = OneOdd(40)
    tr = Trainer(net(), device="cpu", batch_size=32, epochs=1, lr=1e-2, seed=0, live=False,
                 isolate=False)
    with pytest.raises(ValueError) as caught:
        tr.fit(data)
    batch = data.read[1:].index(40) // 32  # after fit's look at the first item
    message = str(caught.value)
    assert f"batch {batch} of epoch 0" in message and "[9]" in message and "[8]" in message
    assert tr.global_step == batch
