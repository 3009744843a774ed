"""Speed knobs chosen by measurement on the model's own first batch: ``apply_speedups``.

The knobs (each a rule about layers or devices, never about a model's name):

- ``rewrite``: height-spanning depthwise convolutions as a batched matmul (``train/rewrite.py``);
  exact, checked on the batch. On an H100 it took EEGNeX (bf16) from 1,945 to 3,849 samples/s.
- ``channels_last``: 4-D parameters and 4-D inputs in NHWC, for models with 2-D convolutions.
  cuDNN's depthwise and many 2-D kernels prefer it: EEGNeX bf16 1,945 -> 4,885 samples/s (H100).
- ``cudnn_benchmark``: cuDNN tries its algorithms once per input shape and keeps the fastest;
  right when shapes are fixed (``fixed_shapes=True``), wasteful when every batch differs. CUDA only;
  not measured (its cost is the first step of each shape).
- ``precision``: when ``precision="auto"`` on CUDA, the low precision detect() would pick is
  timed against fp32 and the faster kept (bf16 was 0.93x fp32 for ShallowFBCSPNet on an H100).

``mode="auto"`` keeps a knob only where a few timed forward+backward steps on the first batch say
it is faster (greedy: rewrite, then channels_last on top, then precision; interleaved A B A B, the
fastest step of each counted, a knob kept only when at least ``MARGIN`` faster). The model's
weights, BatchNorm statistics, gradients and random-number streams are as they were afterwards.
``mode="all"`` applies every applicable knob without measuring (what ``compare()``'s variants use);
``mode="off"`` applies nothing. ``Applied.undo()`` takes everything back; nothing needs undoing to
save: the rewrite keeps parameters and state_dict keys, so weights, checkpoints and whole-model
files load into the unmodified model.

On the CPU the same measurement runs on a slice of the batch (``CPU_SLICE`` samples), because a
step there costs seconds, and only when two rounds fit the budget (else the model stays as it is
and the message says so). Measured on this project's 2-core Intel Xeon (EEGNeX, fp32, batch 16,
forward + backward + AdamW, 4 interleaved rounds, other jobs sharing the cores; bench/bench_gpu.py):
channels_last 1.69x stock (fastest round; 2.27x by the median), the rewrite 0.95x (0.95x), both
1.20x (1.50x); an earlier, busier run gave 1.45x, 0.86x and 1.02x. ``auto`` kept channels_last
(1.65x on its 4-sample slice) and dropped the rewrite (0.96x), in 9.1 s: on a CPU the rewrite is
normally not kept, channels_last is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from hybridnb.measure.timing import synchronize
from hybridnb.train import rewrite as _rewrite
from hybridnb.train.precision import Precision
from hybridnb.train.recovery import free_memory
from hybridnb.train.seeding import set_torch_rng_state, torch_rng_state
from hybridnb.train.step import measure_pass

KNOBS = ("rewrite", "channels_last", "cudnn_benchmark", "precision")
MODES = ("auto", "all", "off")
MARGIN = {"cuda": 0.03, "cpu": 0.10}  # a knob must win by this share; other devices: cuda's
BUDGET_S = {"cuda": 2.0, "cpu": 8.0}  # seconds for all races, warm-up steps included
CPU_SLICE = 4  # samples of the example batch timed on the CPU


@dataclass
class Applied:
    """What ``apply_speedups`` applied and measured.

    ``applied``: knob names in effect (``"rewrite"``, ``"channels_last"``, ``"cudnn_benchmark"``,
    ``"precision"`` when it changed the choice). ``speedup``: knob -> measured gain (x) where it
    was measured, kept or not. ``skipped``: knob -> why it is not in effect. ``precision``: the
    precision name to train with. ``rewritten``: module names running the matmul form.
    ``seconds``: time spent, checks and measuring included. ``message``: one sentence for the
    run's log; ``notes``: sentences that must be shown (a rewrite that failed its check).
    """

    device: str
    precision: str
    mode: str
    applied: list[str] = field(default_factory=list)
    speedup: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    rewritten: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    _undo: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def __bool__(self) -> bool:
        return bool(self.applied)

    @property
    def message(self) -> str:
        """One sentence: what was applied, with the measured gains, and what it cost."""
        if self.mode == "off":
            return "speedups off"
        parts = []
        for knob in self.applied:
            gain = self.speedup.get(knob)
            label = {"rewrite": f"depthwise-as-matmul ({', '.join(self.rewritten)})",
                     "precision": f"precision {self.precision}"}.get(knob, knob)
            parts.append(f"{label} {gain:.2f}x" if gain else label)
        losers = [f"{k} {v:.2f}x" for k, v in self.speedup.items() if k not in self.applied]
        unmeasured = sorted({v for k, v in self.skipped.items()
                             if k not in self.speedup and k != "precision"})
        text = f"speedups on {self.device}: " + (", ".join(parts) if parts else "none applied")
        if losers:
            text += f" (not kept: {', '.join(losers)})"
        if unmeasured:
            text += f" ({'; '.join(unmeasured)})"
        how = ("set" if self.mode == "all" else "measured" if self.speedup else "checked")
        return text + f"; {how} in {self.seconds:.1f} s on the first batch"

    def undo(self) -> None:
        """Take back every knob (the model's layout and classes, the cuDNN flag)."""
        while self._undo:
            self._undo.pop()()
        self.applied.clear()
        self.rewritten = []


def apply_speedups(model: nn.Module, example_x, device: torch.device | str,
                   precision: str | Precision = "auto", mode: str = "auto",
                   knobs: Iterable[str] | None = None, fixed_shapes: bool = True,
                   budget_s: float | None = None) -> Applied:
    """Apply the speed knobs that help ``model`` on ``device``; see the module docstring.

    ``model`` must already be on ``device``. ``example_x``: one batch's input (a tensor, or a
    tuple/list of the model's positional inputs). ``precision``: a Precision, a name, or "auto"
    (on CUDA: measured). ``knobs``: a subset of ``KNOBS`` to consider (default all).
    """
    if mode not in MODES:
        raise ValueError(f"apply_speedups: mode={mode!r} is not one of {MODES}")
    chosen = set(KNOBS if knobs is None else knobs)
    unknown = chosen - set(KNOBS)
    if unknown:
        raise ValueError(f"apply_speedups: knobs {sorted(unknown)} unknown; choose from {KNOBS}")
    device = torch.device(device)
    prec = precision if isinstance(precision, Precision) else Precision.choose(precision, device)
    applied = Applied(device=str(device), precision=prec.name, mode=mode)
    if mode == "off":
        return applied
    t0 = time.perf_counter()
    inputs = _on_device(example_x, device)
    _check_device(model, device)
    if device.type == "cpu":  # a CPU step costs seconds: check and time a slice of the batch
        inputs = _slice(inputs, CPU_SLICE)
    if device.type == "cuda" and "cudnn_benchmark" in chosen:
        _cudnn_benchmark(applied, fixed_shapes)
    toggles = {}  # raced in this order: channels_last measured the larger gain on both devices
    if "channels_last" in chosen:
        toggles["channels_last"] = _channels_last_toggle(model, applied)
    if "rewrite" in chosen:
        toggles["rewrite"] = _rewrite_toggle(model, inputs, applied)
    toggles = {k: t for k, t in toggles.items() if t is not None}
    measure_precision = ("precision" in chosen and device.type == "cuda" and mode == "auto"
                         and not isinstance(precision, Precision) and precision == "auto"
                         and prec.name != "fp32")
    if mode == "all":
        for knob, toggle in sorted(toggles.items(), key=lambda kv: KNOBS.index(kv[0])):
            toggle(True)
            applied.applied.append(knob)
    elif toggles or measure_precision:
        _measure(model, inputs, device, prec, toggles, measure_precision, applied,
                 BUDGET_S.get(device.type, BUDGET_S["cuda"]) if budget_s is None else budget_s)
    applied.seconds = time.perf_counter() - t0
    return applied


def _measure(model, inputs, device, prec, toggles, measure_precision, applied, budget) -> None:
    """Greedy, interleaved: each knob on top of what was kept; restore the model's state after."""
    margin = MARGIN.get(device.type, MARGIN["cuda"])
    timed = inputs
    share = budget / max(len(toggles) + int(measure_precision), 1)
    saved = _Snapshot(model, device)
    try:
        for knob, toggle in toggles.items():
            gain = _race(lambda on, t=toggle: t(on), model, timed, device, prec, share)
            if isinstance(gain, str):
                applied.skipped[knob] = gain
                toggle(False)
                if gain.startswith("not measured"):  # the other knobs would not be either
                    for other in list(toggles)[list(toggles).index(knob) + 1:]:
                        applied.skipped[other] = gain
                    measure_precision = False
                    break
                continue
            applied.speedup[knob] = gain
            keep = gain >= 1 + margin
            toggle(keep)
            if keep:
                applied.applied.append(knob)
            else:
                applied.skipped[knob] = f"measured {gain:.2f}x here, not faster"
        if measure_precision:
            low, fp32 = prec, Precision("fp32", device)
            holder = {"p": low}

            def use_fp32(on: bool) -> None:
                holder["p"] = fp32 if on else low

            gain = _race(use_fp32, model, timed, device, holder, share)
            if isinstance(gain, str):
                applied.skipped["precision"] = gain
            elif gain >= 1 + margin:
                applied.precision = "fp32"
                applied.applied.append("precision")
                applied.speedup["precision"] = gain
            else:
                applied.skipped["precision"] = (f"fp32 measured {gain:.2f}x {low.name}; "
                                                f"{low.name} kept")
    finally:
        saved.restore()


def _race(toggle, model, inputs, device, prec, budget) -> float | str:
    """Time one step with the knob off and on, interleaved, for about ``budget`` s.

    Each state runs once untimed first (allocation, cuDNN autotuning, layout conversion). On the
    CPU a race whose warm-up step shows it cannot fit two rounds in the budget is not run.
    Returns the gain (off time / on time, fastest step of each), or why it was not measured.
    """
    times = {False: [], True: []}
    min_rounds = 2 if device.type == "cpu" else 1
    t_end = time.perf_counter() + budget  # warm-ups included
    try:
        for state in (False, True):
            warm = _timed_step(toggle, state, model, inputs, device, prec)
            if device.type == "cpu" and not state and (2 * min_rounds + 2) * warm > budget:
                toggle(False)
                return f"not measured: a step takes {warm:.2g} s here (budget {budget:.2g} s)"
        while (len(times[True]) < min_rounds or time.perf_counter() < t_end) \
                and len(times[True]) < 20:
            for state in (False, True):
                times[state].append(_timed_step(toggle, state, model, inputs, device, prec))
    except Exception as exc:  # noqa: BLE001 — a knob that breaks the step is simply not kept
        failed = f"its timed step failed ({type(exc).__name__}: {str(exc)[:80]})"
    else:
        return min(times[False]) / min(times[True])
    toggle(False)
    free_memory(device)  # outside the except: the failed step's tensors are free now
    return failed


def _timed_step(toggle, state: bool, model, inputs, device, prec) -> float:
    """Seconds for one step with the knob in ``state`` (synchronised before and after)."""
    toggle(state)
    synchronize(device)
    t0 = time.perf_counter()
    _step(model, inputs, _prec(prec))
    synchronize(device)
    return time.perf_counter() - t0


def _prec(prec) -> Precision:
    return prec["p"] if isinstance(prec, dict) else prec


def _step(model: nn.Module, inputs: tuple, prec: Precision) -> None:
    measure_pass(model, inputs, prec)
    for p in model.parameters():
        p.grad = None


def _rewrite_toggle(model, inputs, applied: Applied):
    report = _rewrite.rewrite_depthwise(model, *inputs)
    if report.note:
        applied.notes.append(report.note)
        applied.skipped["rewrite"] = report.note
        return None
    if not report:
        applied.skipped["rewrite"] = ("already rewritten" if _rewrite.rewritten_modules(model)
                                      else "no depthwise convolution spans its input's height")
        return None
    names = report.rewritten
    modules = dict(model.named_modules())
    stock = {n: type(modules[n])._hn_stock for n in names}
    fast = {n: type(modules[n]) for n in names}

    def toggle(on: bool) -> None:
        for n in names:
            modules[n].__class__ = fast[n] if on else stock[n]
        applied.rewritten = list(names) if on else []

    toggle(False)
    applied._undo.append(lambda: toggle(False))
    return toggle


def _channels_last_toggle(model: nn.Module, applied: Applied):
    if not any(isinstance(m, nn.Conv2d) for m in model.modules()):
        applied.skipped["channels_last"] = "no 2-D convolution"
        return None
    hook = {"handle": None}

    def toggle(on: bool) -> None:
        model.to(memory_format=torch.channels_last if on else torch.contiguous_format)
        if on and hook["handle"] is None:
            hook["handle"] = model.register_forward_pre_hook(_inputs_channels_last)
        elif not on and hook["handle"] is not None:
            hook["handle"].remove()
            hook["handle"] = None

    applied._undo.append(lambda: toggle(False))
    return toggle


def _inputs_channels_last(module: nn.Module, args: tuple):
    """Forward pre-hook: 4-D tensor inputs in channels_last (others untouched)."""
    if not any(isinstance(a, torch.Tensor) and a.dim() == 4 for a in args):
        return None
    return tuple(a.contiguous(memory_format=torch.channels_last)
                 if isinstance(a, torch.Tensor) and a.dim() == 4 else a for a in args)


def _cudnn_benchmark(applied: Applied, fixed_shapes: bool) -> None:
    if not fixed_shapes:
        applied.skipped["cudnn_benchmark"] = "input shapes vary"
        return
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    applied.applied.append("cudnn_benchmark")
    applied._undo.append(lambda: setattr(torch.backends.cudnn, "benchmark", before))


class _Snapshot:
    """Weights, buffers, gradients and RNG streams, put back after measuring."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.model, self.device = model, device
        self.state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.grads = [(p, None if p.grad is None else p.grad.detach().clone())
                      for p in model.parameters()]
        self.rng = torch_rng_state(device)
        for p in model.parameters():
            p.grad = None

    def restore(self) -> None:
        with torch.no_grad():
            current = self.model.state_dict()
            for k, v in self.state.items():
                current[k].copy_(v)
        for p, g in self.grads:
            p.grad = g
        set_torch_rng_state(self.rng, self.device)


def _on_device(x, device: torch.device) -> tuple:
    items = tuple(x) if isinstance(x, (tuple, list)) else (x,)
    if not items or not isinstance(items[0], torch.Tensor):
        raise TypeError(f"apply_speedups: example_x must be a tensor or a tuple of the model's "
                        f"inputs starting with a tensor, got {type(x).__name__}")
    return tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in items)


def _slice(inputs: tuple, n: int) -> tuple:
    return tuple(a[:n] if isinstance(a, torch.Tensor) and a.dim() else a for a in inputs)


def _check_device(model: nn.Module, device: torch.device) -> None:
    param = next(model.parameters(), None)
    if param is not None and param.device.type != device.type:
        raise ValueError(f"apply_speedups: the model is on {param.device} but device={device}; "
                         f"move it first (model.to(device))")
