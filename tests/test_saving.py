"""Save and load (issue 21): ``trainer.save`` then ``hn.load`` gives identical predictions; the
file says what it holds; a file that is not ours, another model class and mismatched weights
get errors naming the file and what differs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import hybridnb as hn
from hybridnb import saving
from hybridnb.train.trainer import Trainer

torch.set_num_threads(1)


class Conv(nn.Module):
    """(channels, times) inputs, as the EEG windows are."""

    def __init__(self, chans=4, times=20, hidden=8):
        super().__init__()
        self.conv = nn.Conv1d(chans, hidden, 5)
        self.head = nn.Linear(hidden * (times - 4), 1)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).flatten(1))


class Other(Conv):
    pass


def data(n=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, 20, generator=g)
    return x, x.mean((1, 2))


def fitted(tmp_path, **kw):
    torch.manual_seed(0)
    tr = Trainer(Conv(), device="cpu", batch_size=32, epochs=2, live=False, isolate=False,
                 seed=0, checkpoint_dir=tmp_path / "ck", **kw)
    tr.fit(data(), val=data(32, seed=1))
    return tr


def test_save_then_load_predicts_the_same(tmp_path):
    tr = fitted(tmp_path, ema=0.9)
    path = tr.save(tmp_path / "model.pt", extra={"target_scale": 1e6})
    assert not list(tmp_path.glob(".model.pt.tmp-*"))  # written through a temporary file
    meta = saving.read_metadata(path)
    assert meta["format"] == saving.FORMAT
    assert meta["model_class"] == {"module": Conv.__module__, "qualname": "Conv",
                                   "init": None}  # its arguments are not known
    assert meta["input_shape"] == [4, 20]  # one sample, from the first batch
    assert meta["weights"] == "ema"  # fit left the EMA weights in trainer.model
    assert meta["versions"]["torch"] == torch.__version__
    assert meta["versions"]["hybridnb"] == hn.__version__
    assert meta["extra"]["target_scale"] == 1e6 and meta["extra"]["epochs"] == 2

    torch.manual_seed(123)
    model = hn.load(path, Conv())
    assert not model.training
    x = data(32, seed=2)[0]
    with torch.no_grad():
        assert torch.equal(model(x).squeeze(1), torch.as_tensor(tr.predict(x)))


def test_best_weights_are_what_is_saved_after_early_stopping(tmp_path):
    tr = fitted(tmp_path, early_stopping=5)
    assert any(e.kind == "best_restored" for e in tr.events)
    meta = saving.read_metadata(tr.save(tmp_path / "m.pt"))
    assert meta["weights"] == "best"


def test_the_wrong_file_class_or_shape_is_named(tmp_path):
    tr = fitted(tmp_path)
    path = tr.save(tmp_path / "model.pt")

    with pytest.raises(saving.ModelFileError, match=r"model\.pt holds weights of a .*\.Conv, "
                                                    r"but the model given is a .*\.Other"):
        hn.load(path, Other())
    small = Conv(hidden=6)
    before = {k: v.clone() for k, v in small.state_dict().items()}
    with pytest.raises(saving.ModelFileError, match=r"does not fit this model \(3 shaped "
                                                    r"differently: conv\.weight \(8, 4, 5\)"):
        hn.load(path, small)
    assert all(torch.equal(v, before[k]) for k, v in small.state_dict().items())  # untouched
    grown = Conv()
    grown.extra = nn.Linear(1, 1)
    with pytest.raises(saving.ModelFileError, match=r"2 missing from the file: extra\.weight, "
                                                    r"extra\.bias"):
        hn.load(path, grown)
    with pytest.raises(TypeError, match=r"needs a model instance .* Conv\(\.\.\.\)"):
        hn.load(path, Conv)

    plain = tmp_path / "plain.pt"
    torch.save(Conv().state_dict(), plain)
    with pytest.raises(saving.ModelFileError, match=r"plain\.pt is not a model saved by "
                                                    r"hybridnb"):
        hn.load(plain, Conv())
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a torch file")
    with pytest.raises(saving.ModelFileError, match="garbage.pt is not a readable model file"):
        hn.load(garbage, Conv())
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        hn.load(tmp_path / "missing.pt", Conv())


def test_a_checkpoint_loads_as_a_model(tmp_path):
    tr = fitted(tmp_path)
    model = hn.load(tmp_path / "ck" / "last.pt", Conv())
    for a, b in zip(model.state_dict().values(), tr.model.state_dict().values(), strict=True):
        assert np.array_equal(a.numpy(), b.numpy())
    with pytest.raises(saving.ModelFileError, match="Other"):
        hn.load(tmp_path / "ck" / "last.pt", Other())


class Fixed(nn.Module):
    """A model whose __init__ takes no arguments: nothing to know to rebuild it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 1)

    def forward(self, x):
        return self.lin(x)


