"""Number, duration and size formatting shared by every renderer (one spelling everywhere)."""

from __future__ import annotations

import math


def duration(seconds: float | None) -> str:
    """``75.2`` -> ``"1:15"``, ``3725`` -> ``"1:02:05"``; None/NaN -> ``"?"``."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def duration_words(seconds: float | None) -> str:
    """``75.2`` -> ``"1 min 15 s"`` for sentences."""
    if seconds is None or not math.isfinite(seconds):
        return "an unknown time"
    if seconds < 10:
        return f"{seconds:.1f} s"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    if h:
        return f"{h} h {m} min"
    return f"{m} min {s} s" if m else f"{s} s"


def gib(n_bytes: float | None) -> str:
    """Bytes -> ``"1.23 GiB"`` / ``"456 MiB"``; None -> ``"?"``."""
    if n_bytes is None or not math.isfinite(n_bytes):
        return "?"
    if n_bytes >= 1024**3:
        return f"{n_bytes / 1024**3:.2f} GiB"
    return f"{n_bytes / 1024**2:.0f} MiB"


def number(x: float | None, digits: int = 4) -> str:
    """Loss-like numbers: 4 significant digits, scientific when tiny or huge."""
    if x is None:
        return "?"
    x = float(x)
    if not math.isfinite(x):
        return str(x)
    if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e5):
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}g}"


def rate(x: float | None) -> str:
    """Samples per second with a thousands separator."""
    if x is None or not math.isfinite(x):
        return "?"
    return f"{x:,.0f}" if x >= 10 else f"{x:.2f}"


def count(n: int | None) -> str:
    """Parameter counts: ``62345`` -> ``"62.3 k"``, ``1.2e6`` -> ``"1.20 M"``."""
    if n is None:
        return "?"
    if n >= 1e6:
        return f"{n / 1e6:.2f} M"
    if n >= 1e3:
        return f"{n / 1e3:.1f} k"
    return str(n)
