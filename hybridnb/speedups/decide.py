"""Which speedups a run gets: ``wanted`` (the Trainer's setting) and ``apply_speedups`` (the
decision on the model's own first batch). Each knob is a rule about layers or devices, never a
model's name: ``rewrite`` (depthwise.py), ``span`` (span.py), ``chain`` and ``rows`` (CPU only;
chain.py, rows.py), ``channels_last`` (NHWC parameters and inputs), ``cudnn_benchmark`` (CUDA,
fixed shapes; put back by ``Applied.restore_globals()``) and ``precision`` (only when "auto").

On CUDA (and with ``mode="measure"`` anywhere) a knob is kept only where timed steps on the first
batch say it is ``MARGIN`` faster (``trial.race``; greedy: channels_last, span, the rewrite,
then precision), within ``BUDGET_S``.

On the CPU, where a step costs seconds, span and chain apply by rule (checked exact on a slice);
channels_last, with rows beside it, where a grouped ``(H, 1)`` convolution could gain and a
paired trial of whole steps on the run's batch measures it ``CL_MARGIN`` faster (none in a short
run); no depthwise rewrite in fp32; bf16 only after a bounded, memory-capped trial where the CPU
has it in hardware, ``MIN_TRIAL_CORES`` cores and the run ``MIN_TRIAL_STEPS`` steps. No
``torch.compile``: it never pays back its compile time on a CPU run of this size. channels_last
makes dropout draw other (equally likely) masks for the same seed; a run and its resume use the
same layout. Measurements: ``bench/results/zoo-speed-cpu-latest.md``, ``gpu-latest.md``.

Weights, BatchNorm statistics, gradients and random-number streams are as they were after any
measuring. ``mode="all"`` applies every applicable knob unmeasured, ``"off"`` nothing;
``Applied.undo()`` takes everything back.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable

import torch
from torch import nn

from hybridnb.hardware.host import NATIVE_BF16_FLAGS, cpu_flags, usable_cores
from hybridnb.speedups import exact, replace, trial
from hybridnb.speedups.applied import Applied
from hybridnb.speedups.chain import CHAIN
from hybridnb.speedups.depthwise import DEPTHWISE
from hybridnb.speedups.rewrite import Rewrite
from hybridnb.speedups.rows import ROWS
from hybridnb.speedups.span import SPAN

KNOBS = ("rewrite", "span", "chain", "rows", "channels_last", "cudnn_benchmark", "precision")
MODES = ("auto", "measure", "all", "off")
PRECISIONS = ("auto", "bf16", "fp16", "fp32")
AUTO_DEVICES = ("cuda", "cpu")  # where speedups="auto" applies speedups
MARGIN = {"cuda": 0.03, "cpu": 0.10}  # a knob must win by this share; other devices: cuda's
BUDGET_S = {"cuda": 2.0, "cpu": 1.0}  # seconds for the whole decision, warm-up steps included
MEASURE_BUDGET_S = 8.0  # mode="measure" on the CPU: every knob timed
CPU_SLICE = 4  # samples of the example batch timed on the CPU
MIN_TRIAL_STEPS = 50  # a 1 s trial won by 10% on a >= 0.2 s step pays back within 50 steps
CL_MARGIN = 0.05  # channels_last on the CPU: kept when its paired median is this share faster
CL_TRIAL_S = 30.0  # seconds its trial may take at most (less in a short run: trial.RUN_SHARE)
MIN_TRIAL_CORES = 8  # fewer cores: one first bf16 step alone can take the whole budget


def wanted(setting: bool | str | None, device: torch.device | str) -> bool:
    """Whether the Trainer's ``speedups`` setting asks for ``apply_speedups`` on ``device``."""
    if setting is None or isinstance(setting, bool):
        return bool(setting)
    if setting == "auto":
        return torch.device(device).type in AUTO_DEVICES
    raise ValueError(f"speedups={setting!r} is not understood; use True, False or \"auto\"")


