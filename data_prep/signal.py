"""Reading window samples of one recording, and spotting windows with lost data.

BDF files on disk go through the fast reader (:mod:`data_prep.bdf`, decoding only the data
records the windows touch); anything else (EEGLAB ``.set``, a raw already loaded or changed in
memory) through MNE. Windows with non-finite samples or a dropout (every channel flat for at least
half a second — how BDF stores lost samples, since it cannot hold NaN) are reported as bad.
"""

from __future__ import annotations

import numpy as np

from .bdf import BDFReader, read_header
from .bids import Recording

FLAT_MIN_SAMPLES = 50


class Source:
    """Sample access to one recording: ``n_times``, ``n_chans``, ``sfreq``, ``ch_names``, read()."""

    def __init__(self, rec: Recording):
        self.rec = rec
        self._bdf = None
        self._raw = None
        raw = rec.raw
        if rec.path.suffix.lower() == ".bdf" and rec.path.exists() and (
                raw is None or _unchanged_lazy(raw, rec.path)):
            self._bdf = BDFReader(rec.path)
            h = self._bdf.header
            self.n_times, self.sfreq, self.ch_names = h.n_times, h.sfreq, h.ch_names
        else:
            if raw is None:
                from .bids import read_raw
                raw = read_raw(rec)
            self._raw = raw
            self.n_times, self.sfreq = raw.n_times, raw.info["sfreq"]
            self.ch_names = list(raw.ch_names)

    @property
    def n_chans(self) -> int:
        return len(self.ch_names)

    def read(self, start: int, stop: int) -> np.ndarray:
        """Samples [start, stop) of all channels, volts, float64."""
        if self._bdf is not None:
            return self._bdf.read(start, stop)
        return self._raw.get_data(start=start, stop=stop)

    def windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        """(n, C, length) float32 windows starting at ``starts``; dense spans read in one go."""
        out = np.empty((len(starts), self.n_chans, length), np.float32)
        if not len(starts):
            return out
        lo, hi = int(starts.min()), int(starts.max()) + length
        if len(starts) * length >= 0.5 * (hi - lo):
            block = self.read(lo, hi)
            for i, s in enumerate(starts):
                out[i] = block[:, s - lo: s - lo + length]
        else:
            for i, s in enumerate(starts):
                out[i] = self.read(int(s), int(s) + length)
        return out

    def close(self) -> None:
        if self._bdf is not None:
            self._bdf.close()


def _unchanged_lazy(raw, path) -> bool:
    """True when an MNE raw still equals its file on disk (not loaded, cropped or picked)."""
    if getattr(raw, "preload", False):
        return False
    try:
        h = read_header(path)
    except ValueError:
        return False
    return raw.n_times == h.n_times and list(raw.ch_names) == h.ch_names


def bad_windows(x: np.ndarray, min_flat: int = FLAT_MIN_SAMPLES) -> np.ndarray:
    """(n,) bool: the window holds a non-finite sample or >= ``min_flat`` all-channel-flat samples."""
    bad = ~np.isfinite(x).all(axis=(1, 2))
    if x.shape[2] > min_flat:
        still = np.abs(np.diff(x, axis=2)).max(axis=1) == 0          # (n, T-1)
        c = np.cumsum(np.pad(still, ((0, 0), (1, 0))), axis=1, dtype=np.int32)
        k = min_flat - 1
        bad |= ((c[:, k:] - c[:, :-k]) == k).any(axis=1)
    return bad
