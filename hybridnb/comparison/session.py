"""One compare() variant's whole life: build the model, apply the variant's changes, warm up,
measure the step's memory, then time windows of steps on request.

A session answers with plain dicts (status, note, numbers), never with an exception, so it runs
the same way in the caller's process and in a variant's own process (``comparison.worker``), where
its answers travel over a pipe. Status is ok | skipped | oom | failed.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from hybridnb import speedups
from hybridnb.comparison.variants import Variant, unavailable
from hybridnb.failures import first_line, free_memory, is_oom
from hybridnb.hardware.rules import device_native_bf16
from hybridnb.measure.memory import MemorySampler, heap_reader, peak_bytes, reset_peak
from hybridnb.measure.timing import Stopwatch, nvml_busy_reader, synchronize
from hybridnb.torch_state import set_torch_rng_state, torch_rng_state
from hybridnb.train.losses import make_loss
from hybridnb.train.precision import Precision
from hybridnb.train.step import TrainStep

CPU_BF16_NOTE = ("bf16 on the CPU runs with oneDNN off (torch.backends.mkldnn.flags): oneDNN's "
                 "bf16 grouped convolutions asked for 110-880 GB on Xeon CPUs with AMX")


def apply_changes(variant: Variant, model: nn.Module, x: torch.Tensor, device,
                  precision) -> tuple[str, str, bool]:
    """Rewrite, then channels_last, or the Trainer's own decision (+speedups, at the variant's
    precision), applied to ``model``: (why a change has nothing to act on, or ""; what
    +speedups applied; whether the model now runs channels_last)."""
    if variant.speedups:
        knobs = [k for k in speedups.KNOBS if k != "precision"]  # the variant's precision
        applied = speedups.apply_speedups(model, x, device, precision=precision, knobs=knobs)
        if not applied.applied:
            return f"+speedups changes nothing here: {applied.message}", "", False
        return "", applied.message, "channels_last" in applied.applied
    if variant.rewrite:
        report = speedups.DEPTHWISE.apply(model, x)
        if not report:
            return report.note or ("+rewrite changes nothing here: the model has no depthwise "
                                   "convolution whose kernel spans its input's height (the "
                                   "rewrite's rule)"), "", False
    if variant.channels_last:
        if not any(isinstance(m, nn.Conv2d) for m in model.modules()):
            return ("+channels_last changes nothing here: the model has no 2-D convolution "
                    "(the layout applies to 4-D weights and activations)"), "", False
        model.to(memory_format=torch.channels_last)
        return "", "", True
    return "", "", False


class VariantSession:
    """Runs one variant; see the module docstring. "prepare" once, then "window" (steps). Made
    in the caller, it is picklable (with cloudpickle) for the variant's own process until then;
    ``x``, ``y``: the batch on the CPU, moved to ``device`` by "prepare"."""

    STAGES = {"prepare": "warm-up", "window": "timed window"}  # as a failure's note names them

    def __init__(self, variant: Variant, model_fn: Callable[[], nn.Module], x: torch.Tensor,
                 y: torch.Tensor, device: str, loss: Any, lr: float, seed: int,
                 warmup: int) -> None:
        self.variant, self.model_fn, self.x, self.y = variant, model_fn, x, y
        self.device = torch.device(device)
        self.loss, self.lr, self.seed, self.warmup = loss, lr, seed, warmup
        self._run: Callable[[], torch.Tensor] | None = None
        self._rng: tuple | None = None
        self._busy = None  # NVML's GPU-busy reader, None without NVML (set in _prepare)
        self._loss: torch.Tensor | None = None

    def call(self, request: str, *args, stage: str = "") -> dict:
        """``request`` answered in this process, as ``worker.ChildVariant.call`` answers it
        from the variant's own ("prepare" or "window"); a failure (OOM included) is an answer."""
        try:
            with variant_settings(self.variant, self.device):
                answer = self._prepare() if request == "prepare" else self._window(*args)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an answer
            why, stage = first_line(exc, 240), self.STAGES[request]
            answer = ({"status": "oom", "note": f"out of memory during {stage} at batch "
                                                f"{self.x.shape[0]}: {why}"} if is_oom(exc)
                      else {"status": "failed", "note": f"{stage}: {type(exc).__name__}: {why}"})
        if answer["status"] != "ok":
            self.close()  # outside the except block: its traceback pins the tensors
        return answer

    def close(self) -> None:
        """Drop the model, optimizer and batch so their memory comes back."""
        self._run, self._loss = None, None
        free_memory(self.device)

    def _prepare(self) -> dict:
        """Build, warm up (the first step timed: it compiles), then measure one step's memory:
        ``{status, note, first_step_s, mem_bytes, loss, other_masks}``."""
        dev = self.device
        reason = unavailable(self.variant, dev, live=True)
        if reason:
            return {"status": "skipped", "note": reason}
        torch.manual_seed(self.seed)
        model = self.model_fn().to(dev).train()  # compare._factory checked it returns a Module
        x, y = self.x.to(dev), self.y.to(dev)
        native = device_native_bf16(dev) if dev.type == "cuda" else None
        prec = Precision.choose(self.variant.precision, dev, native_bf16=native)
        skip, said, nhwc = apply_changes(self.variant, model, x, dev, prec)
        if skip:
            return {"status": "skipped", "note": skip}
        if self.variant.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        opt = torch.optim.AdamW(model.parameters(), lr=self.lr)
        net = torch.compile(model, mode=self.variant.compile) if self.variant.compile else model
        step = TrainStep(net, make_loss(self.loss), opt, prec)
        graphs = self.variant.compile == "reduce-overhead" and dev.type == "cuda"

        def run() -> torch.Tensor:
            if graphs:
                torch.compiler.cudagraph_mark_step_begin()
            return step(x, y)

        self._run = run
        self._busy = nvml_busy_reader(dev)
        self._rng = torch_rng_state(dev)  # right after the seeded init: the same for every variant
        with self._own_rng():
            watch = Stopwatch(dev)
            watch.start()
            self._loss = self._run()
            first = watch.stop()
            for _ in range(self.warmup - 1):
                self._loss = self._run()
            state = [v for s in opt.state.values() for v in s.values()
                     if isinstance(v, torch.Tensor)]
            held = (*model.parameters(), *model.buffers(), *state, x, y)
            mem = sum(t.numel() * t.element_size() for t in held) + self._step_rise()
        # dropout draws its masks in memory order: under channels_last other masks than NCHW's,
        # so its loss cannot be compared step for step
        dropout = any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0
                      for m in model.modules())
        return {"status": "ok", "note": said, "first_step_s": first, "mem_bytes": mem,
                "loss": float(self._loss), "other_masks": nhwc and dropout}

    def _window(self, steps: int) -> dict:
        """Time ``steps`` training steps: ``{status, note, seconds, busy, loss}``."""
        watch, read = Stopwatch(self.device), self._busy
        busy = (MemorySampler(self.device, interval=0.05,
                              probes=[("nvml busy", lambda: {"gpu_util": read()})])
                if read else contextlib.nullcontext())
        with self._own_rng(), busy:
            watch.start()
            for _ in range(steps):
                self._loss = self._run()
            seconds = watch.stop()
        util = busy.series().values.get("gpu_util", []) if read else []
        return {"status": "ok", "note": "", "seconds": seconds,
                "busy": [v for v in util if v == v], "loss": float(self._loss)}

    def _step_rise(self) -> float:
        """The peak working memory of one (untimed) step above what was allocated before it:
        exact on CUDA, sampled from the host heap (or MPS allocator) elsewhere."""
        dev = self.device
        if dev.type == "cuda":
            synchronize(dev)
            base = torch.cuda.memory_allocated(dev)
            reset_peak(dev)
            self._loss = self._run()
            synchronize(dev)
            return max((peak_bytes(dev) or base) - base, 0)
        read = torch.mps.current_allocated_memory if dev.type == "mps" else heap_reader()[0]
        with MemorySampler(dev, interval=0.002, probes=[("step", lambda: {"heap": read()})]
                           ) as sampler:
            self._loss = self._run()
            synchronize(dev)
        series = sampler.series().values.get("heap", [])
        peak = sampler.series().peaks.get("heap")
        return max(peak - series[0], 0.0) if series and peak is not None else math.nan

    @contextlib.contextmanager
    def _own_rng(self) -> Iterator[None]:
        """The variant's own random stream while it has its turn: in one process its dropout
        masks would otherwise depend on the others' steps (the loss comparison would measure
        mask noise). Swapped outside the timed window."""
        outside = torch_rng_state(self.device)
        set_torch_rng_state(self._rng, self.device)
        try:
            yield
        finally:
            self._rng = torch_rng_state(self.device)
            set_torch_rng_state(outside, self.device)


