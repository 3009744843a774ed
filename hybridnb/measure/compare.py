"""compare(): one model's training step under precision / compile / batch-size variants, side by side.

"fp16 is 2x faster" is folklore until it is measured on *your* model and *your* hardware. For every
variant compare() builds a fresh model from the same seed, warms it up (compiling when asked), then
times training steps (forward + backward + AdamW) with device-synchronised timers. Variants take
turns (A B A B ...) so drift on a busy machine does not favour one; speed-ups are the median of
per-round ratios against fp32 eager. Variants that cannot run here are rows with a reason, never
silently dropped; an out-of-memory in one variant is a row, not a crash.

>>> df = hn.compare(lambda: MyNet(), (x, y), variants=("fp32", "bf16", "bf16+compile"))
>>> df[["variant", "samples_per_s", "speedup", "loss_rel_diff"]]

The batch stays on the device: compare() measures the model step, not the data path.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import math
import os
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from hybridnb.env import frontend
from hybridnb.measure.memory import peak_bytes, reset_peak
from hybridnb.measure.timing import (
    PeakSampler,
    Stopwatch,
    heap_reader,
    nvml_busy_reader,
    synchronize,
)
from hybridnb.train.losses import make_loss
from hybridnb.train.precision import Precision, _native_bf16
from hybridnb.train.recovery import first_line, free_memory, is_oom

__all__ = ["compare", "compare_figure", "compare_table", "CompareResult", "parse_variant",
           "DEFAULT_VARIANTS", "COLUMNS", "cli_args", "cli"]

DEFAULT_VARIANTS = ("fp32", "bf16", "fp16", "fp32+compile", "bf16+compile")
PRECISIONS = ("fp32", "bf16", "fp16")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
COLUMNS = [
    "variant", "precision", "compile", "batch_size", "status",
    "samples_per_s", "samples_per_s_min", "samples_per_s_max", "speedup", "step_ms",
    "peak_mem_mb", "compile_s", "final_loss", "loss_rel_diff", "loss_ok", "gpu_busy_pct", "note",
]
NOTEBOOK_FRONTENDS = ("jupyter", "colab", "vscode")
DEFAULT_DATASET_BATCH = 64


@dataclass(frozen=True)
class Variant:
    """One way to run the step: ``precision`` and ``compile`` mode (None = eager)."""

    label: str
    precision: str
    compile: str | None = None


def parse_variant(text: str) -> Variant:
    """``"bf16"``, ``"fp32+compile"``, ``"bf16+compile:max-autotune"`` -> Variant."""
    spec = text.strip().lower()
    prec, _, rest = spec.partition("+")
    mode = None
    if rest:
        kind, _, mode = rest.partition(":")
        if kind != "compile":
            raise ValueError(f"variants: {text!r} — after '+' only 'compile' or "
                             f"'compile:<mode>' is understood")
        mode = mode or "default"
        if mode not in COMPILE_MODES:
            raise ValueError(f"variants: {text!r} has compile mode {mode!r}; "
                             f"use one of {COMPILE_MODES}")
    if prec not in PRECISIONS:
        raise ValueError(f"variants: {text!r} has precision {prec!r}; use one of {PRECISIONS}")
    return Variant(label=spec, precision=prec, compile=mode)


class CompareResult(pd.DataFrame):
    """The comparison table: a pandas DataFrame that, displayed in a notebook, also draws the bar
    chart. Derived frames (``df[cols]``, ``df.query(...)``) are plain DataFrames."""

    @property
    def _constructor(self):
        return pd.DataFrame

    def _ipython_display_(self) -> None:
        from IPython.display import display
        display(_display_frame(self))
        if frontend() in NOTEBOOK_FRONTENDS:
            display(compare_figure(self))
        for line in _footer(self):
            print(line)


# ----------------------------------------------------------------------------------------------
# the measurement


@dataclass
class _Run:
    variant: Variant
    batch_size: int
    baseline: bool = False
    status: str = "ok"
    note: str = ""
    model: nn.Module | None = None
    step: Callable[[], torch.Tensor] | None = None
    persistent_bytes: int = 0
    first_step_s: float = math.nan
    mem_bytes: float = math.nan
    windows: list[float] = field(default_factory=list)
    busy: list[float] = field(default_factory=list)
    last_loss: torch.Tensor | None = None
    steps_done: int = 0
    rng: tuple | None = None  # this run's random-number state between its turns

    @property
    def name(self) -> str:
        return f"{self.variant.label} · batch {self.batch_size}"


def compare(model_fn: Callable[[], nn.Module] | nn.Module, data: Any,
            variants: Sequence[str] = DEFAULT_VARIANTS, *, steps: int = 20, warmup: int = 3,
            repeats: int = 3, batch_sizes: Sequence[int] | None = None,
            device: str | torch.device = "auto", loss: str | Callable = "mse", lr: float = 1e-3,
            seed: int = 0, loss_tol: float = 0.05, show: bool = False,
            progress: bool = True) -> CompareResult:
    """Time training steps of ``model_fn()`` under each variant; return one row per variant and
    batch size (see ``COLUMNS``).

    ``model_fn`` builds a fresh model (called once per variant, after ``torch.manual_seed(seed)``,
    so every variant starts from the same weights); an ``nn.Module`` is deep-copied instead.
    ``data`` is a sample batch ``(x, y)``, a Dataset or a DataLoader (its first batch).
    ``batch_sizes`` default to the sample batch's size (64 for a Dataset); a larger size repeats
    the samples. Each variant runs ``warmup`` steps (compiling, if asked), one untimed step for
    memory, then ``repeats`` timed windows of ``steps`` steps, taking turns with the other
    variants. fp32 eager is the baseline and always runs; list a variant twice for an A/A check.

    Columns: ``samples_per_s`` (median over windows, with min/max), ``speedup`` (median of
    per-window ratios to fp32 eager at the same batch size), ``peak_mem_mb`` (this variant's
    weights, optimizer state and batch plus the step's peak working memory — exact on CUDA,
    sampled from the host heap on CPU), ``compile_s`` (first step minus a steady step),
    ``final_loss`` after the same number of steps for all, ``loss_rel_diff`` against fp32 and
    ``loss_ok`` (finite and within ``loss_tol``). ``status`` is ok | skipped | oom | failed and
    ``note`` says why. ``show=True`` displays the table (and the chart in a notebook) at once.
    """
    runs, dev, frame_attrs = _plan(model_fn, data, variants, steps, warmup, repeats,
                                   batch_sizes, device, loss, loss_tol)
    loss_fn = make_loss(loss)
    factory = _factory(model_fn)
    say = _printer(progress)
    batches = _batches(data, sorted({r.batch_size for r in runs}), dev)
    order: list[tuple[str, int, int]] = []
    busy_reader = nvml_busy_reader(dev)
    mem_reader, mem_method = _memory_reader(dev)
    needs_compile = any(r.variant.compile and r.status == "ok" for r in runs)
    t_start = time.perf_counter()
    try:
        with _compile_settings(dev, needs_compile):
            for run in runs:
                if run.status == "ok":
                    _prepare(run, factory, batches[run.batch_size], dev, loss_fn, lr, seed,
                             warmup, mem_reader, say)
            for rnd in range(repeats):
                for run in runs:
                    if run.status == "ok":
                        _time_window(run, steps, dev, busy_reader)
                        order.append((run.variant.label, run.batch_size, rnd))
                done = [f"{r.variant.label}@{r.batch_size} "
                        f"{_median_rate(r, steps):.1f}/s" for r in runs if r.status == "ok"]
                say(f"round {rnd + 1}/{repeats}: " + ", ".join(done))
    finally:
        for run in runs:
            _release(run, dev, free=False)
        free_memory(dev)
    df = CompareResult(_rows(runs, steps, loss_tol, warmup, repeats), columns=COLUMNS)
    df.attrs.update(frame_attrs)
    df.attrs.update(memory_method=mem_method, order=order,
                    elapsed_s=round(time.perf_counter() - t_start, 2),
                    gpu_busy_method="NVML utilisation, median of samples in timed windows"
                    if busy_reader else "not measured (no NVML for this device)")
    if show:
        _show(df)
    return df


def _plan(model_fn, data, variants, steps, warmup, repeats, batch_sizes, device, loss, loss_tol):
    """Check every argument before any work, and decide which runs can happen here."""
    if not (callable(model_fn) or isinstance(model_fn, nn.Module)):
        raise TypeError(f"model_fn must build an nn.Module (a function or a class), "
                        f"got {type(model_fn).__name__}")
    for name, value, low in (("steps", steps, 1), ("warmup", warmup, 1), ("repeats", repeats, 1)):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"{name}={value!r}: must be an integer >= {low}")
    if not loss_tol > 0:
        raise ValueError(f"loss_tol={loss_tol!r}: must be > 0")
    make_loss(loss)  # raises ValueError naming a loss it does not know
    if isinstance(variants, str):
        variants = [v for v in variants.replace(",", " ").split() if v]
    parsed = [parse_variant(v) for v in variants]
    if not any(v.precision == "fp32" and v.compile is None for v in parsed):
        parsed.insert(0, Variant("fp32", "fp32"))
    seen: dict[str, int] = {}
    labelled = []
    for v in parsed:
        seen[v.label] = seen.get(v.label, 0) + 1
        label = v.label if seen[v.label] == 1 else f"{v.label} #{seen[v.label]}"
        labelled.append(Variant(label, v.precision, v.compile))
    if batch_sizes is not None:
        batch_sizes = list(batch_sizes)
        bad = [b for b in batch_sizes if not isinstance(b, int) or b < 1]
        if bad or not batch_sizes:
            raise ValueError(f"batch_sizes={batch_sizes!r}: need positive integers")
    else:
        batch_sizes = [_natural_batch_size(data)]
    dev = _resolve_device(device)
    runs = []
    for bs in batch_sizes:
        first_fp32 = True
        for v in labelled:
            run = _Run(v, bs)
            if v.precision == "fp32" and v.compile is None and first_fp32:
                run.baseline, first_fp32 = True, False
            reason = _unavailable(v, dev)
            if reason:
                run.status, run.note = "skipped", reason
            runs.append(run)
    attrs = dict(device=str(dev), steps=steps, warmup=warmup, repeats=repeats,
                 model=_model_name(model_fn), torch=torch.__version__)
    return runs, dev, attrs


def _prepare(run: _Run, factory, batch, dev, loss_fn, lr, seed, warmup, mem_reader, say) -> None:
    """Build the run's model, optimizer and step; warm up (compile); measure memory."""
    x, y = batch
    t0 = time.perf_counter()
    try:
        torch.manual_seed(seed)
        model = factory().to(dev)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        prec = Precision.choose(run.variant.precision, dev)
        net = _compile(model, run.variant.compile) if run.variant.compile else model
        run.model, run.step = model, _make_step(net, opt, prec, x, y, loss_fn,
                                                 run.variant.compile)
        run.rng = _rng_state(dev)  # right after the seeded init: the same for every run
        with _own_rng(run, dev):
            watch = Stopwatch(dev)
            watch.start()
            run.last_loss = run.step()
            run.first_step_s = watch.stop()
            for _ in range(warmup - 1):
                run.last_loss = run.step()
            run.steps_done = warmup
            run.persistent_bytes = (_state_bytes(model, opt) + _tensor_bytes(x)
                                    + _tensor_bytes(y))
            run.mem_bytes = _step_memory(run, dev, mem_reader)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a row, except the baseline's
        _record_failure(run, exc, "warm-up")
    if run.status != "ok":  # freed outside the except block: its traceback pins the tensors
        _release(run, dev)
        return
    compiled = f", first step {run.first_step_s:.1f} s (compiles)" if run.variant.compile else ""
    say(f"{run.name}: warmed up in {time.perf_counter() - t0:.1f} s{compiled}")