def cpu_candidate(model: nn.Module) -> bool:
    """Whether any CPU knob could apply to ``model``, without a batch: the Trainer skips drawing
    an example batch from a slow Dataset when nothing could."""
    return has_grouped_conv2d(model) or SPAN.could_apply(model) or CHAIN.could_apply(model) or (
        cpu_native_bf16() and usable_cores()[0] >= MIN_TRIAL_CORES)  # else no bf16 trial could run


def has_grouped_conv2d(model: nn.Module) -> bool:
    """The CPU's channels_last candidates: a grouped ``(H, 1)`` 2-D convolution over several
    rows (EEGNeX's spatial filter), whose NCHW oneDNN path is slow. Grouped kernels along the
    width do not count: ATCNet's ``(1, 129)`` one ran 0.53x in channels_last."""
    return any(map(_grouped_rows, replace.originals(model)))


def _grouped_rows(module: nn.Module) -> bool:
    return (isinstance(module, nn.Conv2d) and module.groups > 1 and module.kernel_size[1] == 1
            and module.kernel_size[0] >= 2)


def cpu_native_bf16() -> bool:
    """True when this CPU computes bf16 in hardware (AMX or AVX-512 BF16 in /proc/cpuinfo)."""
    return bool(cpu_flags() & NATIVE_BF16_FLAGS)


def precision_name(precision, device: torch.device) -> str:
    """The precision a run uses for ``precision`` (a name or a decided ``Precision``): "auto" is
    bf16 or fp16 on CUDA by hardware, fp32 elsewhere; fp16 on a CPU is bf16."""
    name = getattr(precision, "name", precision)
    if name not in PRECISIONS:
        raise ValueError(f"apply_speedups: precision={name!r} is not one of {PRECISIONS}")
    if name == "auto":
        if device.type != "cuda":
            return "fp32"
        from hybridnb.hardware.rules import device_native_bf16

        return "bf16" if device_native_bf16(device) else "fp16"
    return "bf16" if name == "fp16" and device.type == "cpu" else name


def apply_speedups(model: nn.Module, example_x, device: torch.device | str,
                   precision="auto", mode: str = "auto", knobs: Iterable[str] | None = None,
                   budget_s: float | None = None, steps: int | None = None) -> Applied:
    """Apply the speed knobs that help ``model`` (already on ``device``). ``example_x``: one
    batch's input (a tensor, or a tuple of the model's positional inputs). ``precision``: a name
    ("auto" lets the trials change it) or the run's decided ``Precision``. ``budget_s``: seconds
    for the timed decisions but the CPU's channels_last trial. ``steps``: the run's expected
    optimizer steps, when known: a short CPU run gets no timed trial."""
    if mode not in MODES:
        raise ValueError(f"apply_speedups: mode={mode!r} is not one of {MODES}")
    chosen = set(KNOBS if knobs is None else knobs)
    unknown = chosen - set(KNOBS)
    if unknown:
        raise ValueError(f"apply_speedups: knobs {sorted(unknown)} unknown; choose from {KNOBS}")
    device = torch.device(device)
    prec = precision_name(precision, device)
    auto = getattr(precision, "name", None) is None and precision == "auto"
    applied = Applied(device=str(device), precision=prec, mode=mode)
    if mode == "off":
        return applied
    t0 = time.perf_counter()
    inputs = full = _on_device(example_x, model, device)
    if device.type == "cpu":  # a CPU step costs seconds: check (and time bf16) on a slice
        inputs = exact.first_samples(inputs, CPU_SLICE)
    if device.type == "cuda" and "cudnn_benchmark" in chosen:
        use_cudnn_benchmark(applied)
    if device.type == "cpu" and mode == "auto":
        _cpu_auto(model, inputs, full, device, prec, auto, chosen, applied, steps,
                  BUDGET_S["cpu"] if budget_s is None else budget_s)
        applied.seconds = time.perf_counter() - t0
        return applied
    toggles = {}  # raced in this order: channels_last measured the larger gain on both devices
    if "channels_last" in chosen:
        toggles["channels_last"] = _channels_last_toggle(model, applied)
    if "span" in chosen:
        toggles["span"] = _layer_toggle(SPAN, model, inputs, applied)
    if "rewrite" in chosen:
        toggles["rewrite"] = _layer_toggle(DEPTHWISE, model, inputs, applied)
    toggles = {k: t for k, t in toggles.items() if t is not None}
    measure_precision = "precision" in chosen and device.type == "cuda" and auto and prec != "fp32"
    if mode == "all":
        for knob, toggle in sorted(toggles.items(), key=lambda kv: KNOBS.index(kv[0])):
            toggle(True)
            applied.applied.append(knob)
    elif toggles or measure_precision:
        default = MEASURE_BUDGET_S if device.type == "cpu" else BUDGET_S["cuda"]
        _measure(model, inputs, device, prec, toggles, measure_precision, applied,
                 default if budget_s is None else budget_s)
    applied.seconds = time.perf_counter() - t0
    return applied


