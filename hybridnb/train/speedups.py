"""Speed knobs chosen for the model's own first batch: ``wanted`` and ``apply_speedups``.

The knobs (each a rule about layers or devices, never about a model's name):

- ``rewrite``: height-spanning depthwise convolutions as a batched matmul (``train/rewrite.py``);
  exact, checked on the batch. On an H100 it took EEGNeX (bf16) from 1,945 to 3,849 samples/s.
- ``chain`` (CPU only): ``Conv2d (1, k1) -> BatchNorm2d -> Conv2d (1, k2)`` with nothing in between
  computed as one ``(1, k1 + k2 - 1)`` convolution of the chain's input plus edge corrections
  (``train/rewrite_chain.py``); exact, checked on the batch in eval and training mode.
- ``rows`` (CPU only): temporal ``(1, K)`` convolutions over several rows as 1-D convolutions
  with the rows folded into the batch (``train/rewrite.py``); exact, checked on the batch.
- ``channels_last``: 4-D parameters and 4-D inputs in NHWC, for models with 2-D convolutions.
  cuDNN's depthwise and many 2-D kernels prefer it: EEGNeX bf16 1,945 -> 4,885 samples/s (H100).
- ``cudnn_benchmark``: a rule, not measured: cuDNN tries its algorithms once per input shape and
  keeps the fastest; on (CUDA only) when shapes are fixed (``fixed_shapes=True``), off when every
  batch differs (each new shape pays the search again). It is a process-wide flag:
  ``Applied.restore_globals()`` puts it back as it was (the Trainer calls it at the end of fit).
- ``precision``: when ``precision="auto"``: on CUDA the low precision detect() would pick is
  timed against fp32 and the faster kept (bf16 was 0.93x fp32 for ShallowFBCSPNet on an H100);
  on a CPU with bf16 in hardware, bf16 autocast is timed against fp32 (see below).

``mode="auto"`` on CUDA (and ``mode="measure"`` on any device) keeps a knob only where a few timed
forward+backward steps on the first batch say it is faster (greedy: rewrite, then channels_last
on top, then precision; interleaved A B A B, the fastest step of each counted, a knob kept only
when at least ``MARGIN`` faster). On a CPU that costs about 9 s (a step there costs seconds), so
``mode="auto"`` on the CPU decides in at most ``BUDGET_S["cpu"]`` (1 s) instead:

- channels_last by rule, for models with a grouped (e.g. depthwise) ``Conv2d``, whose NCHW
  oneDNN path is slow (measured on this project's shared 2-core AMD EPYC, fp32, batch 32,
  forward + backward + AdamW, bench/bench_cpu_speedups.py: EEGNeX 1.5-1.6x); not for plain
  convolutions (ShallowFBCSPNet 0.94x in a quiet run, 1.08x in a busy one). The same numbers,
  other random masks: dropout draws its mask in memory order, so under channels_last a seeded
  run with dropout follows another (equally likely) path than with ``speedups=False``; a run
  and its resume use the same layout and stay identical.
- the chain rewrite by rule, first, for every conv-BatchNorm-conv chain whose composite costs at
  most half the multiply-adds (``rewrite_chain.MAX_COST_SHARE``; checked exact on 2 samples of
  the batch: eval output, and a training step's output, gradients and statistics on copies):
  EEGNeX's blocks 1-2 go from ~16,900 to ~4,900 multiply-adds per (row, sample). EEGNeX (fp32,
  batch 32, forward + backward + AdamW, bench/bench_cpu_speedups.py, load 0.9-1.6): 2.24x the
  stock step with channels_last (rows + channels_last was 1.83-1.86x); through ``hn.Trainer``
  2.06x the stock hand-written loop, whole runs (was 1.57-1.60x).
- the rows rewrite by rule, for every ``(1, K)`` convolution left that sees more than one row on
  the first batch (checked exact there): oneDNN runs the folded 1-D form faster. EEGNeX (fp32,
  batch 32, forward + backward + AdamW, 4 interleaved rounds, load ~1.5, without the chain):
  channels_last alone 1.65x the stock step, with the rows rewrite 1.86x; ShallowFBCSPNet is
  untouched (its ``(1, 129)`` convolution runs inside braindecode's CombinedConv, never as a
  module call).
- the rewrite not in fp32 (EEGNeX: 0.95x NCHW, 0.62x on top of channels_last, where the einsum
  copies its input out of NHWC); it goes with bf16 only (next item).
- bf16 autocast only when ``precision="auto"``, the CPU has bf16 in hardware (``amx_bf16`` or
  ``avx512_bf16`` in /proc/cpuinfo; without them oneDNN emulates bf16, and EEGNeX asked it for
  ~880 GB on an Intel Xeon and the process was killed), the run is long enough to pay back the
  trial (``steps`` unknown or >= ``MIN_TRIAL_STEPS``), the CPU has ``MIN_TRIAL_CORES`` cores
  (on the shared 2-core EPYC one first EEGNeX step on 4 samples took 0.5-3 s, so no trial fits
  1 s there), AND a bounded trial on a slice of the batch (one fp32 step first: no trial unless
  four such steps fit what is left) measures it at least ``MARGIN["cpu"]`` faster than fp32. Even with those flags (AMD EPYC,
  avx512_bf16) a bf16 depthwise ``(129, 1)`` convolution in channels_last asks oneDNN for 110 GB,
  so the bf16 side of the trial runs with the rewrite where it applies (EEGNeX bf16 + rewrite +
  channels_last 1.15x fp32 channels_last at batch 32) and under an address-space cap (what the
  process holds plus the machine's available memory, Linux only; no cap possible, no trial), so
  a runaway allocation fails as an error and bf16 is simply not kept.
- no ``torch.compile``: on the 2-core CPU EEGNeX compiled in 38 s and then stepped 1.0x eager
  channels_last (0.97 s vs 0.95-1.09 s at batch 32), so it never pays back, and whether it would
  on another model is only known after paying the compile; ``Trainer(compile=True)`` remains.

The model's weights, BatchNorm statistics, gradients and random-number streams are as they were
after any measuring. ``mode="all"`` applies every applicable knob without measuring (what
``compare()``'s variants use); ``mode="off"`` applies nothing. ``Applied.undo()`` takes everything
back; nothing needs undoing to save: the rewrite keeps parameters and state_dict keys, so weights,
checkpoints and whole-model files load into the unmodified model.

On the CPU, timing runs on a slice of the batch (``CPU_SLICE`` samples), and only when the rounds
fit the budget (else the knob is not measured, not kept, and the message says so).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from hybridnb.hardware.host import cpu_flags
from hybridnb.measure.timing import synchronize
from hybridnb.train import rewrite as _rewrite
from hybridnb.train import rewrite_chain as _chain
from hybridnb.train.precision import Precision
from hybridnb.train.recovery import free_memory
from hybridnb.train.seeding import set_torch_rng_state, torch_rng_state
from hybridnb.train.step import measure_pass

KNOBS = ("rewrite", "chain", "rows", "channels_last", "cudnn_benchmark", "precision")
MODES = ("auto", "measure", "all", "off")
AUTO_DEVICES = ("cuda", "cpu")  # where speedups="auto" applies speedups
MARGIN = {"cuda": 0.03, "cpu": 0.10}  # a knob must win by this share; other devices: cuda's
BUDGET_S = {"cuda": 2.0, "cpu": 1.0}  # seconds for the whole decision, warm-up steps included
MEASURE_BUDGET_S = 8.0  # mode="measure" on the CPU: every knob timed (about 9 s for EEGNeX)
CPU_SLICE = 4  # samples of the example batch timed on the CPU
MIN_TRIAL_STEPS = 50  # a 1 s trial won by 10% on a >= 0.2 s step pays back within 50 steps
NATIVE_BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})
# fewer cores: EEGNeX's first 4-sample step alone took 0.5-3 s on the shared 2-core EPYC
MIN_TRIAL_CORES = 8


def wanted(setting: bool | str | None, device: torch.device | str) -> bool:
    """Whether the Trainer's ``speedups`` setting asks for ``apply_speedups`` on ``device``:
    True on any device, "auto" on CUDA and the CPU (``AUTO_DEVICES``), False/None never."""
    if setting is True:
        return True
    if setting is False or setting is None:
        return False
    if setting == "auto":
        return torch.device(device).type in AUTO_DEVICES
    raise ValueError(f"speedups={setting!r} is not understood; use True, False or \"auto\"")


def cpu_candidate(model: nn.Module) -> bool:
    """Whether any CPU knob could apply to ``model`` (the rows and channels_last rules, or a CPU
    with native bf16 and the cores for its trial), decided without a batch: the Trainer skips drawing an example batch from a
    slow Dataset when nothing could apply."""
    return has_grouped_conv2d(model) or has_rows_conv(model) or (
        cpu_native_bf16() and _cores() >= MIN_TRIAL_CORES)  # else no bf16 trial could run


def has_rows_conv(model: nn.Module) -> bool:
    """The rows rewrite's rule, before any batch: a ``(1, K)`` convolution it can compute."""
    return any(_rewrite.is_rows_candidate(m) for m in model.modules())


