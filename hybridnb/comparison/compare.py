"""compare(): one model's training step under precision / layout / compile variants, side by side.

"bf16 is 2x faster" is folklore until it is measured on *your* model and *your* hardware. Every
variant starts from the same seeded weights and times ``train.step.TrainStep`` (forward,
backward, AdamW) with device-synchronised timers, taking turns (A B A B ...) so drift on a busy
machine favours none; each runs in its own process (``comparison.worker``), so a crash or a
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
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import cloudpickle
import torch
from torch import nn

from hybridnb import platform
from hybridnb.comparison import session
from hybridnb.comparison.compare_view import (
    COLUMNS,
    CompareResult,
    compare_figure,
    compare_table,
)
from hybridnb.comparison.variants import DEFAULT_VARIANTS, Variant, parse_variant, unavailable
from hybridnb.comparison.worker import ChildVariant
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
    where: Any = None  # its VariantSession | ChildVariant (closed by compare's ExitStack)

    def take(self, answer: dict) -> bool:
        """Record an answer; False when the run has ended (skipped, oom, failed, crashed...)."""
        if answer["status"] != "ok":
            self.status, self.note, self.last_loss = answer["status"], answer.get("note", ""), None
            return False
        self.last_loss = answer.get("loss", self.last_loss)
        self.note = answer.get("note") or self.note  # what an ok variant applied (+speedups)
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
    runs, batches, dev, attrs = _plan(model_fn, data, variants, steps, warmup, repeats,
                                      batch_sizes, device, loss, loss_tol, timeout)
    say = (lambda text: print(f"compare: {text}", flush=True)) if progress else (lambda _: None)
    jobs = {id(r): session.VariantSession(r.variant, _factory(model_fn), *batches[r.batch_size],
                                          str(dev), loss, lr, seed, warmup)
            for r in runs if r.status == "ok"}
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
        _start(runs, jobs, blobs, watch, timeout, say, stack)
        for rnd in range(repeats):
            for run in runs:
                if run.status != "ok":
                    continue
                answer = run.where.call("window", steps, stage=f"timed window {rnd + 1}")
                if run.take(answer):
                    run.windows.append(answer["seconds"])
                    run.busy.extend(answer["busy"])
                    order.append((run.variant.label, run.batch_size, rnd))
            done = [f"{r.variant.label}@{r.batch_size} {_median(_rates(r, steps)):.1f}/s"
                    for r in runs if r.status == "ok"]
            say(f"round {rnd + 1}/{repeats}: " + ", ".join(done))
    df = CompareResult(_rows(runs, steps, loss_tol, warmup, repeats), columns=COLUMNS)
    df.attrs.update(attrs, order=order, elapsed_s=round(time.perf_counter() - t_start, 2),
                    isolated=blobs is not None)
    if dev.type == "cpu" and any(r.variant.precision == "bf16" and r.status == "ok"
                                 for r in runs):
        df.attrs["notes"].append(session.CPU_BF16_NOTE + ".")
    return df


def _plan(model_fn, data, variants, steps, warmup, repeats, batch_sizes, device, loss, loss_tol,
          timeout):
    """Check every argument before any work, and decide which runs can happen here."""
    if not (callable(model_fn) or isinstance(model_fn, nn.Module)):
        raise TypeError(f"model_fn must build an nn.Module (a function or a class), "
                        f"got {type(model_fn).__name__}")
    for name, value in (("steps", steps), ("warmup", warmup), ("repeats", repeats)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}: must be an integer >= 1")
    if not loss_tol > 0:
        raise ValueError(f"loss_tol={loss_tol!r}: must be > 0")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout={timeout!r}: seconds must be > 0 (None: no limit)")
    make_loss(loss)  # raises ValueError naming a loss it does not know
    if isinstance(variants, str):
        variants = variants.replace(",", " ").split()
    parsed = [parse_variant(v) for v in variants]
    if not any(v.is_baseline for v in parsed):
        parsed.insert(0, Variant("fp32", "fp32"))
    seen: Counter[str] = Counter()
    labelled = []
    for v in parsed:  # a variant listed twice (an A/A check) is labelled "#2"
        seen[v.label] += 1
        labelled.append(replace(v, label=f"{v.label} #{seen[v.label]}") if seen[v.label] > 1
                        else v)
    if batch_sizes is not None and (not batch_sizes or any(
            not isinstance(b, int) or b < 1 for b in batch_sizes)):
        raise ValueError(f"batch_sizes={batch_sizes!r}: need positive integers")
    batches = _batches(data, batch_sizes)
    dev = resolve_device(device)
    runs = []
    baseline = next(v for v in labelled if v.is_baseline)
    for bs in batches:
        for v in labelled:
            reason = unavailable(v, dev)  # what is known without touching the device
            runs.append(_Run(v, bs, baseline=v is baseline, status="skipped" if reason else "ok",
                             note=reason))
    method = ("CUDA allocator peak" if dev.type == "cuda" else
              "MPS allocator, sampled every 2 ms" if dev.type == "mps" else heap_reader()[1])
    attrs = dict(device=str(dev), steps=steps, warmup=warmup, repeats=repeats,
                 model=_model_name(model_fn), torch=torch.__version__, memory_method=method,
                 notes=[])
    return runs, batches, dev, attrs


def _pickled(isolate: bool, jobs: dict) -> tuple[dict | None, str]:
    """Each job pickled once for its own process, or None (and the one sentence) when the
    variants cannot get processes of their own."""
    if not isolate or not jobs:
        return None, ""
    pipes = platform.child_pipes()
    why = "" if pipes else pipes.why
    if not why:
        try:
            return {key: cloudpickle.dumps(job) for key, job in jobs.items()}, ""
        except Exception as exc:  # noqa: BLE001 - any pickling failure means: run here, and say so
            why = (f"the model function, loss or batch cannot be sent to a variant's own "
                   f"process ({type(exc).__name__}: {str(exc)[:160]})")
    return None, f"{why}, so the variants run in this process: a crash in one would end it"


def _start(runs: list[_Run], jobs: dict, blobs: dict | None, watch: Watch | None, timeout,
           say, stack: contextlib.ExitStack) -> None:
    """Start every variant's process at once (their imports overlap), wait until each is ready
    (so no warm-up shares the CPU with another process's start), then warm each up in turn. Each
    is closed on ``stack``'s exit, whatever happened, before the watch closes what is left."""
    t0 = time.perf_counter()
    live = [r for r in runs if r.status == "ok"]
    for i, run in enumerate(live):
        run.where = (ChildVariant(blobs[id(run)], watch, f"variant-{i}", timeout)
                     if blobs is not None else jobs[id(run)])
        stack.callback(run.where.close)
    if blobs is not None:  # a process's first answer: its job is loaded (``jobs``: not empty)
        for run in live:
            run.take(run.where.call("ready", stage="start-up"))
        say(f"{len(live)} variant processes started in {time.perf_counter() - t0:.1f} s")
    for run in (r for r in live if r.status == "ok"):
        t0, name = time.perf_counter(), f"{run.variant.label} · batch {run.batch_size}"
        answer = run.where.call("prepare", stage="warm-up")
        if run.take(answer):
            run.first_step_s, run.mem_bytes = answer["first_step_s"], answer["mem_bytes"]
            run.other_masks = bool(answer.get("other_masks"))
            compiled = (f", first step {run.first_step_s:.1f} s (compiles)"
                        if run.variant.compile else "")
            say(f"{name}: warmed up in {time.perf_counter() - t0:.1f} s{compiled}")
        elif run.baseline and run.status == "failed":
            raise RuntimeError(
                f"compare(): the fp32 eager baseline failed at batch {run.batch_size}, so the "
                f"model or data does not train as given: {run.note}")
        else:
            say(f"{name}: {run.status}: {run.note}")


def random_windows(n: int, n_chans: int, n_times: int, seed: int = 0
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` random (n_chans, n_times) inputs with a planted linear target (something a model
    can learn), for timing a step without real data."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, n_chans, n_times, generator=g)
    w = torch.randn(n_chans, generator=g) / math.sqrt(n_chans)
    y = x.mean(-1) @ w * math.sqrt(n_times) + 0.1 * torch.randn(n, generator=g)
    return x, y


def resolve_device(device) -> torch.device:
    """The variants' device: "auto" is detect()'s choice; others are checked as the Trainer
    checks ``device=`` (setup.resolve_device)."""
    return setup.resolve_device(device, detect() if device == "auto" else None)


def _factory(model_fn):
    if isinstance(model_fn, nn.Module):
        return lambda: copy.deepcopy(model_fn)

    def build() -> nn.Module:
        model = model_fn()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model_fn {_model_name(model_fn)} returned "
                            f"{type(model).__name__}, not an nn.Module")
        return model

    return build


def _model_name(model_fn) -> str:
    return getattr(model_fn, "__name__", type(model_fn).__name__)  # a module: its class's


def _batches(data, sizes: Sequence[int] | None) -> dict[int, tuple]:
    """One (x, y) per batch size (None: the batch's own size, 64 for a Dataset), on the CPU
    (each variant moves its own to the device); samples repeat when the size needs more."""
    if isinstance(data, torch.utils.data.DataLoader):
        data = next(iter(data))  # its first batch
    if isinstance(data, torch.utils.data.Dataset) and hasattr(data, "__len__"):
        if len(data) == 0:
            raise ValueError("data: the Dataset is empty")
        sizes = sizes or [DEFAULT_DATASET_BATCH]
        items = [data[i % len(data)] for i in range(max(sizes))]
        data = torch.utils.data.default_collate([(it[0], it[1]) for it in items])
    elif not isinstance(data, (tuple, list)) or len(data) < 2:
        raise TypeError(f"data must be a batch (x, y), a Dataset or a DataLoader; "
                        f"got {type(data).__name__}")
    x, y = (torch.as_tensor(t) for t in data[:2])
    if len(x) != len(y) or len(x) == 0:
        raise ValueError(f"data: the sample batch has {len(x)} inputs and {len(y)} targets "
                         "(need the same number, at least one)")
    x, y = (t.float() if t.is_floating_point() else t for t in (x, y))
    return {bs: (x[torch.arange(bs) % len(x)].contiguous(),
                 y[torch.arange(bs) % len(y)].contiguous()) for bs in sizes or [len(x)]}


def _rates(run: _Run, steps: int) -> list[float]:
    """Samples/s per window; a window timed at zero or less (a clock that did not advance) has
    no rate, not an infinite one."""
    return [steps * run.batch_size / s for s in run.windows if s > 0]


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def _rows(runs: list[_Run], steps: int, loss_tol: float, warmup: int, repeats: int) -> list[dict]:
    base = {r.batch_size: r for r in runs if r.baseline}
    total_steps = warmup + 1 + steps * repeats
    rows = []
    for run in runs:
        row = dict.fromkeys(COLUMNS, math.nan)
        row.update(variant=run.variant.label, precision=run.variant.precision,
                   compile=run.variant.compile or "eager", batch_size=run.batch_size,
                   status=run.status, note=run.note, loss_ok=None)
        rows.append(row)
        if run.status != "ok":  # an ok run answered every window: repeats of them
            continue
        rates, median_s = _rates(run, steps), statistics.median(run.windows)
        final = run.last_loss if run.last_loss is not None else math.nan
        row.update(samples_per_s=_median(rates), samples_per_s_min=min(rates, default=math.nan),
                   samples_per_s_max=max(rates, default=math.nan), step_ms=1000 * median_s / steps,
                   loss_ok=False, peak_mem_mb=run.mem_bytes / 2**20, final_loss=final,
                   gpu_busy_pct=_median(run.busy))
        if run.variant.compile:
            row["compile_s"] = max(run.first_step_s - median_s / steps, 0.0)
        ref = base.get(run.batch_size)
        compared = ref is not None and ref.status == "ok"
        if compared:
            row["speedup"] = _median([a / b for a, b in zip(ref.windows, run.windows, strict=True)
                                      if a > 0 and b > 0])
            diff = abs(final - ref.last_loss) / max(abs(ref.last_loss), 1e-12)
            row.update(loss_rel_diff=diff, loss_ok=bool(math.isfinite(diff) and diff <= loss_tol))
        if not math.isfinite(final):
            row["note"] = f"non-finite loss after {total_steps} steps"
        elif row["loss_ok"] is False and compared and run.other_masks:
            row["note"] = "; ".join(filter(None, [run.note, (
                f"loss not compared with fp32 (differs by {row['loss_rel_diff']:.1%} after "
                f"{total_steps} steps): dropout draws its masks in memory order, so under "
                f"channels_last the same seed gives other masks; first_step_diff() "
                f"compares the arithmetic")]))
            # a number here would read as a difference
            row.update(loss_ok=None, loss_rel_diff=math.nan)
        elif row["loss_ok"] is False and compared:
            row["note"] = (f"loss after {total_steps} steps differs from fp32 by "
                           f"{row['loss_rel_diff']:.1%} (> loss_tol {loss_tol:.0%})")
    return rows


def first_step_diff(model_fn, data, variants: Sequence[str], seed: int = 0,
                    loss: str | Callable = "mse") -> pd.DataFrame:
    """Each variant's first training step against stock fp32 eager, on the CPU in this
    process: the largest difference of the outputs and of every gradient over the stock maximum
    (``exact``: both within ``speedups.exact.RTOL``, float rounding; no absolute tolerance, so
    small outputs and gradients still show bf16's rounding).

    One step from the same weights compares the arithmetic; a loss after several steps also
    carries how training amplifies rounding. Dropout is off for the step (under channels_last
    the same seed draws other masks); ``+compile`` variants are listed, not run (a minute each
    on a CPU).
    """
    import pandas as pd

    x, y = next(iter(_batches(data, None).values()))
    loss_fn = make_loss(loss)
    build = _factory(model_fn)
    stock_out, stock_grads, *_ = _first_step(build, seed, x, y, loss_fn, Variant("fp32", "fp32"))
    gscale = max((h.abs().max().item() for h in stock_grads if h is not None), default=0.0)
    rows = []
    for text in variants:
        v = parse_variant(text)
        row = {"variant": v.label, "out_rel_diff": math.nan, "grad_rel_diff": math.nan,
               "exact": None, "note": ""}
        rows.append(row)
        if v.compile:
            row["note"] = "not run here: torch.compile costs about a minute per variant on a CPU"
            continue
        out, grads, row["note"], changed = _first_step(build, seed, x, y, loss_fn, v)
        if not changed:  # nothing to act on: no difference to measure
            continue
        row["out_rel_diff"] = _rel(out, stock_out)
        row["grad_rel_diff"] = max((_rel(g, h, scale=gscale)
                                    for g, h in zip(grads, stock_grads, strict=True)
                                    if g is not None and h is not None), default=0.0)
        row["exact"] = bool(row["out_rel_diff"] <= RTOL and row["grad_rel_diff"] <= RTOL)
    return pd.DataFrame(rows)


def _rel(a: torch.Tensor, b: torch.Tensor, scale: float | None = None) -> float:
    """max|a - b| over ``scale`` (default max|b|)."""
    if a.shape != b.shape:
        return math.inf
    ref = b.abs().max().item() if scale is None else scale
    return (a.float() - b.float()).abs().max().item() / max(ref, 1e-12)


def _first_step(build, seed: int, x, y, loss_fn, v: Variant):
    """One training-mode forward + backward of ``v`` from the seeded weights (dropout off):
    the output, every parameter's gradient, the variant's note, and False when its change had
    nothing to act on."""
    torch.manual_seed(seed)
    model = build().train()
    skip, said, _ = session.apply_changes(v, model, x, "cpu", v.precision)
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.eval()
    torch.manual_seed(seed + 1)
    cpu = torch.device("cpu")
    with session.variant_settings(v, cpu), autocast(v.precision, cpu):
        out = model(x)  # as compare()'s variants run it
    loss_fn(out.float(), y).backward()
    return out.detach().float(), [p.grad for p in model.parameters()], skip or said, not skip