@contextlib.contextmanager
def variant_settings(variant: Variant, device: torch.device) -> Iterator[None]:
    """Settings a variant's steps run under, scoped to its own calls: bf16 on the CPU with oneDNN
    off (``CPU_BF16_NOTE``). Under compile: a raised recompile limit (each variant compiles a
    fresh model; the limit would fall back to eager silently), ``fallback_random`` (the same
    dropout masks as eager, so the loss compares), and on the CPU no inductor layout optimisation
    (it crashes oneDNN on EEGNeX under bf16 autocast)."""
    with contextlib.ExitStack() as stack:
        if device.type == "cpu" and variant.precision == "bf16":
            stack.enter_context(warnings.catch_warnings())
            # torch's flags() also sets oneDNN's TF32 switch, which warns on every CPU
            warnings.filterwarnings("ignore", message="TF32 acceleration on top of oneDNN")
            stack.enter_context(torch.backends.mkldnn.flags(enabled=False))
        if variant.compile:
            from torch._dynamo import config as dyn
            from torch._inductor import config as inductor_config

            key = "recompile_limit" if hasattr(dyn, "recompile_limit") else "cache_size_limit"
            stack.enter_context(dyn.patch(**{key: max(getattr(dyn, key), 64)}))
            settings = {"fallback_random": True}
            if device.type == "cpu":
                settings["layout_optimization"] = False
            stack.enter_context(inductor_config.patch(**settings))
        yield