def _make_step(net, opt, prec: Precision, x, y, loss_fn, mode: str | None):
    """One training step; the precision choice was made once, so the step has no branches."""
    scaler = prec.scaler
    mark = (torch.compiler.cudagraph_mark_step_begin
            if mode in ("reduce-overhead",) and x.device.type == "cuda" else (lambda: None))

    def step() -> torch.Tensor:
        mark()
        opt.zero_grad(set_to_none=True)
        with prec.autocast():
            loss = loss_fn(net(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss.detach()

    return step


def _step_memory(run: _Run, dev: torch.device, mem_reader) -> float:
    """Bytes this variant needs: its weights, optimizer state and batch, plus the peak working
    memory of one (untimed) step above what was allocated before it."""
    if dev.type == "cuda":
        synchronize(dev)
        base = torch.cuda.memory_allocated(dev)
        reset_peak(dev)
        run.last_loss = run.step()
        synchronize(dev)
        rise = (peak_bytes(dev) or base) - base
    else:
        with PeakSampler(mem_reader) as sampler:
            run.last_loss = run.step()
            synchronize(dev)
        rise = (sampler.peak or 0.0) - sampler.values[0] if sampler.values else math.nan
    run.steps_done += 1
    return run.persistent_bytes + max(rise, 0.0)


def _memory_reader(dev: torch.device):
    """How this device's step memory is read: exact on CUDA, sampled elsewhere."""
    if dev.type == "cuda":
        return None, "CUDA allocator peak"
    if dev.type == "mps":
        return torch.mps.current_allocated_memory, "MPS allocator, sampled every 2 ms"
    return heap_reader()


def _time_window(run: _Run, steps: int, dev: torch.device, busy_reader) -> None:
    watch = Stopwatch(dev)
    sampler = PeakSampler(busy_reader, interval=0.05) if busy_reader else contextlib.nullcontext()
    try:
        with _own_rng(run, dev), sampler:
            watch.start()
            for _ in range(steps):
                run.last_loss = run.step()
            seconds = watch.stop()
    except Exception as exc:  # noqa: BLE001
        _record_failure(run, exc, f"timed window {len(run.windows) + 1}")
    if run.status != "ok":
        _release(run, dev)
        return
    run.steps_done += steps
    run.windows.append(seconds)
    if busy_reader:
        run.busy.extend(sampler.values)


def _rng_state(dev: torch.device) -> tuple:
    cuda = torch.cuda.get_rng_state(dev) if dev.type == "cuda" else None
    return torch.random.get_rng_state(), cuda


def _set_rng_state(dev: torch.device, state: tuple) -> None:
    torch.random.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], dev)