def has_grouped_conv2d(model: nn.Module) -> bool:
    """The CPU's channels_last rule: a grouped (e.g. depthwise) 2-D convolution (EEGNeX 1.6x;
    plain convolutions measured 0.94x on ShallowFBCSPNet)."""
    return any(isinstance(m, nn.Conv2d) and m.groups > 1 for m in model.modules())


def cpu_native_bf16() -> bool:
    """True when this CPU computes bf16 in hardware (AMX or AVX-512 BF16 in /proc/cpuinfo)."""
    return bool(cpu_flags() & NATIVE_BF16_FLAGS)


@dataclass
class Applied:
    """What ``apply_speedups`` applied and measured.

    ``applied``: knob names in effect (``"rewrite"``, ``"channels_last"``, ``"cudnn_benchmark"``,
    ``"precision"`` when it changed the choice). ``speedup``: knob -> measured gain (x) where it
    was measured, kept or not. ``skipped``: knob -> why it is not in effect. ``precision``: the
    precision name to train with. ``rewritten``: module names running the matmul form;
    ``fused``: the conv-BatchNorm-conv chains computed as one convolution ("a>bn>b" names);
    ``folded``: the modules running the rows-as-1-D form.
    ``rules``: knob -> the rule that applied it without measuring (the CPU's channels_last).
    ``seconds``: time spent, checks and measuring included. ``message``: one sentence for the
    run's log; ``notes``: sentences that must be shown (a rewrite that failed its check).
    ``restore_globals()``: process-wide flags back as they were (call it when the run ends).
    """

    device: str
    precision: str
    mode: str
    applied: list[str] = field(default_factory=list)
    speedup: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    rewritten: list[str] = field(default_factory=list)
    fused: list[str] = field(default_factory=list)
    folded: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    rules: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    _undo: list[Callable[[], None]] = field(default_factory=list, repr=False)
    _globals: list[Callable[[], None]] = field(default_factory=list, repr=False)

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
                     "chain": f"conv-BatchNorm-conv as one convolution ({', '.join(self.fused)})",
                     "rows": f"(1, K) convolutions as 1-D ({', '.join(self.folded)})",
                     "precision": f"precision {self.precision}"}.get(knob, knob)
            if knob in self.rules:
                label += f" (rule: {self.rules[knob]})"
            parts.append(f"{label} {gain:.2f}x" if gain else label)
        losers = [f"{k} {v:.2f}x" for k, v in self.speedup.items() if k not in self.applied]
        unmeasured = sorted({v for k, v in self.skipped.items()
                             if k not in self.speedup and k != "precision"})
        text = f"speedups on {self.device}: " + (", ".join(parts) if parts else "none applied")
        if losers:
            text += f" (not kept: {', '.join(losers)})"
        if unmeasured:
            text += f" ({'; '.join(unmeasured)})"
        how = ("set" if self.mode == "all" else "measured" if self.speedup
               else "decided by rule" if self.rules else "checked")
        return text + f"; {how} in {self.seconds:.1f} s on the first batch"

    def restore_globals(self) -> None:
        """Put every process-wide flag these speedups changed back as it was (the cuDNN
        autotuner); the model keeps its knobs. Safe to call twice."""
        while self._globals:
            self._globals.pop()()
        if "cudnn_benchmark" in self.applied:
            self.applied.remove("cudnn_benchmark")

    def undo(self) -> None:
        """Take back every knob (the model's layout and classes) and the process-wide flags."""
        while self._undo:
            self._undo.pop()()
        self.restore_globals()
        self.applied.clear()
        self.rewritten = []
        self.fused = []
        self.folded = []


