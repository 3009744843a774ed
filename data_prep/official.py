"""The official pipeline (eegdash + braindecode, the starter kit's recipe) for parity and benchmarks.

This is the reference that :mod:`data_prep.challenge1` / :mod:`data_prep.challenge2` must match,
written as the starter kit and local scoring do it (reference §1.1, §2.2; feasibility §3, §5),
with the known traps handled and named:

* braindecode 1.8.1 renamed ``BaseDataset`` to ``RawDataset`` (the starter kit's import fails):
  :func:`raw_dataset_class` takes whichever exists.
* ``create_windows_from_events(..., preload=True)`` does not load the signal in braindecode
  1.8.1 (only the mne.Epochs path uses it); without ``raw.load_data()`` first, every item
  re-reads the BDF. ``load=True`` (the default here) loads the raws first; ``load=False``
  reproduces the starter kit as written.
* eegdash offline needs ``download=False`` and an absolute cache_dir (:func:`data_prep.bids.
  load_eegdash`); its descriptions are strings (``float()`` them).

Needs the ``challenge`` extra (eegdash); everything is imported lazily.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

C1_KEYS = ("target", "rt_from_stimulus", "rt_from_trialstart", "stimulus_onset",
           "response_onset", "correct", "response_type")


def available() -> bool:
    """True when eegdash (and so the official windowing helpers) can be imported."""
    try:
        import eegdash.hbn.windows  # noqa: F401
    except ImportError:
        return False
    return True


def raw_dataset_class():
    """braindecode's dataset of one continuous recording: RawDataset (>= 1.x) or BaseDataset."""
    try:
        from braindecode.datasets import RawDataset
    except ImportError:            # braindecode < 1.0 (the competition cluster ran 1.2.0)
        from braindecode.datasets import BaseDataset as RawDataset
    return RawDataset


def load_recordings(root, task, loader: str = "eegdash", load: bool = True,
                    release: str = "R5", mini: bool = True):
    """The recordings of ``task`` as a braindecode BaseConcatDataset, loaded the official way.

    ``loader="eegdash"``: EEGChallengeDataset offline on ``root``'s parent (root must be
    ``.../EEG2025r5mini``); ``"mne_bids"``: read_raw_bids per file into RawDataset, descriptions
    from participants.tsv (feasibility §2a). ``load``: call ``raw.load_data()`` on every raw
    (the fix for braindecode 1.8.1 ignoring ``preload=True``).
    """
    from braindecode.datasets import BaseConcatDataset

    root = Path(root)
    tasks = [task] if isinstance(task, str) else list(task)
    if loader == "eegdash":
        from .bids import load_eegdash
        ds = load_eegdash(root.parent, release=release, mini=mini, task=tasks)
    elif loader == "mne_bids":
        from mne_bids import get_bids_path_from_fname, read_raw_bids

        from .bids import find_recordings
        cls = raw_dataset_class()
        items = []
        for rec in find_recordings(root, tasks=tasks):
            raw = read_raw_bids(get_bids_path_from_fname(rec.path), verbose="error")
            items.append(cls(raw, description=dict(rec.description)))
        ds = BaseConcatDataset(items)
    else:
        raise ValueError(f"loader must be 'eegdash' or 'mne_bids', got {loader!r}")
    if load:
        for d in ds.datasets:
            d.raw.load_data()
    return ds


def c1_windows(ds, preload: bool = True):
    """The starter kit's Challenge 1 windows of ``ds`` (exact arguments of challenge_1.py)."""
    from braindecode.preprocessing import Preprocessor, create_windows_from_events, preprocess
    from eegdash.hbn.windows import (
        add_aux_anchors,
        add_extras_columns,
        annotate_trials_with_target,
        keep_only_recordings_with,
    )

    preprocess(ds, [Preprocessor(annotate_trials_with_target, target_field="rt_from_stimulus",
                                 epoch_length=2.0, require_stimulus=True, require_response=True,
                                 apply_on_array=False),
                    Preprocessor(add_aux_anchors, apply_on_array=False)], n_jobs=1)
    ds = keep_only_recordings_with("stimulus_anchor", ds)
    win = create_windows_from_events(
        ds, mapping={"stimulus_anchor": 0}, trial_start_offset_samples=50,
        trial_stop_offset_samples=250, window_size_samples=200, window_stride_samples=100,
        preload=preload)
    return add_extras_columns(win, ds, desc="stimulus_anchor", keys=C1_KEYS)


def c2_windows(ds, target: str = "externalizing", preload: bool = True):
    """Local scoring's Challenge 2 filter + fixed-length windows (400 samples, stride 200)."""
    from braindecode.datasets import BaseConcatDataset
    from braindecode.preprocessing import create_fixed_length_windows

    keep = [d for d in ds.datasets
            if d.raw.n_times >= 400 and len(d.raw.ch_names) == 129
            and not math.isnan(float(d.description[target]))]
    return create_fixed_length_windows(BaseConcatDataset(keep), window_size_samples=400,
                                       window_stride_samples=200, drop_last_window=True,
                                       preload=preload)


class CropWrapper:
    """The starter kit's ``DatasetWrapper``: random 2-s crops, one ``random.Random`` per recording."""

    def __init__(self, win_ds, target: str = "externalizing", crop: int = 200,
                 seed: int | None = None):
        self.ds, self.crop, self.rng = win_ds, crop, random.Random(seed)
        self.y = float(win_ds.description[target])

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i):
        X, _, (iw, i0, i1) = self.ds[i]
        off = self.rng.randint(0, i1 - i0 - self.crop)
        return X[:, off:off + self.crop], self.y, (iw, i0 + off, i0 + off + self.crop)


def c2_crops(windows, target: str = "externalizing", seed: int | None = None):
    """ConcatDataset of :class:`CropWrapper` (what the starter kit trains on)."""
    import torch
    return torch.utils.data.ConcatDataset(
        [CropWrapper(d, target=target, seed=seed) for d in windows.datasets])