@contextlib.contextmanager
def _own_rng(run: _Run, dev: torch.device):
    """Give the run its own random stream while it has its turn.

    Runs take turns, so with one global generator each run's dropout masks would depend on how
    many steps the others took; the A/A check and the loss comparison would then measure mask
    noise instead of numerics. Swapping states costs microseconds, outside the timed window.
    """
    outside = _rng_state(dev)
    _set_rng_state(dev, run.rng)
    try:
        yield
    finally:
        run.rng = _rng_state(dev)
        _set_rng_state(dev, outside)


def _record_failure(run: _Run, exc: BaseException, stage: str) -> None:
    if is_oom(exc):
        run.status = "oom"
        run.note = f"out of memory during {stage} at batch {run.batch_size}: {first_line(exc, 240)}"
        return
    if run.baseline:
        raise RuntimeError(
            f"compare(): the fp32 eager baseline failed during {stage} at batch "
            f"{run.batch_size}, so the model or data does not train as given: "
            f"{type(exc).__name__}: {first_line(exc, 240)}") from exc
    run.status = "failed"
    run.note = f"{stage}: {type(exc).__name__}: {first_line(exc, 240)}"


def _release(run: _Run, dev: torch.device, free: bool = True) -> None:
    """Drop the run's model and optimizer (keeping the last loss value), so memory comes back."""
    if run.last_loss is not None and run.status == "ok":
        run.last_loss = run.last_loss.detach().float().cpu()
    elif run.status != "ok":
        run.last_loss = None
    run.model = run.step = None
    if free:
        free_memory(dev)