def apply_speedups(model: nn.Module, example_x, device: torch.device | str,
                   precision: str | Precision = "auto", mode: str = "auto",
                   knobs: Iterable[str] | None = None, fixed_shapes: bool = True,
                   budget_s: float | None = None, steps: int | None = None) -> Applied:
    """Apply the speed knobs that help ``model`` on ``device``; see the module docstring.

    ``model`` must already be on ``device``. ``example_x``: one batch's input (a tensor, or a
    tuple/list of the model's positional inputs). ``precision``: a Precision, a name, or "auto"
    (measured: on CUDA the low precision against fp32, on a CPU with native bf16 bf16 against
    fp32). ``knobs``: a subset of ``KNOBS`` to consider (default all). ``budget_s``: seconds for
    the decision (default ``BUDGET_S``; ``MEASURE_BUDGET_S`` for mode="measure" on the CPU).
    ``steps``: the run's expected number of optimizer steps, when known: a CPU run shorter than
    ``MIN_TRIAL_STEPS`` gets the rules without a timed trial.
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
    if device.type == "cpu" and mode == "auto":
        budget = BUDGET_S["cpu"] if budget_s is None else budget_s
        _cpu_auto(model, inputs, device, prec, precision, chosen, applied, steps,
                  deadline=t0 + budget)
        applied.seconds = time.perf_counter() - t0
        return applied
    toggles = {}  # raced in this order: channels_last measured the larger gain on both devices
    if "channels_last" in chosen:
        toggles["channels_last"] = _channels_last_toggle(model, applied)
    if "rewrite" in chosen:
        toggles["rewrite"] = _rewrite_toggle(model, inputs, applied)
    toggles = {k: t for k, t in toggles.items() if t is not None}
    measure_precision = ("precision" in chosen and device.type == "cuda" and mode != "all"
                         and not isinstance(precision, Precision) and precision == "auto"
                         and prec.name != "fp32")
    if mode == "all":
        for knob, toggle in sorted(toggles.items(), key=lambda kv: KNOBS.index(kv[0])):
            toggle(True)
            applied.applied.append(knob)
    elif toggles or measure_precision:
        default = MEASURE_BUDGET_S if device.type == "cpu" else BUDGET_S.get(
            device.type, BUDGET_S["cuda"])
        _measure(model, inputs, device, prec, toggles, measure_precision, applied,
                 default if budget_s is None else budget_s)
    applied.seconds = time.perf_counter() - t0
    return applied


def _cpu_auto(model, inputs, device, prec, asked, chosen, applied, steps, deadline) -> None:
    """The CPU's decision within ``deadline``: the chain and rows rewrites and channels_last by
    rule (conv-BatchNorm-conv chains; ``(1, K)`` convolutions over rows; grouped Conv2d), bf16
    (+ rewrite) only where the CPU has it in hardware and a bounded, memory-capped trial says it
    is faster."""
    if "chain" in chosen:  # first: the rows rewrite then takes the (1, K) convolutions left
        _cpu_chain(model, inputs, applied)
    if "rows" in chosen:
        _cpu_rows(model, inputs, applied)
    if "channels_last" in chosen:
        if not has_grouped_conv2d(model):
            applied.skipped["channels_last"] = "no grouped 2-D convolution (the CPU's rule)"
        elif (toggle := _channels_last_toggle(model, applied)) is not None:
            toggle(True)
            applied.applied.append("channels_last")
            applied.rules["channels_last"] = "grouped 2-D convolutions"
    if "precision" in chosen and not isinstance(asked, Precision) and asked == "auto" \
            and prec.name == "fp32":
        _cpu_bf16(model, inputs, device, prec, "rewrite" in chosen, applied, steps, deadline)
    if "rewrite" in chosen and "rewrite" not in applied.applied \
            and "rewrite" not in applied.skipped:
        applied.skipped["rewrite"] = "not used in fp32 on the CPU (EEGNeX measured 0.95x)"


def _cpu_chain(model, inputs, applied: Applied) -> None:
    """The chain rewrite by rule, kept only where it computes the same on the example batch
    (eval output, and a training step's output, gradients and statistics on copies)."""
    report = _chain.rewrite_chain(model, *inputs)
    if not _kept(report, applied, "chain", bool(_chain.chained_modules(model)),
                 "no conv-BatchNorm-conv chain that one convolution computes with fewer "
                 "multiply-adds"):
        return
    applied.rules["chain"] = (f"conv-BatchNorm-conv with <= {_chain.MAX_COST_SHARE:g} of the "
                              "multiply-adds as one convolution")
    applied.fused = list(report.rewritten)
    names = [n for chain in report.rewritten for n in chain.split(">")]
    _undo_later(model, names, _chain._ChainForm, applied, "fused")


def _cpu_rows(model, inputs, applied: Applied) -> None:
    """The rows rewrite by rule, kept only where it computes the same on the example batch."""
    report = _rewrite.rewrite_rows(model, *inputs)
    if not _kept(report, applied, "rows", bool(_rewrite.rewritten_modules(model, "rows")),
                 "no (1, K) convolution over several rows"):
        return
    applied.rules["rows"] = "(1, K) convolutions over several rows"
    applied.folded = list(report.rewritten)
    _undo_later(model, report.rewritten, _rewrite._RowsAsConv1d, applied, "folded")


def _kept(report, applied: Applied, knob: str, already: bool, none_found: str) -> bool:
    """Record a rewrite's report under ``knob``: applied (True), or skipped and why."""
    if report.note:  # found, but not exact on the batch: said
        applied.notes.append(report.note)
        applied.skipped[knob] = report.note
        return False
    if not report:
        applied.skipped[knob] = "already rewritten" if already else none_found
        return False
    applied.applied.append(knob)
    return True


def _undo_later(model, names: list[str], form: type, applied: Applied, listed: str) -> None:
    """``applied.undo()`` gives the ``names`` modules still in ``form`` their stock class back
    and empties ``applied.<listed>``."""
    modules = dict(model.named_modules())
    names = list(names)

    def undo() -> None:
        for n in names:
            if isinstance(modules[n], form):
                modules[n]._hn_undo()
        setattr(applied, listed, [])

    applied._undo.append(undo)


def _cpu_bf16(model, inputs, device, prec, with_rewrite, applied, steps, deadline) -> None:
    """bf16 autocast (plus the rewrite where it applies) raced against fp32 until ``deadline``;
    kept when ``MARGIN["cpu"]`` faster. Never tried without bf16 in the CPU's hardware."""
    why = None
    if not cpu_native_bf16():
        why = "no bf16 in this CPU's hardware (AMX / AVX-512 BF16): bf16 not tried"
    elif _cores() < MIN_TRIAL_CORES:
        why = (f"{_cores()} cores: a bf16 trial cannot fit the {BUDGET_S['cpu']:.0f} s budget, "
               "bf16 not tried")
    elif steps is not None and steps < MIN_TRIAL_STEPS:
        why = f"a short run ({steps} steps): bf16 not tried"
    elif not _can_cap_memory():
        why = "no address-space cap on this system: bf16 not tried"
    if why:
        applied.skipped["precision"] = why
        return
    saved = _Snapshot(model, device)
    try:
        # one fp32 step first: it primes oneDNN and says whether a race can fit what is left
        first = _timed_step(lambda on: None, False, model, inputs, device, prec)
        left = deadline - time.perf_counter()
        if 4 * first > left:  # the bf16 side's first step, then one timed round of each
            applied.skipped["precision"] = (f"bf16 not measured: a first step takes {first:.2g} s "
                                            f"here, {max(left, 0):.2g} s of the budget left")
            return
        rewrite = _rewrite_toggle(model, inputs, applied) if with_rewrite else None
        low, holder = Precision("bf16", device), {"p": prec}

        def use_bf16(on: bool) -> None:
            holder["p"] = low if on else prec
            if rewrite is not None:
                rewrite(on)

        with _memory_cap():
            gain = _race(use_bf16, model, inputs, device, holder,
                         deadline - time.perf_counter(), min_rounds=1)
    finally:
        saved.restore()
    keep = not isinstance(gain, str) and gain >= 1 + MARGIN["cpu"]
    use_bf16(keep)
    if isinstance(gain, str):
        applied.skipped["precision"] = f"bf16 {gain}"
        return
    applied.speedup["precision"] = gain
    if not keep:
        applied.skipped["precision"] = f"bf16 measured {gain:.2f}x fp32 here, not faster"
        return
    applied.precision = "bf16"
    applied.applied.append("precision")
    if rewrite is not None:
        applied.applied.append("rewrite")


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _can_cap_memory() -> bool:
    try:
        import resource  # noqa: F401 — POSIX only
    except ImportError:
        return False
    return os.path.exists("/proc/self/status") and os.path.exists("/proc/meminfo")


@contextlib.contextmanager
def _memory_cap() -> Iterator[None]:
    """Cap this process's address space at what it maps now plus the machine's available memory,
    for the duration: an allocation the machine could never satisfy (oneDNN's emulated bf16
    asking for hundreds of GB) fails as an error instead of the kernel killing the process."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _kib("/proc/self/status", "VmSize:") * 1024 + _kib("/proc/meminfo",
                                                                "MemAvailable:") * 1024
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    if soft != resource.RLIM_INFINITY and soft <= cap:
        yield  # already capped at least as tightly
        return
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _kib(path: str, key: str) -> int:
    with open(path) as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1])
    raise OSError(f"{key} not in {path}")


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


def _race(toggle, model, inputs, device, prec, budget, min_rounds: int | None = None
          ) -> float | str:
    """Time one step with the knob off and on, interleaved, for about ``budget`` s.

    Each state runs once untimed first (allocation, cuDNN autotuning, layout conversion). On the
    CPU a race whose warm-up step shows it cannot fit two rounds in the budget is not run.
    Returns the gain (off time / on time, fastest step of each), or why it was not measured.
    """
    times = {False: [], True: []}
    if min_rounds is None:
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
    applied._globals.append(lambda: setattr(torch.backends.cudnn, "benchmark", before))


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