def test_load_without_a_model_rebuilds_it_from_the_saved_arguments(tmp_path):
    torch.manual_seed(0)
    tr = Trainer(Conv(chans=4, times=20, hidden=6), epochs=1, batch_size=32, device="cpu",
                 live=False, verbose=False, isolate=False, seed=0)
    tr.fit(data())
    path = tr.save(tmp_path / "m.pt", init_args={"chans": 4, "times": 20, "hidden": 6})
    model = hn.load(path)
    assert type(model) is Conv and not model.training and model.conv.out_channels == 6
    x = data(8, seed=3)[0]
    with torch.no_grad():
        assert torch.equal(model(x), tr.model.eval()(x))
    torch.manual_seed(1)
    saving.save_model(Fixed(), tmp_path / "fixed.pt")  # no arguments to know
    assert isinstance(hn.load(tmp_path / "fixed.pt"), Fixed)


def test_load_without_a_model_rebuilds_a_braindecode_model(tmp_path):
    models = pytest.importorskip("braindecode.models")
    torch.manual_seed(0)
    net = models.ShallowFBCSPNet(n_chans=4, n_outputs=1, n_times=120, final_conv_length="auto",
                                 n_filters_time=6, n_filters_spat=5)
    saving.save_model(net, tmp_path / "shallow.pt", input_shape=(4, 120))
    meta = saving.read_metadata(tmp_path / "shallow.pt")["model_class"]
    assert meta["init"]["how"] == "from_config" and meta["init"]["args"]["n_filters_time"] == 6
    back = hn.load(tmp_path / "shallow.pt")
    assert type(back) is type(net) and back.n_chans == 4
    x = torch.randn(3, 4, 120)
    with torch.no_grad():
        assert torch.equal(back(x), net.eval()(x))


def test_load_without_a_model_says_to_pass_it_when_it_cannot_rebuild(tmp_path):
    saving.save_model(Conv(), tmp_path / "conv.pt")  # arguments not known
    with pytest.raises(saving.ModelFileError, match=r"Conv but not the arguments.*init_args"
                       r".*pass the model: hn\.load\("):
        hn.load(tmp_path / "conv.pt")
    assert isinstance(hn.load(tmp_path / "conv.pt", Conv()), Conv)  # with the model: as before

    class Local(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 1)

    saving.save_model(Local(), tmp_path / "local.pt")
    with pytest.raises(saving.ModelFileError, match=r"defined inside a function.*pass the model"):
        hn.load(tmp_path / "local.pt")
    gone = type("Gone", (Fixed,), {"__module__": "no_such_package.models"})
    saving.save_model(gone(), tmp_path / "gone.pt")
    with pytest.raises(saving.ModelFileError, match=r"no_such_package\.models\.Gone, which "
                       r"cannot be imported here \(ModuleNotFoundError.*pass the model"):
        hn.load(tmp_path / "gone.pt")


def test_a_lazy_layer_loads_the_shapes_the_file_holds(tmp_path):
    """An unset lazy layer (braindecode's CBraMod has a LazyLinear head) takes its shape from
    the file, as torch's own load does; the key check must not read the unset shape."""
    torch.manual_seed(0)
    trained = nn.Sequential(nn.Linear(5, 3))
    path = saving.save_model(trained, tmp_path / "m.pt")
    fresh = hn.load(path, nn.Sequential(nn.LazyLinear(3)))
    assert torch.equal(fresh[0].weight, trained[0].weight)


def test_old_weight_names_are_read_through_the_models_mapping(tmp_path):
    """braindecode renames old checkpoint keys in its load_state_dict (``model.mapping``)."""

    class Renamed(nn.Module):
        mapping = {"old.weight": "new.weight", "old.bias": "new.bias"}

        def __init__(self):
            super().__init__()
            self.new = nn.Linear(2, 1)

        def load_state_dict(self, state, *args, **kwargs):
            state = {self.mapping.get(k, k): v for k, v in state.items()}
            return super().load_state_dict(state, *args, **kwargs)

    class Old(nn.Module):
        def __init__(self):
            super().__init__()
            self.old = nn.Linear(2, 1)

    Old.__qualname__ = Renamed.__qualname__  # the same class, saved by an older version
    old = Old()
    path = saving.save_model(old, tmp_path / "old.pt")
    assert torch.equal(hn.load(path, Renamed()).new.weight, old.old.weight)