# ----------------------------------------------------------------------------------------------
# what can run here


def _unavailable(v: Variant, dev: torch.device) -> str:
    """Why this variant cannot run on ``dev`` ("" when it can)."""
    native = _native_bf16(dev) if dev.type == "cuda" else None
    chosen = Precision.choose(v.precision, dev, native_bf16=native)
    if chosen.name != v.precision:
        return (f"{v.precision} is not run on {dev.type}: hybridnb trains a {v.precision} "
                f"request there as {chosen.name} (that row measures it). Why: {chosen.note}")
    if v.compile:
        return _compile_unavailable(dev, v.compile) or ""
    return ""


def _compile_unavailable(dev: torch.device, mode: str) -> str | None:
    """Why torch.compile (in ``mode``) cannot work on ``dev`` here, or None."""
    if dev.type == "cpu":
        if mode.startswith("max-autotune"):
            return ("max-autotune tunes GPU (Triton) kernels; on the CPU it only adds compile "
                    "time, so it is not run — use +compile")
        if mode == "reduce-overhead":
            return "reduce-overhead replays CUDA graphs, which the CPU does not have"
        names = [os.environ.get("CXX", ""), "g++", "c++", "clang++"]
        if not any(n and shutil.which(n) for n in names):
            return ("torch.compile on the CPU needs a C++ compiler and none was found "
                    "(g++, c++, clang++ or $CXX); install one (e.g. apt install g++)")
    elif dev.type == "cuda":
        if importlib.util.find_spec("triton") is None:
            return "torch.compile on the GPU needs Triton, which is not installed"
        if not torch.version.hip:
            major, minor = torch.cuda.get_device_capability(dev)
            if major < 7:
                return f"Triton needs a GPU of compute capability >= 7.0; this one is {major}.{minor}"
    return None


