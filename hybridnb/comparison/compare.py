"""compare(): one model's training step under precision / layout / compile variants, side by side.

"bf16 is 2x faster" is folklore until it is measured on *your* model and *your* hardware. Every
variant starts from the same seeded weights and times ``train.step.TrainStep`` (forward,
backward, AdamW) with device-synchronised timers, taking turns (A B A B ...) so drift on a busy
machine favours none; each runs in its own process (``comparison.isolation``), so a crash or a
hang is a row with its reason. The batch stays on the device: the model step is measured, not
the data path.

>>> df = hn.compare(lambda: MyNet(), (x, y), variants=("fp32", "bf16", "bf16+compile"))
"""

from __future__ import annotations

import contextlib
import copy
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import cloudpickle
import torch
from torch import nn

from hybridnb.comparison import isolation
from hybridnb.comparison.compare_view import (
    COLUMNS,
    CompareResult,
    compare_figure,
    compare_table,
)
from hybridnb.comparison.isolation import ChildVariant, LocalVariant
from hybridnb.comparison.session import CPU_BF16_NOTE, Job, apply_changes
from hybridnb.comparison.variants import DEFAULT_VARIANTS, Variant, parse_variant, unavailable
from hybridnb.hardware.detect import detect
from hybridnb.measure.memory import heap_reader
from hybridnb.processes.supervise import Watch
from hybridnb.speedups.exact import RTOL
from hybridnb.speedups.trial import autocast
from hybridnb.train import setup
from hybridnb.train.losses import make_loss

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["compare", "compare_figure", "compare_table", "CompareResult", "parse_variant",
           "random_windows", "first_step_diff", "DEFAULT_VARIANTS", "COLUMNS"]

DEFAULT_DATASET_BATCH = 64
DEFAULT_TIMEOUT = 600.0


@dataclass
class _Run:
    """One variant at one batch size, as the caller sees it: its answers so far."""

    variant: Variant
    batch_size: int
    baseline: bool = False
    status: str = "ok"
    note: str = ""
    first_step_s: float = math.nan
    mem_bytes: float = math.nan
    windows: list[float] = field(default_factory=list)
    busy: list[float] = field(default_factory=list)
    last_loss: float | None = None
    other_masks: bool = False  # dropout under channels_last: its loss is not comparable
    where: Any = None  # LocalVariant | ChildVariant while it lives

    @property
    def name(self) -> str:
        return f"{self.variant.label} · batch {self.batch_size}"

    def take(self, answer: dict) -> bool:
        """Record an answer; False when the run has ended (skipped, oom, failed, crashed...)."""
        if answer["status"] != "ok":
            self.status, self.note = answer["status"], answer.get("note", "")
            self.last_loss = None
            return False
        if "loss" in answer:
            self.last_loss = answer["loss"]
        if answer.get("note"):  # what an ok variant applied (+speedups)
            self.note = answer["note"]
        return True


