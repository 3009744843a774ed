"""Habits from other libraries met with hybridnb's own answer (issue 35): Lightning's, fastai's
and skorch's keywords name the option to use, Lightning's precision names map, a model whose
Lightning hooks would be ignored is refused, ``trainer.test`` evaluates; data in the forms users
bring it (``fit(X, y)``, objects that make their Dataset, streams without a length) gets an
answer before anything is printed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset

from hybridnb.train.trainer import Trainer

torch.set_num_threads(1)


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))


def arrays(n=64):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, 2, 4)).astype(np.float32)
    return X, X.reshape(n, -1).sum(axis=1).astype(np.float32)


def trainer(model=None, **kw):
    return Trainer(model if model is not None else net(), **{
        "device": "cpu", "batch_size": 16, "epochs": 1, "seed": 0, "live": False,
        "isolate": False, **kw})


# --- keywords -------------------------------------------------------------------------------
@pytest.mark.parametrize("given,use", [
    ({"max_epochs": 3}, "use epochs="), ({"accumulate_grad_batches": 2}, "use grad_accum="),
    ({"gradient_clip_val": 0.5}, "use clip_grad="), ({"accelerator": "gpu"}, "use device="),
    ({"metrics": ["acc"]}, "loss='cross_entropy': accuracy"),
    ({"epoch": 3}, "did you mean epochs="), ({"learning_rate": 1e-3}, "use lr="),
])
def test_an_unknown_keyword_names_the_option_that_does_it(given, use):
    with pytest.raises(TypeError) as err:
        trainer(**given)
    message = str(err.value)
    assert repr(next(iter(given))) in message and use in message, message


@pytest.mark.parametrize("lightning,ours", [("16-mixed", "fp16"), ("bf16-mixed", "bf16"),
                                            ("32-true", "fp32"), ("32", "fp32"), (32, "fp32"),
                                            (torch.bfloat16, "bf16")])
def test_lightning_precision_names_map_to_ours(lightning, ours):
    assert trainer(precision=lightning).settings.precision == ours


@pytest.mark.parametrize("pure,says", [("bf16-true", "precision='bf16'"),
                                       ("64-true", "precision='fp32'")])
def test_precisions_hybridnb_does_not_run_say_what_to_use(pure, says):
    with pytest.raises(ValueError, match="not supported") as err:
        trainer(precision=pure)
    assert says in str(err.value)


class LitNet(nn.Module):  # a LightningModule's shape, without Lightning installed
    def __init__(self):
        super().__init__()
        self.net = net()

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.l1_loss(self(x).squeeze(-1), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_model_with_lightning_hooks_is_refused_not_silently_retrained():
    with pytest.raises(TypeError) as err:
        trainer(LitNet())
    message = str(err.value)
    for fact in ("training_step", "configure_optimizers", "never calls", "model.net"):
        assert fact in message, message
    trainer(LitNet().net)  # the network they wrap trains


def test_test_is_evaluate():
    X, y = arrays()
    tr = trainer()
    tr.fit((X, y))
    assert tr.test((X, y)) == tr.evaluate((X, y))


# --- data as users bring it -----------------------------------------------------------------
def test_fit_x_y_names_the_tuple_and_nothing_is_printed_first(capsys):
    X, y = arrays()
    tr = trainer(live="text")
    with pytest.raises(TypeError, match=r"trainer\.fit\(\(X, y\)\)"):
        tr.fit(X, y)
    with pytest.raises(ValueError, match="inputs without targets"):
        tr.fit(X)
    out = capsys.readouterr()
    assert "Trained" not in out.out + out.err and "hybridnb ·" not in out.out + out.err
    assert tr.fit((X, y)) is not None  # the fix works


class InputsOnly(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return {"x": torch.zeros(8), "label": 0.0}


def test_items_that_are_not_x_y_are_named_before_the_header(capsys):
    with pytest.raises(ValueError, match=r"InputsOnly\[0\] is a dict with keys \['label', 'x'\]"):
        trainer(live="text").fit(InputsOnly())
    out = capsys.readouterr()
    assert "Trained" not in out.out + out.err and "hybridnb ·" not in out.out + out.err


class Windowed:
    """A data library's windows: not a Dataset, but they know the one to train on."""

    def __init__(self, scale=None):
        self.X, self.y = arrays()
        self.scale = scale

    def __len__(self):
        return len(self.y)

    def dataset(self, scale=1.0):
        return torch.utils.data.TensorDataset(torch.from_numpy(self.X * scale),
                                              torch.from_numpy(self.y))