def _compile(model: nn.Module, mode: str | None):
    return torch.compile(model, mode=None if mode in (None, "default") else mode)


@contextlib.contextmanager
def _compile_settings(dev: torch.device, needed: bool):
    """Compiler settings for the comparison only, restored afterwards.

    Each variant compiles its own fresh model, so the recompile limit is raised (hitting it would
    silently fall back to eager). Compiled random ops (dropout) draw from torch's generator like
    eager ones (``fallback_random``), so a compiled run sees the same dropout masks as fp32 eager
    and its loss can be compared; this costs compiled models a little speed where they use
    dropout. On the CPU, inductor's layout optimisation is off: it crashes oneDNN on EEGNeX under
    bf16 autocast.
    """
    if not needed:
        yield
        return
    import torch._dynamo
    import torch._inductor.config as inductor_config

    dyn = torch._dynamo.config
    key = "recompile_limit" if hasattr(dyn, "recompile_limit") else "cache_size_limit"
    with contextlib.ExitStack() as stack:
        stack.enter_context(dyn.patch(**{key: max(getattr(dyn, key), 64)}))
        stack.enter_context(inductor_config.patch(fallback_random=True))
        if dev.type == "cpu":
            stack.enter_context(inductor_config.patch(layout_optimization=False))
        yield


# ----------------------------------------------------------------------------------------------
# inputs


def _resolve_device(device) -> torch.device:
    if isinstance(device, str) and device == "auto":
        from hybridnb.hardware.detect import detect
        return torch.device(detect().device)
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device={device!r} is not a torch device ('cpu', 'cuda:0', 'auto')"
                         ) from exc


def _factory(model_fn):
    if isinstance(model_fn, nn.Module):
        template = model_fn
        return lambda: copy.deepcopy(template)

    def build() -> nn.Module:
        model = model_fn()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model_fn {_model_name(model_fn)} returned "
                            f"{type(model).__name__}, not an nn.Module")
        return model

    return build


def _model_name(model_fn) -> str:
    if isinstance(model_fn, nn.Module):
        return type(model_fn).__name__
    return getattr(model_fn, "__name__", type(model_fn).__name__)