def compare(model_fn: Callable[[], nn.Module] | nn.Module, data: Any,
            variants: Sequence[str] = DEFAULT_VARIANTS, *, steps: int = 20, warmup: int = 3,
            repeats: int = 3, batch_sizes: Sequence[int] | None = None,
            device: str | torch.device = "auto", loss: str | Callable = "mse", lr: float = 1e-3,
            seed: int = 0, loss_tol: float = 0.05, progress: bool = True,
            isolate: bool = True, timeout: float | None = DEFAULT_TIMEOUT) -> CompareResult:
    """Time training steps of ``model_fn()`` under each variant: one row per variant and batch
    size (``COLUMNS``).

    ``model_fn`` is called once per variant after ``torch.manual_seed(seed)`` (a module is
    copied). ``data``: a batch ``(x, y)``, a Dataset or a DataLoader (its first batch); a batch
    size above its size repeats samples (default: its size, 64 for a Dataset). ``variants``: see
    ``comparison.variants``; fp32 eager is the baseline and always runs (list a variant twice
    for an A/A check). Each variant runs ``warmup`` steps, one untimed step for memory, then
    ``repeats`` timed windows of ``steps`` steps in turn with the others. ``isolate=False`` runs
    them in this process (a crash ends it); isolated, a variant silent for ``timeout`` s in one
    request is killed.

    ``speedup``: median of per-window ratios to fp32 eager; ``peak_mem_mb``: weights, optimizer
    state and batch plus the step's peak working memory (exact on CUDA, sampled from the heap
    on CPU); ``compile_s``: first step minus a steady step; ``loss_ok``: finite and within
    ``loss_tol`` of fp32 after the same steps (None under channels_last with dropout, which draws
    other masks). ``status``: ok | skipped | oom | failed | crashed | timeout, ``note`` says why.
    """
    runs, dev, attrs = _plan(model_fn, data, variants, steps, warmup, repeats, batch_sizes,
                             device, loss, loss_tol, timeout)
    say = _printer(progress)
    batches = _batches(data, sorted({r.batch_size for r in runs}))
    jobs = {id(r): Job(r.variant, _factory(model_fn), *batches[r.batch_size], str(dev), loss,
                       lr, seed, warmup) for r in runs if r.status == "ok"}
    blobs, why_not = _pickled(isolate, jobs)
    if why_not:
        say(why_not)
        attrs["notes"].append(why_not)
    order: list[tuple[str, int, int]] = []
    t_start = time.perf_counter()
    # one Watch for every variant's process: from before the first starts, its signal
    # policy ends them all, whatever moment an interrupt comes
    with contextlib.ExitStack() as stack:
        watch = stack.enter_context(Watch()) if blobs is not None else None
        stack.callback(_close_all, runs)  # first, then the watch closes what is left
        _start(runs, jobs, blobs, watch, timeout, say)
        for run in runs:
            if run.status == "ok":
                _prepare(run, say)
        for rnd in range(repeats):
            for run in runs:
                if run.status == "ok" and _window(run, steps):
                    order.append((run.variant.label, run.batch_size, rnd))
            done = [f"{r.variant.label}@{r.batch_size} {_median_rate(r, steps):.1f}/s"
                    for r in runs if r.status == "ok"]
            say(f"round {rnd + 1}/{repeats}: " + ", ".join(done))
    df = CompareResult(_rows(runs, steps, loss_tol, warmup, repeats), columns=COLUMNS)
    df.attrs.update(attrs)
    df.attrs.update(order=order, elapsed_s=round(time.perf_counter() - t_start, 2),
                    isolated=blobs is not None)
    if dev.type == "cpu" and any(r.variant.precision == "bf16" and r.status == "ok"
                                 for r in runs):
        df.attrs["notes"].append(CPU_BF16_NOTE + ".")
    return df


def _plan(model_fn, data, variants, steps, warmup, repeats, batch_sizes, device, loss, loss_tol,
          timeout):
    """Check every argument before any work, and decide which runs can happen here."""
    if not (callable(model_fn) or isinstance(model_fn, nn.Module)):
        raise TypeError(f"model_fn must build an nn.Module (a function or a class), "
                        f"got {type(model_fn).__name__}")
    for name, value, low in (("steps", steps, 1), ("warmup", warmup, 1), ("repeats", repeats, 1)):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"{name}={value!r}: must be an integer >= {low}")
    if not loss_tol > 0:
        raise ValueError(f"loss_tol={loss_tol!r}: must be > 0")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout={timeout!r}: seconds must be > 0 (None: no limit)")
    make_loss(loss)  # raises ValueError naming a loss it does not know
    if isinstance(variants, str):
        variants = [v for v in variants.replace(",", " ").split() if v]
    parsed = [parse_variant(v) for v in variants]
    if not any(v.is_baseline for v in parsed):
        parsed.insert(0, Variant("fp32", "fp32"))
    seen: dict[str, int] = {}
    labelled = []
    for v in parsed:
        seen[v.label] = seen.get(v.label, 0) + 1
        label = v.label if seen[v.label] == 1 else f"{v.label} #{seen[v.label]}"
        labelled.append(Variant(label, v.precision, v.compile, v.channels_last, v.rewrite, v.speedups))
    if batch_sizes is not None:
        batch_sizes = list(batch_sizes)
        bad = [b for b in batch_sizes if not isinstance(b, int) or b < 1]
        if bad or not batch_sizes:
            raise ValueError(f"batch_sizes={batch_sizes!r}: need positive integers")
    else:
        batch_sizes = [_natural_batch_size(data)]
    dev = resolve_device(device)
    runs = []
    for bs in batch_sizes:
        first_baseline = True
        for v in labelled:
            run = _Run(v, bs)
            if v.is_baseline and first_baseline:
                run.baseline, first_baseline = True, False
            reason = unavailable(v, dev)  # what is known without touching the device
            if reason:
                run.status, run.note = "skipped", reason
            runs.append(run)
    method = ("CUDA allocator peak" if dev.type == "cuda" else
              "MPS allocator, sampled every 2 ms" if dev.type == "mps" else heap_reader()[1])
    attrs = dict(device=str(dev), steps=steps, warmup=warmup, repeats=repeats,
                 model=_model_name(model_fn), torch=torch.__version__, memory_method=method,
                 notes=[])
    return runs, dev, attrs