class KnowsItsDataset(Windowed):
    def to_dataset(self):
        return self.dataset(scale=2.0)


def test_an_object_that_makes_its_dataset_is_told_the_call_or_used():
    tr = trainer()
    for call in (tr.fit, tr.plan, tr.evaluate, tr.predict):
        with pytest.raises(TypeError, match=r"pass (train|data)\.dataset\(\.\.\.\)"):
            call(Windowed())
    tr.fit(KnowsItsDataset(), KnowsItsDataset())
    said = [e.message for e in tr.events if e.kind == "data"]
    assert said and "to_dataset()" in said[0], said
    assert tr.predict(KnowsItsDataset()).shape == (64,)
    assert tr.plan(KnowsItsDataset()).steps_per_epoch == 4


class Stream(IterableDataset):
    def __iter__(self):
        X, y = arrays(40)
        return iter(zip(torch.from_numpy(X), torch.from_numpy(y), strict=True))


def test_a_stream_without_length_needs_steps_per_epoch_and_then_trains():
    with pytest.raises(TypeError, match="pass steps_per_epoch=") as err:
        trainer().fit(Stream())
    assert "Stream" in str(err.value) and "has no len()" not in str(err.value)
    tr = trainer(steps_per_epoch=2, epochs=2, speedups=True)  # as on CUDA: an example batch
    history = tr.fit(Stream(), Stream())
    assert tr.global_step == 4 and history["val_loss"].notna().all()
    assert any("cannot shuffle" in e.message for e in tr.events)
    assert tr.predict(Stream()).shape == (40,)


def test_data_preps_windows_train_as_the_tour_makes_them():
    """The README's second snippet after the tour: ``trainer.plan(train)``, ``fit(train, val)``
    with data_prep's ``Windows`` as they are: their ``to_dataset()`` (volts -> µV)."""
    import pandas as pd

    from data_prep.windows import Windows

    rng = np.random.default_rng(0)
    X = (rng.standard_normal((48, 2, 4)) * 1e-6).astype(np.float32)  # volts
    meta = pd.DataFrame({"subject": np.repeat(["a", "b", "c"], 16), "recording": 0,
                         "target": X.reshape(48, -1).sum(axis=1) * 1e6})
    w = Windows(X, meta, pd.DataFrame(columns=["level"]))
    train, val = w.subset(np.arange(32)), w.subset(np.arange(32, 48))
    tr = trainer(epochs=2)
    assert tr.plan(train).steps_per_epoch == 2
    tr.fit(train, val)
    said = [e.message for e in tr.events if e.kind == "data"]
    assert said and "Windows" in said[0] and "x 1e+06" in said[0], said
    assert np.allclose(tr.predict(test := val), tr.predict(test.dataset(scale=1e6)))


def test_a_fit_that_fails_at_its_first_batch_does_not_say_it_trained(capsys):
    """A DataLoader is read only at the first step: its header is out by then, but the summary
    says the model was not trained, not "Trained ... for 0 of 1 epochs"."""
    loader = torch.utils.data.DataLoader(torch.randn(32, 8), batch_size=8)
    with pytest.raises(ValueError, match=r"\(x, y\)"):
        trainer(nn.Linear(8, 1), live="text").fit(loader)
    printed = capsys.readouterr()
    assert "Trained" not in printed.out + printed.err
    assert "was not trained: the fit stopped at an error before its first step" in printed.out