def _cpu_auto(model, inputs, full, device, prec: str, auto: bool, chosen, applied: Applied,
              steps, budget: float) -> None:
    """The CPU's decision (see the module docstring); ``full``: the run's whole batch."""
    if "span" in chosen:
        _by_rule(SPAN, model, inputs, applied)
    if "chain" in chosen:  # before rows: the rows rewrite takes the (1, K) convolutions left
        _by_rule(CHAIN, model, inputs, applied)
    if "channels_last" in chosen:
        _cpu_channels_last(model, inputs, full, device, prec, "rows" in chosen, applied, steps)
    if "rows" in chosen and "channels_last" not in applied.applied:
        # the folded form pays only beside channels_last: alone, TIDNet, TSception and
        # EEGConformer ran 0.75-0.84x (1 thread, issue 34)
        applied.skipped["rows"] = "only beside channels_last (the CPU's rule)"
    if "precision" in chosen and auto and prec == "fp32":
        _cpu_bf16(model, inputs, device, prec, "rewrite" in chosen, applied, steps,
                  deadline=time.perf_counter() + budget)
    if "rewrite" in chosen and "rewrite" not in applied.applied:
        applied.skipped.setdefault("rewrite", "not used in fp32 on the CPU (EEGNeX measured 0.95x)")


def _cpu_channels_last(model, inputs, full, device, prec: str, rows: bool, applied: Applied,
                       steps) -> None:
    """channels_last with rows beside it, by a paired trial on the run's batch where
    ``_could_gain``. A rule alone could not tell a wash from a gain (CTNet measured 0.96-1.05x at
    batch 64, EEGNet 1.4x); a slice of four samples misleads (EEGITNet 0.75x on 4, 1.5x on 64)."""
    if not has_grouped_conv2d(model):
        applied.skipped["channels_last"] = "no grouped (H, 1) 2-D convolution (the CPU's rule)"
        return
    if not _could_gain(model, inputs):
        applied.skipped["channels_last"] = ("no grouped (H, 1) 2-D convolution on the input or "
                                            "spanning the height of a 2-D convolution's output, "
                                            "unconcatenated (the CPU's rule)")
        return
    toggle = _channels_last_toggle(model, applied)  # not None: a grouped Conv2d is there
    fold = _layer_toggle(ROWS, model, inputs, applied) if rows else None

    def candidate(on: bool) -> None:
        toggle(on)
        if fold is not None:
            fold(on)

    with trial.state_kept(model, device):
        try:
            ratios = trial.paired(
                lambda on: trial.timed_step(candidate, on, model, full, device, prec), CL_TRIAL_S,
                steps)
        except Exception as exc:  # noqa: BLE001 — a layout whose step fails is not kept
            ratios = f"its timed step failed ({type(exc).__name__}: {str(exc)[:80]})"
    gain = ratios if isinstance(ratios, str) else statistics.median(ratios)
    keep = _judged(applied, "channels_last", gain, CL_MARGIN)
    candidate(keep)
    if not keep:
        return
    applied.rules["channels_last"] = (f"a grouped (H, 1) convolution; {len(ratios)} paired "
                                      f"rounds, >= {1 + CL_MARGIN:g}x")
    if fold is not None and applied.modules.get("rows"):
        applied.applied.append("rows")
        applied.rules["rows"] = "beside channels_last"