def _pickled(isolate: bool, jobs: dict) -> tuple[dict | None, str]:
    """Each job pickled once for its own process, or None (and the one sentence) when the
    variants cannot get processes of their own."""
    if not isolate or not jobs:
        return None, ""
    why = isolation.unavailable()
    if why:
        return None, why
    try:
        return {key: cloudpickle.dumps(job) for key, job in jobs.items()}, ""
    except Exception as exc:  # noqa: BLE001 - any pickling failure means: run here, and say so
        return None, (f"the model function, loss or batch cannot be sent to a variant's own "
                      f"process ({type(exc).__name__}: {str(exc)[:160]}), so the variants run "
                      f"in this process: a crash in one would end it")


def _close_all(runs: list[_Run]) -> None:
    """Close every variant (its process, or its session here), whatever happened."""
    for run in runs:
        if run.where is not None:
            where, run.where = run.where, None
            where.close()


def _start(runs: list[_Run], jobs: dict, blobs: dict | None, watch: Watch | None, timeout,
           say) -> None:
    """Start every variant's process at once (their imports overlap), then wait until each is
    ready, so no warm-up shares the CPU with another process's start."""
    t0 = time.perf_counter()
    live = [r for r in runs if r.status == "ok"]
    for i, run in enumerate(live):
        run.where = (ChildVariant(blobs[id(run)], watch, f"variant-{i}", timeout)
                     if blobs is not None else LocalVariant(jobs[id(run)]))
    for run in live:
        run.take(run.where.call("ready", stage="start-up"))
    if blobs is not None and live:
        say(f"{len(live)} variant processes started in {time.perf_counter() - t0:.1f} s")


def _prepare(run: _Run, say) -> None:
    """Warm up (compiling when asked) and measure memory; the baseline must work."""
    t0 = time.perf_counter()
    answer = run.where.call("prepare", stage="warm-up")
    if run.take(answer):
        run.first_step_s, run.mem_bytes = answer["first_step_s"], answer["mem_bytes"]
        run.other_masks = bool(answer.get("other_masks"))
        compiled = (f", first step {run.first_step_s:.1f} s (compiles)"
                    if run.variant.compile else "")
        say(f"{run.name}: warmed up in {time.perf_counter() - t0:.1f} s{compiled}")
    elif run.baseline and run.status == "failed":
        raise RuntimeError(
            f"compare(): the fp32 eager baseline failed at batch {run.batch_size}, so the "
            f"model or data does not train as given: {run.note}")
    else:
        say(f"{run.name}: {run.status}: {run.note}")


def _window(run: _Run, steps: int) -> bool:
    """One timed window of ``steps`` steps; False when the run ended in it."""
    answer = run.where.call("window", steps, stage=f"timed window {len(run.windows) + 1}")
    if not run.take(answer):
        return False
    run.windows.append(answer["seconds"])
    run.busy.extend(answer["busy"])
    return True


