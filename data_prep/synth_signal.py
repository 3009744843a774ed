"""The signal model of the synthetic HBN-like release (129-channel EEG at 100 Hz, in volts).

Background: spatially correlated 1/f ("pink") noise from a dozen smooth cortical sources plus
independent per-channel 1/f noise, band-limited to 0.5–45 Hz; occipito-parietal alpha (8.5–11.5
Hz) whose amplitude is the subject's and rises with eyes closed; Cz, the recording reference,
near flat. Event-related bumps (the planted structure, see ``synthetic.PLANTED``) are Gaussian
time courses times a Gaussian scalp map centred on one electrode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

SFREQ = 100.0
N_SOURCES = 12
# electrode names of GSN-HydroCel-129 for the scalp maps (E62 = Pz, E75 = Oz, E36 = C3, E104 = C4)
CENTRES = {"parietal": "E62", "occipital": "E75", "left_motor": "E36", "right_motor": "E104"}


@lru_cache(maxsize=1)
def montage_positions() -> tuple[tuple[str, ...], np.ndarray]:
    """Channel names E1..E128, Cz and their 3-D positions (metres), from MNE's montage."""
    import mne

    mont = mne.channels.make_standard_montage("GSN-HydroCel-129")
    pos = mont.get_positions()["ch_pos"]
    return tuple(mont.ch_names), np.array([pos[c] for c in mont.ch_names])


def scalp_map(centre: str, width_m: float = 0.045) -> np.ndarray:
    """A Gaussian scalp map (peak 1) around electrode ``centre``."""
    names, pos = montage_positions()
    d = np.linalg.norm(pos - pos[names.index(centre)], axis=1)
    return np.exp(-0.5 * (d / width_m) ** 2)


@lru_cache(maxsize=1)
def _maps() -> dict[str, np.ndarray]:
    return {k: scalp_map(v) for k, v in CENTRES.items()}


@lru_cache(maxsize=1)
def _background_mixing() -> np.ndarray:
    """Fixed smooth mixing maps (129, N_SOURCES) shared by every subject (same head model)."""
    names, pos = montage_positions()
    rng = np.random.default_rng(12345)
    centres = rng.choice(len(names) - 1, N_SOURCES, replace=False)
    mix = np.empty((len(names), N_SOURCES))
    for k, c in enumerate(centres):
        d = np.linalg.norm(pos - pos[c], axis=1)
        mix[:, k] = rng.choice([-1, 1]) * np.exp(-0.5 * (d / 0.06) ** 2) + 0.25
    return mix / np.sqrt((mix ** 2).sum(axis=1, keepdims=True))


def pink_noise(rng: np.random.Generator, n: int, n_times: int, lo: float = 0.5,
               hi: float = 45.0) -> np.ndarray:
    """(n, n_times) unit-variance 1/f noise, band-limited to [lo, hi] Hz."""
    spec = np.fft.rfft(rng.standard_normal((n, n_times)), axis=1)
    f = np.fft.rfftfreq(n_times, 1 / SFREQ)
    shape = np.zeros_like(f)
    band = (f >= lo) & (f <= hi)
    shape[band] = 1 / np.sqrt(f[band])
    x = np.fft.irfft(spec * shape, n=n_times, axis=1)
    return x / (x.std(axis=1, keepdims=True) + 1e-12)


def narrowband(rng: np.random.Generator, n_times: int, freq: float, bw: float = 0.8
               ) -> np.ndarray:
    """(n_times,) unit-variance oscillation around ``freq`` with a random (bursty) envelope."""
    spec = np.fft.rfft(rng.standard_normal(n_times))
    f = np.fft.rfftfreq(n_times, 1 / SFREQ)
    x = np.fft.irfft(spec * np.exp(-0.5 * ((f - freq) / bw) ** 2), n=n_times)
    return x / (x.std() + 1e-12)


@dataclass
class Timeline:
    """What one recording contains, before it becomes a signal."""

    n_seconds: int
    rows: list[dict] = field(default_factory=list)       # events.tsv rows
    bumps: list[tuple] = field(default_factory=list)
    # ("gauss", centre s, width s, amplitude µV, map) | ("ramp", start s, peak s, decay s, µV, map)
    alpha_gain: list[tuple[float, float, float]] = field(default_factory=list)
    # (start s, stop s, multiplier) for eyes-closed stretches
    beta_gain: list[tuple[float, float, float]] = field(default_factory=list)
    # (start s, stop s, multiplier) of motor beta: desynchronisation / rebound around presses


def _gain(n_times: int, spans: list[tuple[float, float, float]], smooth: int) -> np.ndarray:
    gain = np.ones(n_times)
    for t0, t1, g in spans:
        gain[max(int(t0 * SFREQ), 0): max(int(t1 * SFREQ), 0)] = g
    return np.convolve(gain, np.ones(smooth) / smooth, mode="same")


def simulate(tl: Timeline, rng: np.random.Generator, alpha_uv: float, alpha_hz: float,
             bg_uv: float = 12.0, indep_uv: float = 4.0, beta_uv: float = 12.0) -> np.ndarray:
    """The (129, n_times) signal in volts for timeline ``tl``."""
    n_times = int(tl.n_seconds * SFREQ)
    names, _ = montage_positions()
    x = _background_mixing() @ pink_noise(rng, N_SOURCES, n_times) * bg_uv
    x += pink_noise(rng, len(names), n_times) * indep_uv
    gain = _gain(n_times, tl.alpha_gain, 50)       # 0.5 s transitions
    x += np.outer(_maps()["occipital"], narrowband(rng, n_times, alpha_hz) * gain * alpha_uv)
    gain = _gain(n_times, tl.beta_gain, 10)
    motor = _maps()["left_motor"] + _maps()["right_motor"]
    x += np.outer(motor, narrowband(rng, n_times, 20.0, bw=2.0) * gain * beta_uv)
    t = np.arange(n_times) / SFREQ
    courses: dict[str, np.ndarray] = {}
    for bump in tl.bumps:
        c = courses.setdefault(bump[-1], np.zeros(n_times))
        _add_bump(c, t, bump)
    for name, c in courses.items():
        x += np.outer(_maps()[name], c)
    x[names.index("Cz")] = rng.standard_normal(n_times) * 0.05   # the reference: near flat
    return x * 1e-6


def _add_bump(course: np.ndarray, t: np.ndarray, bump: tuple) -> None:
    """Add one event-related time course in place (only the samples it touches)."""
    if bump[0] == "gauss":
        _, centre, width, amp, _ = bump
        lo, hi = centre - 4 * width, centre + 4 * width
    else:
        _, start, peak, tau, amp, _ = bump
        lo, hi = start, peak + 6 * tau
    i0, i1 = max(int(lo * SFREQ), 0), min(int(hi * SFREQ) + 1, len(t))
    if i0 >= i1:
        return
    tt = t[i0:i1]
    if bump[0] == "gauss":
        course[i0:i1] += amp * np.exp(-0.5 * ((tt - centre) / width) ** 2)
    else:   # linear rise from start to peak, exponential decay after it
        rise = np.clip((tt - start) / max(peak - start, 1e-3), 0, 1)
        course[i0:i1] += amp * np.where(tt <= peak, rise, np.exp(-(tt - peak) / tau))
