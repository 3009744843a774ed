"""Sentences every renderer shares: the run header, the status line and the end paragraph,
with one spelling of numbers, durations and sizes.

Epochs count from 0 everywhere, as in ``trainer.history["epoch"]``: ``epoch 2/9`` is epoch 2 of
epochs 0–9 (the progress bars count epochs done, "3/10 done"). The train loss shown is the
epoch's sample-weighted running mean (history's ``train_loss``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Any


# numbers, durations and sizes: one spelling in every renderer
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


def number(x: float, digits: int = 4) -> str:
    """Loss-like numbers: 4 significant digits, scientific when tiny or huge."""
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


def count(n: int) -> str:
    """Parameter counts: ``62345`` -> ``"62.3 k"``, ``1.2e6`` -> ``"1.20 M"``."""
    if n >= 1e6:
        return f"{n / 1e6:.2f} M"
    if n >= 1e3:
        return f"{n / 1e3:.1f} k"
    return str(n)


_KEPT = "; checkpoint and history kept."
STOP_REASONS = {
    "early_stopping": "Stopped early by early stopping after step {step}.",
    "interrupt": "Interrupted (kernel interrupt / Ctrl-C) after step {step}" + _KEPT,
    "stop_button": "Stopped with the Stop button after step {step}" + _KEPT,
    "callback": "Stopped by a callback (trainer.should_stop) after step {step}" + _KEPT,
}


def header(run: Mapping[str, Any], note: str = "") -> str:
    """``EEGNeX · 62.3 k params · cpu · fp32 · batch 64 · 3 epochs × 20 steps · chosen by the
    Trainer: ...``: what the run is, and every setting the Trainer chose for the user, once."""
    parts = [str(run.get("model") or "model")]
    if run.get("n_params") is not None:
        parts.append(f"{count(run['n_params'])} params")
    parts += [str(run.get("device", "?")), str(run.get("precision", "?"))]
    if run.get("batch_size"):
        accum = run.get("grad_accum") or 1
        parts.append(f"batch {run['batch_size']}" + (f" × grad_accum {accum}" if accum > 1
                                                      else ""))
    epochs = run.get("epochs")
    spe = run.get("steps_per_epoch")
    parts.append(f"{epochs} epochs × {spe} steps" if spe else f"{epochs} epochs")
    if run.get("monitor"):
        parts.append(f"monitor {run['monitor']}")
    if run.get("chosen"):
        parts.append("chosen by the Trainer: " + ", ".join(run["chosen"]))
    if run.get("quick"):
        parts.append("quick mode (HYBRIDNB_QUICK): shortened run")
    text = " · ".join(parts)
    return f"{text} — {note}" if note else text


def memory_line(latest: Mapping[str, float]) -> str:
    """The newest memory numbers in one short line (empty when nothing was sampled)."""
    parts = []
    if "gpu_used" in latest:
        total = latest.get("gpu_total")
        used = gib(latest["gpu_used"])
        parts.append(f"GPU {used} of {gib(total)} (NVML)" if total else f"GPU {used}")
        if "gpu_util" in latest:
            parts.append(f"util {latest['gpu_util']:.0f}%")
    if "gpu_allocated" in latest:
        parts.append(f"allocated {gib(latest['gpu_allocated'])}, "
                     f"reserved {gib(latest.get('gpu_reserved'))}, "
                     f"peak {gib(latest.get('gpu_peak'))}")
    if "mps_current" in latest:
        parts.append(f"MPS {gib(latest['mps_current'])} "
                     f"(driver {gib(latest.get('mps_driver'))})")
    if "rss" in latest:
        parts.append(f"RSS {gib(latest['rss'])}")
    if "ram_used" in latest and "ram_total" in latest:
        parts.append(f"RAM {gib(latest['ram_used'])} of {gib(latest['ram_total'])}")
    return " · ".join(parts)


def status(record, memory: bool = False) -> str:
    """``epoch 1/2 · step 12/20 · train_loss 0.41 · val_loss 0.39 · lr 1.00e-03 · ...``, with
    the newest memory numbers when ``memory``."""
    st = record.state
    spe = record.steps_per_epoch
    parts = [f"epoch {record.epoch}/{record.epochs - 1}",
             f"step {record.step}/{spe}" if spe else f"step {record.step}"]
    if st.get("train_loss") is not None:  # the Trainer's number, as history will show it
        parts.append(f"train_loss {number(st['train_loss'])}")
    elif st.get("loss") is not None:  # a caller that sends only the step's loss
        parts.append(f"loss {number(st['loss'])}")
    if record.val_rows:
        last = record.val_rows[-1]
        for key, value in last.items():
            if key.startswith("val_") and value is not None:
                parts.append(f"{key} {number(value)}")
                if key == "val_loss":
                    break
        for key in dict.fromkeys((record.run.get("metric"), record.run.get("monitor"))):
            if key and key != "val_loss" and last.get(key) is not None:
                parts.append(f"{key} {number(last[key])}")
    if st.get("lr") is not None:
        parts.append(f"lr {float(st['lr']):.2e}")
    sps, mfu = st.get("samples_per_s"), st.get("mfu")
    if sps is not None and sps == sps:  # wall-clock speed, MFU when known, a data-bound loop
        parts.append(f"{rate(sps)} samples/s")
        if mfu is not None and mfu == mfu:
            parts.append(f"MFU {100 * mfu:.1f}%")
        if st.get("data_bound"):
            parts.append(f"data-bound: {st.get('data_wait_pct', 0):.0f}% of the time waiting "
                         "for the next batch")
    parts.append(f"{duration(record.elapsed())} elapsed")
    remaining = record.remaining_s()
    if remaining is not None:
        parts.append(f"~{duration(remaining)} left")
    if memory and record.sampler is not None:
        parts.append(memory_line(record.sampler.latest()))
    return " · ".join(p for p in parts if p)


def paragraph(summary: Mapping[str, Any], record) -> str:
    """The end-of-run summary: best metric, time, throughput, peak memory, events, stop reason."""
    run = record.run
    hist = summary.get("history")
    done = len(hist) if hist is not None else len(record.epoch_ends)
    elapsed = summary.get("elapsed_s", record.elapsed())
    device = summary.get("device") or run.get("device", "?")
    precision = summary.get("precision") or run.get("precision", "?")
    params = f" ({count(run['n_params'])} parameters)" if run.get("n_params") else ""
    if summary.get("failed") and not done and not record.global_step:
        return (f"{run.get('model') or 'The model'}{params} was not trained: the fit stopped "
                f"at an error before its first step, on {device} (the error follows).")
    text = [f"Trained {run.get('model') or 'the model'}{params} for {done} of "
            f"{record.epochs} epochs ({record.global_step} steps) in "
            f"{duration_words(elapsed)} on {device} with {precision}"]
    sps = summary.get("samples_per_s")
    if sps is not None and math.isfinite(sps):
        text[0] += f", {rate(sps)} samples/s"
    text[0] += "."
    monitor = run.get("monitor") or "val_loss"
    best = summary.get("best") or {}  # as the Trainer decided it: the view ranks nothing
    value, epoch, step = best.get(monitor, best.get("value")), best.get("epoch"), best.get("step")
    if value is not None and math.isfinite(float(value)):
        at = "" if epoch is None else f" at epoch {epoch}" + (
            f", step {step}" if step is not None else "") + " (epochs count from 0, as in history)"
        text.append(f"Best {monitor} {number(value)}{at}.")
    else:
        text.append(f"No {monitor} was recorded (no validation data).")
    peak = summary.get("peak_memory_bytes")
    mem = record.memory()
    nvml_peak = mem.peaks.get("gpu_used")
    if peak is not None:
        where = "host RSS" if str(device).startswith("cpu") else str(device)
        text.append(f"Peak memory {gib(peak)} ({where})"
                    + (f", {gib(nvml_peak)} used on the GPU per NVML." if nvml_peak else "."))
    elif nvml_peak:
        text.append(f"Peak GPU memory {gib(nvml_peak)} per NVML.")
    stopped = summary.get("stopped")
    if stopped:
        reason = STOP_REASONS.get(stopped, f"Stopped ({stopped}) after step {{step}}.")
        text.append(reason.format(step=record.global_step))
    events = summary.get("events")
    events = record.events if events is None else events
    if events:
        counts = Counter(ev.kind for ev in events)
        listed = ", ".join(f"{n} × {kind}" for kind, n in counts.most_common())
        text.append(f"{len(events)} event{'s' if len(events) != 1 else ''}: {listed}.")
    else:
        text.append("No recovery events.")
    if run.get("quick"):
        text.append("Quick mode (HYBRIDNB_QUICK) shortened this run.")
    return " ".join(text)
