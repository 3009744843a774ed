"""The torch Dataset over a window store: whole batches per read, crops by slicing.

* ``ds[i]`` -> ``(x, y)``; ``ds[[i, j, ...]]`` -> ``(X, y)`` for the whole batch at once.
* ``__getitems__`` makes a plain ``DataLoader(ds, batch_size=128)`` fetch each batch with one
  fancy-index read of the memmap instead of 128 reads; ``ds.loader()`` also skips the
  per-sample collation (a batch sampler feeds ``ds[list]`` directly).
* Crops (Challenge 2's random 2-s crops of 4-s windows) follow the starter kit's convention:
  one ``random.Random(seed)`` per recording, one ``randint(0, T - crop)`` per item, drawn in
  access order — so sequential evaluation gives the same crops as the starter kit's
  ``DatasetWrapper`` (seed 42 in the organisers' local scoring).
* ``device="cuda"`` (or any torch device) copies the windows to that device once; batches and
  crops are then made there by indexing, so the GPU never waits for the host. Use such a dataset
  with ``num_workers=0`` and ``pin_memory=False`` (its batches are already on the device).
"""

from __future__ import annotations

import random

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, SequentialSampler


class WindowDataset(Dataset):
    """(x, y) pairs of a :class:`~data_prep.windows.Windows` set; see the module docstring."""

    def __init__(self, windows, crop: int | None = None, seed: int | None = None, device=None,
                 scale: float = 1.0, target=None):
        n_times = windows.shape[2]
        if crop is not None and not 0 < crop <= n_times:
            raise ValueError(f"crop must be in 1..{n_times} samples (window length), got {crop}")
        self._base = windows._base
        self.index = windows.index
        y = np.asarray(windows.y, np.float64)
        if target is not None:  # a data_prep.targets.TargetScaling: standardised targets
            y = target.apply(y)
        self.y = torch.from_numpy(np.ascontiguousarray(y, np.float32))
        meta = windows._meta_all
        rec = meta["recording"].to_numpy() if "recording" in meta.columns else \
            np.zeros(len(meta), np.int64)
        self.recording = rec[self.index]
        self.crop, self.seed, self.scale = crop, seed, float(scale)
        self.n_times = n_times
        self._rngs: dict[int, random.Random] = {}
        self.device = None if device is None else torch.device(device)
        self._store = None if device is None else windows.to_tensor(self.device)

    def __len__(self) -> int:
        return len(self.index)

    # crops -----------------------------------------------------------------------------------
    def offsets(self, positions) -> np.ndarray:
        """Crop start within each window for items ``positions`` (draws from the recording RNGs)."""
        out = np.empty(len(positions), np.int64)
        hi = self.n_times - self.crop
        for k, p in enumerate(positions):
            rec = int(self.recording[p])
            rng = self._rngs.get(rec)
            if rng is None:
                rng = self._rngs[rec] = random.Random(self.seed)
            out[k] = rng.randint(0, hi)
        return out

    # fetching --------------------------------------------------------------------------------
    def fetch(self, positions) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch for items ``positions``: X (B, C, T or crop) float32 and y (B,)."""
        pos = np.asarray(positions, np.int64).reshape(-1)
        offs = self.offsets(pos) if self.crop else None
        if self._store is not None:
            X = self._fetch_device(pos, offs)
            y = self.y[pos].to(self.device)
        else:
            X = torch.from_numpy(self._fetch_host(pos, offs))
            y = self.y[pos]
        if self.scale != 1.0:
            X.mul_(self.scale)
        return X, y

    def _fetch_host(self, pos: np.ndarray, offs: np.ndarray | None) -> np.ndarray:
        rows = self.index[pos]
        if offs is None:
            return np.ascontiguousarray(self._base[rows])    # one fancy-index read
        out = np.empty((len(rows), self._base.shape[1], self.crop), np.float32)
        for k in np.argsort(rows, kind="stable"):   # ascending rows: sequential file reads
            o = offs[k]
            out[k] = self._base[rows[k], :, o:o + self.crop]
        return out

    def _fetch_device(self, pos: np.ndarray, offs: np.ndarray | None) -> torch.Tensor:
        idx = torch.as_tensor(pos, device=self.device)
        if offs is None:
            return self._store[idx]
        t = torch.as_tensor(offs, device=self.device)[:, None] + torch.arange(
            self.crop, device=self.device)[None, :]                         # (B, crop)
        win = self._store[idx]                                             # (B, C, T)
        return torch.gather(win, 2, t[:, None, :].expand(-1, win.shape[1], -1))

    def __getitem__(self, i):
        if isinstance(i, (list, tuple, np.ndarray, torch.Tensor)):
            return self.fetch(i)
        X, y = self.fetch([int(i)])
        return X[0], y[0]

    def __getitems__(self, positions) -> list:
        """Batch fetch for torch's DataLoader; the default collate stacks the returned views."""
        X, y = self.fetch(positions)
        return list(zip(X, y, strict=True))

    def loader(self, batch_size: int = 128, shuffle: bool = True, drop_last: bool = False,
               generator: torch.Generator | None = None, **kwargs) -> DataLoader:
        """DataLoader yielding (X, y) batches built in one piece (no per-sample collation)."""
        base = RandomSampler(self, generator=generator) if shuffle else SequentialSampler(self)
        return DataLoader(self, sampler=BatchSampler(base, batch_size, drop_last),
                          batch_size=None, **kwargs)

    # worker processes: reopen the memmap instead of pickling its contents ----------------------
    def __getstate__(self):
        if self._store is not None and self._store.device.type != "cpu":
            raise RuntimeError(f"this dataset keeps its windows on {self._store.device}; use it "
                               "with num_workers=0 (loader worker processes cannot share it)")
        state = self.__dict__.copy()
        base = self._base
        if isinstance(base, np.memmap) and base.filename:
            state["_base"] = ("memmap", base.filename, base.shape)
        return state

    def __setstate__(self, state):
        base = state["_base"]
        if isinstance(base, tuple) and base and base[0] == "memmap":
            state["_base"] = np.memmap(base[1], np.float32, "r", shape=base[2])
        self.__dict__.update(state)