def _could_gain(model, inputs) -> bool:
    """Whether a grouped ``(H, 1)`` convolution reads the model's input, or spans the whole
    height of the output of the module run just before it, after a plain 2-D convolution (hooks
    on one eval forward). It keeps out untimed: a grouped (16, 1) filter along time (EEGTCNet)
    ran 0.4x, one over functional filters' output (SincShallowNet) 0.5x, over a concatenation
    of branches (TCFormer) 0.42x."""
    state = {"conv": False, "keep": False, "channels": None}
    given = {a.data_ptr() for a in inputs if isinstance(a, torch.Tensor)}

    def ran(conv: bool, output) -> None:
        state["conv"] |= conv
        if isinstance(output, torch.Tensor) and output.dim() == 4:
            state["channels"] = output.shape[1]

    def grouped_in(module, args):
        x = args[0] if args else None
        state["keep"] |= isinstance(x, torch.Tensor) and x.dim() == 4 and (
            x.data_ptr() in given or (state["conv"] and x.shape[2] == module.kernel_size[0]
                                      and x.shape[1] == state["channels"]))

    hooks = []
    for name, m in model.named_modules():  # a replacement shares its original's hooks
        m = m.original if isinstance(m, replace.Replacement) else m
        if _grouped_rows(m):
            hooks.append(m.register_forward_pre_hook(grouped_in))
        layer = isinstance(m, nn.Conv2d) or not any(True for _ in m.children())
        if layer and "parametrizations" not in name.split("."):  # a weight's parametrization
            conv = isinstance(m, nn.Conv2d) and m.groups == 1  # is no layer
            hooks.append(m.register_forward_hook(
                lambda module, args, output, conv=conv: ran(conv, output)))
    exact.eval_output(model, inputs, hooks)
    return state["keep"]


def _by_rule(rewrite: Rewrite, model, inputs, applied: Applied) -> None:
    """``rewrite`` applied by its rule, kept only where it computes the same on the batch."""
    toggle = _layer_toggle(rewrite, model, inputs, applied)
    if toggle is not None:
        toggle(True)
        applied.applied.append(rewrite.name)
        applied.rules[rewrite.name] = rewrite.rule


def _cpu_bf16(model, inputs, device, prec: str, with_rewrite: bool, applied: Applied, steps,
              deadline: float) -> None:
    """bf16 autocast (plus the rewrite where it applies) raced against fp32 until ``deadline``."""
    why, (cores, fewer) = None, usable_cores()
    if not cpu_native_bf16():
        why = "no bf16 in this CPU's hardware (AMX / AVX-512 BF16): bf16 not tried"
    elif cores < MIN_TRIAL_CORES:
        why = (f"{cores} cores" + (f" ({fewer})" if fewer else "") + ": a bf16 trial cannot "
               f"fit the {BUDGET_S['cpu']:.0f} s budget, bf16 not tried")
    elif steps is not None and steps < MIN_TRIAL_STEPS:
        why = f"a short run ({steps} steps): bf16 not tried"
    elif not trial.can_cap_memory():
        why = "no address-space cap on this system: bf16 not tried"
    if why:
        applied.skipped["precision"] = why
        return
    rewrite = None

    def use_bf16(on: bool) -> str:
        if rewrite is not None:
            rewrite(on)
        return "bf16" if on else prec

    with trial.state_kept(model, device):
        # one fp32 step first: it primes oneDNN and says whether a race can fit what is left
        first = trial.timed_step(lambda on: None, False, model, inputs, device, prec)
        left = deadline - time.perf_counter()
        if 4 * first > left:  # the bf16 side's first step, then one timed round of each
            applied.skipped["precision"] = (f"bf16 not measured: a first step takes {first:.2g} s "
                                            f"here, {max(left, 0):.2g} s of the budget left")
            return
        rewrite = _layer_toggle(DEPTHWISE, model, inputs, applied) if with_rewrite else None
        with trial.memory_cap():
            gain = trial.race(use_bf16, model, inputs, device, prec,
                              deadline - time.perf_counter(), min_rounds=1)
    keep = _judged(applied, "precision", gain, MARGIN["cpu"], "bf16 ")
    use_bf16(keep)
    if keep:
        applied.precision = "bf16"
        if rewrite is not None:
            applied.applied.append("rewrite")


