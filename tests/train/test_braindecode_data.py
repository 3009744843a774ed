"""braindecode's datasets as they come (issue 35): windows from ``create_windows_from_events``
on a small mne RawArray, wrapped in braindecode's own dataset classes. Their items are
``(x, y, crop_inds)`` with ``x`` a numpy array and ``y`` the event code (an int): they train as
given; under a regression loss those integer codes are named before the first step, with the
fix; under ``loss="cross_entropy"`` they are the classes."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from hybridnb.train.trainer import Trainer

torch.set_num_threads(1)
CLASSES = ["left", "right", "feet", "tongue"]


@pytest.fixture(scope="module")
def windows():
    """Two recordings of 4 channels at 100 Hz, an annotation every second cycling through four
    classes; 1-s windows from each event (54 windows)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import mne
        from braindecode.datasets import BaseConcatDataset
        from braindecode.preprocessing import create_windows_from_events
        try:
            from braindecode.datasets import RawDataset
        except ImportError:  # braindecode < 1.2
            from braindecode.datasets import BaseDataset as RawDataset
    rng = np.random.default_rng(0)
    recordings = []
    for subject in range(2):
        raw = mne.io.RawArray(rng.standard_normal((4, 3000)),  # "volts" of unit size
                              mne.create_info(4, 100.0, "eeg"), verbose="error")
        onsets = np.arange(1, 28, 1.0)
        labels = [CLASSES[i % 4] for i in range(len(onsets))]
        raw.set_annotations(mne.Annotations(onsets, 0.5, labels))
        # the class shows in the data: a 10-Hz burst on the class's own channel
        data = raw.get_data()
        t = np.arange(100) / 100.0
        for onset, label in zip(onsets, labels, strict=True):
            start = int(onset * 100)
            data[CLASSES.index(label), start:start + 100] += 3 * np.sin(2 * np.pi * 10 * t)
        raw._data[:] = data
        recordings.append(RawDataset(raw, pd.Series({"subject": subject})))
    return create_windows_from_events(BaseConcatDataset(recordings),
                                      trial_start_offset_samples=0,
                                      trial_stop_offset_samples=50, preload=True)


def net(outputs: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(4 * 100, 16), nn.ReLU(), nn.Linear(16, outputs))


def trainer(model, **kw):
    return Trainer(model, **{"device": "cpu", "batch_size": 16, "epochs": 1, "seed": 0,
                             "live": False, "isolate": False, "verbose": False, **kw})


def test_the_items_are_what_braindecode_gives(windows):
    x, y, crop = windows[0]
    assert isinstance(x, np.ndarray) and x.shape == (4, 100)
    assert isinstance(y, int) and isinstance(crop, list)
    assert type(windows).__name__ == "BaseConcatDataset"


def test_event_codes_under_a_regression_loss_are_named_before_the_first_step(windows):
    tr = trainer(net(1))
    steps = []
    tr.bus.subscribe(lambda e: steps.append(e) if type(e).__name__ == "StepEnded" else None)
    tr.fit(windows, windows)
    said = [e for e in tr.events if e.kind == "target_kind"]
    assert len(said) == 1, [str(e) for e in tr.events]
    message = said[0].message
    for fact in ("integers", "event codes", "loss='mse'", "loss='cross_entropy'",
                 "targets_from='metadata'"):
        assert fact in message, message
    assert said[0].step == 0  # before the first optimizer step
    assert steps and steps[0].step == 1


def test_event_codes_train_a_classifier_as_they_come(windows):
    tr = trainer(net(4), loss="cross_entropy", epochs=8, lr=1e-2)
    history = tr.fit(windows, windows)
    assert not [e for e in tr.events if e.kind == "target_kind"]
    assert history["val_accuracy"].notna().all()
    scores = tr.evaluate(windows)
    assert scores["accuracy"] > 0.5  # chance is 0.25: the classes are in the data
    labels = tr.predict(windows)
    assert labels.dtype == np.int64 and labels.shape == (len(windows),)
    truth = np.array([windows[i][1] for i in range(len(windows))])
    assert scores["accuracy"] == pytest.approx(float((labels == truth).mean()))