def _is_dataset(data) -> bool:
    return (isinstance(data, torch.utils.data.Dataset) and not isinstance(data, (tuple, list))
            and hasattr(data, "__len__"))


def _sample_batch(data) -> tuple[torch.Tensor, torch.Tensor] | None:
    if isinstance(data, torch.utils.data.DataLoader):
        data = next(iter(data))
    if isinstance(data, (tuple, list)) and len(data) >= 2 and not _is_dataset(data):
        x, y = (torch.as_tensor(data[0]), torch.as_tensor(data[1]))
        if len(x) != len(y):
            raise ValueError(f"data: x has {len(x)} samples but y has {len(y)}")
        if len(x) == 0:
            raise ValueError("data: the sample batch is empty")
        return x, y
    if _is_dataset(data):
        return None
    raise TypeError(f"data must be a batch (x, y), a Dataset or a DataLoader; "
                    f"got {type(data).__name__}")


def _natural_batch_size(data) -> int:
    batch = _sample_batch(data)
    return len(batch[0]) if batch is not None else DEFAULT_DATASET_BATCH


def _batches(data, sizes: list[int], dev: torch.device) -> dict[int, tuple]:
    """One (x, y) per batch size, on the device; samples repeat when the size needs more."""
    batch = _sample_batch(data)
    if batch is None:
        n = len(data)
        if n == 0:
            raise ValueError("data: the Dataset is empty")
        items = [data[i % n] for i in range(max(sizes))]
        collated = torch.utils.data.default_collate([(it[0], it[1]) for it in items])
        batch = (torch.as_tensor(collated[0]), torch.as_tensor(collated[1]))
    x, y = batch
    x = x.float() if x.is_floating_point() else x
    y = y.float() if y.is_floating_point() else y
    out = {}
    for bs in sizes:
        idx = torch.arange(bs) % len(x)
        out[bs] = (x[idx].contiguous().to(dev), y[idx].contiguous().to(dev))
    return out


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _state_bytes(model: nn.Module, opt: torch.optim.Optimizer) -> int:
    total = sum(_tensor_bytes(p) for p in model.parameters())
    total += sum(_tensor_bytes(b) for b in model.buffers())
    for state in opt.state.values():
        total += sum(_tensor_bytes(v) for v in state.values() if isinstance(v, torch.Tensor))
    return total


# ----------------------------------------------------------------------------------------------
# the table


def _median_rate(run: _Run, steps: int) -> float:
    rates = [steps * run.batch_size / s for s in run.windows if s > 0]
    return statistics.median(rates) if rates else math.nan


def _rows(runs: list[_Run], steps: int, loss_tol: float, warmup: int, repeats: int) -> list[dict]:
    base = {r.batch_size: r for r in runs if r.baseline}
    total_steps = warmup + 1 + steps * repeats
    rows = []
    for run in runs:
        rates = [steps * run.batch_size / s for s in run.windows if s > 0]
        ok = run.status == "ok" and len(rates) == repeats
        ref = base.get(run.batch_size)
        ref_ok = ref is not None and ref.status == "ok" and len(ref.windows) == repeats
        final = float(run.last_loss) if ok and run.last_loss is not None else math.nan
        row = dict.fromkeys(COLUMNS, math.nan)
        row.update(variant=run.variant.label, precision=run.variant.precision,
                   compile=run.variant.compile or "eager", batch_size=run.batch_size,
                   status=run.status, note=run.note, loss_ok=None)
        if ok:
            median_s = statistics.median(run.windows)
            row.update(samples_per_s=statistics.median(rates), samples_per_s_min=min(rates),
                       samples_per_s_max=max(rates), step_ms=1000 * median_s / steps, loss_ok=False,
                       peak_mem_mb=run.mem_bytes / 2**20, final_loss=final)
            if run.variant.compile:
                row["compile_s"] = max(run.first_step_s - median_s / steps, 0.0)
            if run.busy:
                row["gpu_busy_pct"] = statistics.median(run.busy)
            if ref_ok:
                row["speedup"] = statistics.median(
                    [a / b for a, b in zip(ref.windows, run.windows, strict=True)])
                ref_loss = float(ref.last_loss)
                diff = abs(final - ref_loss) / max(abs(ref_loss), 1e-12)
                row["loss_rel_diff"] = diff
                row["loss_ok"] = bool(math.isfinite(diff) and diff <= loss_tol)
            if not math.isfinite(final):
                row["note"] = f"non-finite loss after {total_steps} steps"
            elif row["loss_ok"] is False and ref_ok:
                row["note"] = (f"loss after {total_steps} steps differs from fp32 by "
                               f"{row['loss_rel_diff']:.1%} (> loss_tol {loss_tol:.0%})")
        elif run.status == "ok":  # never timed: an earlier stage ended it without a reason
            row.update(status="failed", note=run.note or "no timed window completed")
        rows.append(row)
    return rows


