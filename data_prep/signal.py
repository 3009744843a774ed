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

    def windows(self, starts: np.ndarray, length: int, check: bool = True
                ) -> tuple[np.ndarray, np.ndarray]:
        """(n, C, length) float32 windows at ``starts`` and the (n,) "lost samples" flags.

        Dense windows (covering half the span or more) are cut from one read of the span;
        sparse ones are read one by one. ``check=False`` skips the lost-samples check.
        """
        starts = np.asarray(starts, np.int64)
        if not len(starts):
            return np.empty((0, self.n_chans, length), np.float32), np.zeros(0, bool)
        lo, hi = int(starts.min()), int(starts.max()) + length
        if len(starts) * length >= 0.5 * (hi - lo):
            block = self.read(lo, hi).astype(np.float32)
            view = np.lib.stride_tricks.sliding_window_view(block, length, axis=1)
            out = np.ascontiguousarray(view[:, starts - lo].transpose(1, 0, 2))
            bad = bad_spans(block, starts - lo, length) if check else np.zeros(len(out), bool)
            return out, bad
        out = np.empty((len(starts), self.n_chans, length), np.float32)
        for i, s in enumerate(starts):
            out[i] = self.read(int(s), int(s) + length)
        return out, (bad_windows(out) if check else np.zeros(len(out), bool))

    def close(self) -> None:
        if self._bdf is not None:
            self._bdf.close()


class Unusable(Exception):
    """A recording the recipe cannot use; ``code`` is the problem's tag, the message names the file."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def open_checked(rec: Recording, *, sfreq: float, n_chans: int, min_samples: int = 0) -> Source:
    """Open ``rec`` and check it fits the recipe (readable, channel count, length, sampling rate).

    Raises :class:`Unusable` with the reason; the caller records it and goes on with the others.
    """
    name = rec.name
    try:
        src = Source(rec)
    except (ValueError, OSError) as exc:
        code = "truncated_bdf" if "truncated" in str(exc) else "unreadable"
        raise Unusable(code, f"{exc}" if name in str(exc) else f"{name}: {exc}") from exc
    problem = None
    if src.n_chans != n_chans:
        problem = ("wrong_channel_count", f"{name}: {src.n_chans} channels, the challenge "
                   f"expects {n_chans}; recording left out")
    elif src.n_times < min_samples:
        problem = ("too_short", f"{name}: {src.n_times} samples ({src.n_times / sfreq:g} s), "
                   f"shorter than one {min_samples}-sample window; left out")
    elif abs(src.sfreq - sfreq) > 1e-6:
        problem = ("wrong_sfreq", f"{name}: sampled at {src.sfreq:g} Hz, the recipe expects "
                   f"{sfreq:g} Hz; resample it first")
    if problem is not None:
        src.close()
        raise Unusable(*problem)
    return src


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


def bad_spans(block: np.ndarray, starts: np.ndarray, length: int,
              min_flat: int = FLAT_MIN_SAMPLES) -> np.ndarray:
    """:func:`bad_windows` for windows ``[s, s+length)`` of one continuous (C, T) block."""
    nonfinite = ~np.isfinite(block).all(axis=0)                       # (T,)
    nf = np.concatenate([[0], np.cumsum(nonfinite)])
    bad = nf[starts + length] - nf[starts] > 0
    if length > min_flat:
        k = min_flat - 1
        still = (block[:, 1:] == block[:, :-1]).all(axis=0)             # (T-1,)
        c = np.concatenate([[0], np.cumsum(still)])
        run_end = np.zeros(len(still), bool)                           # k flat diffs end at t
        run_end[k - 1:] = (c[k:] - c[:-k]) == k
        r = np.concatenate([[0], np.cumsum(run_end)])
        # diffs of window s are s .. s+length-2; a run ending at t lies inside if t >= s+k-1
        bad |= r[starts + length - 1] - r[starts + k - 1] > 0
    return bad
