"""Classification (issue 35): ``loss="cross_entropy"`` with class weights, accuracy and balanced
accuracy in the history and ``evaluate()``, predictions as labels, probabilities or raw logits,
the live view's status line showing the run's metric, and the same through an isolated
worker."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from hybridnb.live.record import RunRecord
from hybridnb.live.summary import status
from hybridnb.train.evaluation import classification_metrics
from hybridnb.train.losses import CrossEntropy
from hybridnb.train.trainer import Trainer

torch.set_num_threads(1)


def blobs(n=96, classes=3, seed=0):
    """Three well-separated classes in 8 dimensions (the same centres for every seed); labels
    int64 0..2 (1 and 2 the rarer)."""
    y = torch.tensor([0, 0, 1, 2] * (n // 4))
    centres = torch.randn(classes, 8, generator=torch.Generator().manual_seed(99)) * 3
    return centres[y] + torch.randn(n, 8, generator=torch.Generator().manual_seed(seed)), y


def net(classes=3):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, classes))


def trainer(**kw):
    return Trainer(net(), **{"loss": "cross_entropy", "device": "cpu", "batch_size": 16,
                             "epochs": 4, "lr": 1e-2, "seed": 0, "live": False,
                             "isolate": False, **kw})


def test_a_classifier_trains_and_reports_accuracy_in_the_history_and_evaluate():
    (x, y), val = blobs(), blobs(seed=1)
    tr = trainer(monitor="val_balanced_accuracy", early_stopping=3)
    history = tr.fit((x, y), val)
    assert history["val_accuracy"].notna().all() and history["val_balanced_accuracy"].notna().all()
    assert history["val_rmse"].isna().all()  # no regression metrics on class indices
    scores = tr.evaluate(val)
    assert set(scores) == {"loss", "accuracy", "balanced_accuracy"}
    assert scores["accuracy"] > 0.9
    logits = tr.predict(val, output="raw")
    assert logits.shape == (96, 3)
    assert scores["loss"] == pytest.approx(float(F.cross_entropy(torch.from_numpy(logits),
                                                                 val[1])), rel=1e-5)
    labels = tr.predict(val)
    assert labels.dtype == np.int64 and np.array_equal(labels, logits.argmax(axis=1))
    probs = tr.predict(val, output="probs")
    assert np.allclose(probs.sum(axis=1), 1, atol=1e-5)
    assert np.array_equal(probs.argmax(axis=1), labels)
    # balanced accuracy: higher is better, so the best kept is the highest validated
    assert tr.state.best.value == pytest.approx(history["val_balanced_accuracy"].max())


def test_balanced_accuracy_is_the_mean_recall_over_the_classes_present():
    y = np.array([0, 0, 0, 0, 1, 1])
    logits = np.eye(3)[[0, 0, 0, 0, 0, 1]]  # class 0 all right, class 1 half right
    got = classification_metrics(y, logits)
    assert got["accuracy"] == pytest.approx(5 / 6)
    assert got["balanced_accuracy"] == pytest.approx((1.0 + 0.5) / 2)


def test_class_weights_weigh_each_sample_by_its_class_and_split_exactly():
    logits, y = torch.randn(12, 3), torch.tensor([0, 1, 2, 1] * 3)
    loss = CrossEntropy((1.0, 4.0, 0.5))
    per = F.cross_entropy(logits, y, reduction="none") * torch.tensor([1.0, 4.0, 0.5])[y]
    assert float(loss(logits, y)) == pytest.approx(float(per.mean()))
    halves = (loss(logits[:5], y[:5]) * 5 + loss(logits[5:], y[5:]) * 7) / 12  # micro-batches
    assert float(halves) == pytest.approx(float(loss(logits, y)))
    tr = trainer(class_weights=[1.0, 4.0, 0.5], epochs=1)
    tr.fit(blobs())
    assert tr.settings.class_weights == (1.0, 4.0, 0.5)


def test_whole_number_float_targets_are_classes_and_targets_shaped_n_1_too():
    x, y = blobs()
    tr = trainer(epochs=1)
    tr.fit((x, y.float().reshape(-1, 1)))  # numpy habits: float32 labels, a column
    assert tr.evaluate((x, y))["accuracy"] == tr.evaluate((x, y.float()))["accuracy"]


def test_a_regression_model_under_cross_entropy_is_named_before_the_header(capsys):
    x, y = blobs()
    with pytest.raises(ValueError, match="one output per class") as err:
        Trainer(net(1), loss="cross_entropy", device="cpu", live="text", isolate=False,
                epochs=1).fit((x, y))
    assert "n_outputs" in str(err.value)
    printed = capsys.readouterr()
    assert "Trained" not in printed.out + printed.err


def test_the_live_status_line_shows_the_runs_metric():
    record = RunRecord({"epochs": 2, "steps_per_epoch": 4, "monitor": "val_loss",
                        "metric": "val_accuracy"})
    record.add({"epoch": 0, "step": 4, "global_step": 4, "train_loss": 0.5,
                   "val_loss": 0.4, "val_accuracy": 0.875, "val_balanced_accuracy": 0.8,
                   "lr": 1e-3, "epoch_end": True})
    line = status(record)
    assert "val_loss 0.4" in line and "val_accuracy 0.875" in line, line


@pytest.mark.skipif(not hasattr(os, "fork"), reason="isolation needs os.fork")
def test_an_isolated_classifier_equals_the_in_process_one():
    (x, y), val = blobs(), blobs(seed=1)
    here = trainer(class_weights=[1, 2, 1], epochs=2)
    there = trainer(class_weights=[1, 2, 1], epochs=2, isolate=True)
    a, b = here.fit((x, y), val), there.fit((x, y), val)
    assert there.isolated and not any(e.kind == "worker_lost" for e in there.events)
    cols = ["train_loss", "val_loss", "val_accuracy", "val_balanced_accuracy"]
    assert a[cols].equals(b[cols])
    assert torch.equal(here.model[2].weight, there.model[2].weight)  # the worker's, brought back