def _cell(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return fmt.format(value)


def _display_frame(df: pd.DataFrame) -> pd.DataFrame:
    """The table as people read it: formatted text, notes as numbered footnotes."""
    multi = df["batch_size"].nunique() > 1
    out = []
    for i, row in enumerate(df.to_dict("records")):
        spread = ("–" if row["status"] != "ok" else
                  f"{row['samples_per_s_min']:.4g}–{row['samples_per_s_max']:.4g}")
        out.append({
            "variant": row["variant"], **({"batch": row["batch_size"]} if multi else {}),
            "status": row["status"],
            "samples/s": _cell(row["samples_per_s"], "{:.4g}"), "spread": spread,
            "speed-up": _cell(row["speedup"], "{:.2f}×"),
            "step ms": _cell(row["step_ms"], "{:.4g}"),
            "peak MiB": _cell(row["peak_mem_mb"], "{:.4g}"),
            "compile s": _cell(row["compile_s"], "{:.1f}"),
            "loss Δ vs fp32": _cell(row["loss_rel_diff"], "{:.1e}"),
            "note": f"[{i + 1}]" if row["note"] else "",
        })
    return pd.DataFrame(out)


def _footer(df: pd.DataFrame) -> list[str]:
    lines = [f"[{i + 1}] {row['variant']}"
             f"{' @' + str(row['batch_size']) if df['batch_size'].nunique() > 1 else ''}: "
             f"{row['note']}" for i, row in enumerate(df.to_dict("records")) if row["note"]]
    a = df.attrs
    if a:
        lines.append(f"{a.get('model', 'model')} on {a.get('device')}: {a.get('warmup')} warm-up "
                     f"+ 1 memory step, then {a.get('repeats')} interleaved windows of "
                     f"{a.get('steps')} steps; speed-up = median per-window ratio to fp32 eager.")
        lines.append(f"memory: this variant's weights, optimizer state and batch + the step's "
                     f"peak working memory ({a.get('memory_method')}).")
        if (df["compile"] != "eager").any():
            lines.append("compiled variants draw dropout masks from torch's generator like eager "
                         "(inductor fallback_random), so their loss compares with fp32.")
    return lines


def compare_table(df: pd.DataFrame) -> str:
    """The comparison as plain text (terminal, logs): the table, then the notes."""
    return "\n".join([_display_frame(df).to_string(index=False), *_footer(df)])


def compare_figure(df: pd.DataFrame):
    """A plotly bar chart: median samples/s per variant (whiskers: min–max over windows),
    labelled with the speed-up; skipped / failed / OOM variants appear with their status."""
    import plotly.graph_objects as go

    fig = go.Figure()
    multi = df["batch_size"].nunique() > 1
    for bs, part in df.groupby("batch_size", sort=False):
        ok = part["status"] == "ok"
        y = part["samples_per_s"].where(ok, 0.0).fillna(0.0)
        text = [f"{s:.2f}×" if good and pd.notna(s) else status
                for s, good, status in zip(part["speedup"], ok, part["status"], strict=True)]
        fig.add_bar(
            x=part["variant"], y=y, name=f"batch {bs}", text=text, textposition="outside",
            hovertext=part["note"].where(part["note"] != "", part["status"]),
            error_y=dict(type="data", symmetric=False,
                         array=(part["samples_per_s_max"] - y).where(ok, 0.0).fillna(0.0),
                         arrayminus=(y - part["samples_per_s_min"]).where(ok, 0.0).fillna(0.0)))
    where = f"{df.attrs.get('model', 'model')} on {df.attrs.get('device', '?')}"
    fig.update_layout(
        title=f"Training throughput by variant — {where}", barmode="group",
        yaxis_title="samples/s (median; whiskers min–max)", xaxis_title="variant",
        showlegend=multi, template="plotly_white", height=420)
    return fig


def _show(df: CompareResult) -> None:
    if frontend() in NOTEBOOK_FRONTENDS + ("ci",):
        df._ipython_display_()
    else:
        print(compare_table(df))


def _printer(progress: bool):
    if not progress:
        return lambda text: None
    return lambda text: print(f"compare: {text}", flush=True)


# ----------------------------------------------------------------------------------------------
# command line: python -m hybridnb compare --model eegnex


def _eegnex() -> nn.Module:
    from braindecode.models import EEGNeX
    return EEGNeX(n_chans=129, n_outputs=1, n_times=200, sfreq=100)


def _shallow() -> nn.Module:
    from braindecode.models import ShallowFBCSPNet
    return ShallowFBCSPNet(n_chans=129, n_outputs=1, n_times=200, final_conv_length="auto")


MODELS = {"eegnex": _eegnex, "shallow": _shallow}


def random_windows(n: int, n_chans: int = 129, n_times: int = 200, seed: int = 0
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Random EEG-shaped windows with a planted linear target (something learnable)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, n_chans, n_times, generator=g)
    w = torch.randn(n_chans, generator=g) / math.sqrt(n_chans)
    y = x.mean(-1) @ w * math.sqrt(n_times) + 0.1 * torch.randn(n, generator=g)
    return x, y


def cli_args(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Time training steps of a braindecode model on random (129, 200) "
                          "windows under precision / compile variants, side by side.")
    parser.add_argument("--model", choices=sorted(MODELS), default="eegnex")
    parser.add_argument("--batch", type=int, nargs="+", default=None,
                        help="batch size(s); default 256 on a GPU, 32 on the CPU")
    parser.add_argument("--steps", type=int, default=None,
                        help="timed steps per window (default 20 on a GPU, 3 on the CPU)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=None,
                        help="interleaved windows per variant (default 3 on a GPU, 2 on the CPU)")
    parser.add_argument("--variants", nargs="+", default=[",".join(DEFAULT_VARIANTS)],
                        help="e.g. fp32 bf16 fp16 fp32+compile bf16+compile:max-autotune")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--csv", type=Path, default=None, help="also write the table here")


def cli(args: argparse.Namespace) -> int:
    dev = _resolve_device(args.device)
    gpu = dev.type != "cpu"
    batch = args.batch or [256 if gpu else 32]
    steps = args.steps or (20 if gpu else 3)
    repeats = args.repeats or (3 if gpu else 2)
    variants = [v for item in args.variants for v in item.replace(",", " ").split()]
    print(f"compare: {args.model} on {dev}, batch {batch}, {args.warmup} warm-up + {repeats} × "
          f"{steps} timed steps per variant: {', '.join(variants)}", flush=True)
    x, y = random_windows(max(batch), seed=args.seed)
    df = compare(MODELS[args.model], (x, y), variants, steps=steps, warmup=args.warmup,
                 repeats=repeats, batch_sizes=batch, device=dev, lr=args.lr, seed=args.seed)
    df.attrs["model"] = {"eegnex": "EEGNeX", "shallow": "ShallowFBCSPNet"}[args.model]
    print(compare_table(df))
    if args.csv:
        pd.DataFrame(df).to_csv(args.csv, index=False)
        print(f"compare: table written to {args.csv}")
    return 0