def random_windows(n: int, n_chans: int, n_times: int, seed: int = 0
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` random (n_chans, n_times) inputs with a planted linear target (something a model
    can learn), for timing a step without real data."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, n_chans, n_times, generator=g)
    w = torch.randn(n_chans, generator=g) / math.sqrt(n_chans)
    y = x.mean(-1) @ w * math.sqrt(n_times) + 0.1 * torch.randn(n, generator=g)
    return x, y


# ----------------------------------------------------------------------------------------------
# inputs


def resolve_device(device) -> torch.device:
    """The variants' device: "auto" is detect()'s choice; others are checked as the Trainer
    checks ``device=`` (setup.resolve_device)."""
    return setup.resolve_device(device, detect() if device == "auto" else None)


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


def _batches(data, sizes: list[int]) -> dict[int, tuple]:
    """One (x, y) per batch size, on the CPU (each variant moves its own to the device);
    samples repeat when the size needs more."""
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
        out[bs] = (x[idx].contiguous(), y[idx].contiguous())
    return out


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
        final = run.last_loss if ok and run.last_loss is not None else math.nan
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
                ref_loss = ref.last_loss
                diff = abs(final - ref_loss) / max(abs(ref_loss), 1e-12)
                row["loss_rel_diff"] = diff
                row["loss_ok"] = bool(math.isfinite(diff) and diff <= loss_tol)
            if not math.isfinite(final):
                row["note"] = f"non-finite loss after {total_steps} steps"
            elif row["loss_ok"] is False and ref_ok and run.other_masks:
                row["loss_ok"] = None
                row["note"] = "; ".join(filter(None, [run.note, (
                    f"loss not compared with fp32 (differs by {row['loss_rel_diff']:.1%} after "
                    f"{total_steps} steps): dropout draws its masks in memory order, so under "
                    f"channels_last the same seed gives other masks; first_step_diff() "
                    f"compares the arithmetic")]))
                row["loss_rel_diff"] = math.nan  # a number here would read as a difference
            elif row["loss_ok"] is False and ref_ok:
                row["note"] = (f"loss after {total_steps} steps differs from fp32 by "
                               f"{row['loss_rel_diff']:.1%} (> loss_tol {loss_tol:.0%})")
        elif run.status == "ok":  # never timed: an earlier stage ended it without a reason
            row.update(status="failed", note=run.note or "no timed window completed")
        rows.append(row)
    return rows


def _printer(progress: bool):
    if not progress:
        return lambda text: None
    return lambda text: print(f"compare: {text}", flush=True)


# ----------------------------------------------------------------------------------------------
# exactness of the first step


EXACT_RTOL = RTOL  # |a - b| <= RTOL * max|b| counts as rounding (hybridnb.speedups.exact)


def first_step_diff(model_fn, data, variants: Sequence[str], seed: int = 0,
                    loss: str | Callable = "mse") -> pd.DataFrame:
    """Each variant's first training step against stock fp32 eager, on the CPU in this
    process: the largest difference of the outputs and of every gradient over the stock maximum
    (``exact``: both within ``EXACT_RTOL``, float rounding).

    One step from the same weights compares the arithmetic; a loss after several steps also
    carries how training amplifies rounding. Dropout is off for the step (under channels_last
    the same seed draws other masks); ``+compile`` variants are listed, not run (a minute each
    on a CPU).
    """
    import pandas as pd

    size = _natural_batch_size(data)
    x, y = _batches(data, [size])[size]
    loss_fn = make_loss(loss)
    build = _factory(model_fn)
    stock = _first_step(build, seed, x, y, loss_fn, "fp32")
    gscale = max((h.abs().max().item() for h in stock[1] if h is not None), default=0.0)
    rows = []
    for text in variants:
        v = parse_variant(text)
        row = {"variant": v.label, "out_rel_diff": math.nan, "grad_rel_diff": math.nan,
               "exact": None, "note": ""}
        if v.compile:
            row["note"] = "not run here: torch.compile costs about a minute per variant on a CPU"
            rows.append(row)
            continue

        def change(model, v=v, row=row) -> None:
            skip, said, _ = apply_changes(v, model, x, "cpu", v.precision)
            row["note"], row["skipped"] = skip or said, bool(skip)

        out, grads = _first_step(build, seed, x, y, loss_fn, v.precision, change)
        if row.pop("skipped"):  # nothing changed: no difference to measure
            rows.append(row)
            continue
        row["out_rel_diff"] = _rel(out, stock[0])
        row["grad_rel_diff"] = max((_rel(g, h, scale=gscale)
                                    for g, h in zip(grads, stock[1], strict=True)
                                    if g is not None and h is not None), default=0.0)
        row["exact"] = bool(row["out_rel_diff"] <= EXACT_RTOL
                            and row["grad_rel_diff"] <= EXACT_RTOL)
        rows.append(row)
    return pd.DataFrame(rows)


def _first_step(build, seed: int, x, y, loss_fn, precision: str, change=None):
    """One training-mode forward + backward from the seeded weights (dropout off): the output
    and every parameter's gradient."""
    torch.manual_seed(seed)
    model = build().train()
    if change is not None:
        change(model)
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.eval()
    torch.manual_seed(seed + 1)
    # each precision's own autocast; bf16 with oneDNN off, as compare()'s variants run it (its
    # bf16 grouped convolution asks some CPUs for hundreds of GB)
    with torch.backends.mkldnn.flags(enabled=precision != "bf16"), \
            autocast(precision, torch.device("cpu")):
        out = model(x)
    loss_fn(out.float(), y).backward()
    return out.detach().float(), [p.grad for p in model.parameters()]


def _rel(a: torch.Tensor, b: torch.Tensor, scale: float | None = None) -> float:
    """max|a - b| over ``scale`` (default max|b|)."""
    if a.shape != b.shape:
        return math.inf
    ref = b.abs().max().item() if scale is None else scale
    return (a.float() - b.float()).abs().max().item() / max(ref, 1e-12)