def _measure(model, inputs, device, prec: str, toggles, measure_precision: bool,
             applied: Applied, budget: float) -> None:
    """Greedy, interleaved: each knob on top of what was kept; restore the model's state after."""
    margin = MARGIN.get(device.type, MARGIN["cuda"])
    share = budget / max(len(toggles) + int(measure_precision), 1)
    with trial.state_kept(model, device):
        for knob, toggle in toggles.items():
            gain = trial.race(toggle, model, inputs, device, prec, share)
            toggle(_judged(applied, knob, gain, margin))
            if isinstance(gain, str) and gain.startswith("not measured"):  # nor would the rest
                for other in list(toggles)[list(toggles).index(knob) + 1:]:
                    applied.skipped[other] = gain
                measure_precision = False
                break
        if measure_precision:
            gain = trial.race(lambda on: "fp32" if on else prec, model, inputs, device, prec, share)
            if _judged(applied, "precision", gain, margin, "fp32 "):
                applied.precision = "fp32"


def _judged(applied: Applied, knob: str, gain: float | str, margin: float, what: str = "") -> bool:
    """A trial's gain (or why none) recorded; True, the knob applied, when it won by ``margin``."""
    if isinstance(gain, str):
        applied.skipped[knob] = what + gain
        return False
    applied.speedup[knob] = gain
    if gain < 1 + margin:
        applied.skipped[knob] = f"{what}measured {gain:.2f}x here, not faster"
        return False
    applied.applied.append(knob)
    return True


def _layer_toggle(rewrite: Rewrite, model, inputs, applied: Applied):
    """``rewrite`` applied (checked), then switched off: a toggle between its replacements
    (True) and the originals, or None, the reason recorded, when nothing is rewritten."""
    report = rewrite.apply(model, *inputs)
    if report.note:
        applied.notes.append(report.note)
    if not report:
        applied.skipped[rewrite.name] = report.note or (
            "already rewritten" if rewrite.active(model) else rewrite.none_found)
        return None
    fast = replace.replaced(model, rewrite.kind)
    groups = list(report.rewritten)  # a chain's as "a>bn>b"

    def toggle(on: bool) -> None:
        for n in (n for group in groups for n in group.split(">")):
            replace.put(model, n, fast[n] if on else fast[n].original)
        applied.modules[rewrite.name] = list(groups) if on else []

    toggle(False)
    applied.undoers.append(lambda: toggle(False))
    return toggle


def _channels_last_toggle(model: nn.Module, applied: Applied):
    if not any(isinstance(m, nn.Conv2d) for m in replace.originals(model)):
        applied.skipped["channels_last"] = "no 2-D convolution"
        return None
    hooks = []

    def toggle(on: bool) -> None:
        model.to(memory_format=torch.channels_last if on else torch.contiguous_format)
        if on and not hooks:
            hooks.append(model.register_forward_pre_hook(_inputs_channels_last))
        while hooks and not on:
            hooks.pop().remove()

    applied.undoers.append(lambda: toggle(False))
    return toggle


def _inputs_channels_last(module: nn.Module, args: tuple):
    return tuple(a.contiguous(memory_format=torch.channels_last)
                 if isinstance(a, torch.Tensor) and a.dim() == 4 else a for a in args)


def use_cudnn_benchmark(applied: Applied) -> None:
    """The ``cudnn_benchmark`` knob, put back by ``applied.restore_globals()``."""
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    applied.applied.append("cudnn_benchmark")
    applied.global_restores.append(lambda: setattr(torch.backends.cudnn, "benchmark", before))


def _on_device(x, model: nn.Module, device: torch.device) -> tuple:
    items = tuple(x) if isinstance(x, (tuple, list)) else (x,)
    if not items or not isinstance(items[0], torch.Tensor):
        raise TypeError(f"apply_speedups: example_x must be a tensor or a tuple of the model's "
                        f"inputs starting with a tensor, got {type(x).__name__}")
    param = next(model.parameters(), None)
    if param is not None and param.device.type != device.type:
        raise ValueError(f"apply_speedups: the model is on {param.device} but device={device}; "
                         f"move it first (model.to(device))")
    return tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in items)
