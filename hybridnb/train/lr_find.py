"""The learning-rate range test (Smith 2015; fastai's ``lr_find``, Lightning's ``Tuner.lr_find``).

An exponential sweep from ``start_lr`` to ``end_lr``, one real optimizer step per value, that stops
once the smoothed loss (bias-corrected EMA, ``beta=0.98`` as both libraries) passes ``diverge``
times its best. The suggestion is fastai's ``"valley"`` (a point a little past the first third of
the longest falling stretch) or Lightning's ``"steepest"`` (the steepest descent, its slope
measured over a tenth of the sweep: step to step it is mostly batch noise).

The sweep is a trial fit on the Trainer's Loop (``opening.trial``: the Loop's state is put back
afterwards), with a listener (``Curve``) recording each step, as fastai's ``LRFinder`` is a
callback on its fit: recovery, the view, events and speedups are a fit's.

>>> result = trainer.lr_find(train)        # result.lrs, result.losses, result.suggestion
>>> result.plot()                          # plotly figure, the suggestion marked
>>> trainer.lr_find(train, apply=True)     # ... and the trainer's lr set to the suggestion
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from hybridnb.env import quick
from hybridnb.train import opening
from hybridnb.train.bus import StepEnded
from hybridnb.train.opening import CancelFit
from hybridnb.train.schedules import Constant
from hybridnb.train.state import Plan

SUGGESTIONS = ("valley", "steepest")
QUICK_STEPS = 20  # quick mode (HYBRIDNB_QUICK=1): a short sweep, as the Trainer caps fits


@dataclass
class LRFindResult:
    """One sweep: the learning rates tried, the smoothed (``losses``) and raw losses, the
    suggested learning rate (None when the curve has no falling stretch to read it from)."""

    lrs: np.ndarray
    losses: np.ndarray
    raw_losses: np.ndarray
    suggestion: float | None
    method: str = "valley"
    stopped_early: bool = False
    note: str = ""
    applied: bool = False
    speedups: tuple[str, ...] = ()  # the speedups the sweep ran with: the ones fit uses

    def __repr__(self) -> str:
        lr = "none" if self.suggestion is None else f"{self.suggestion:.3g}"
        return (f"LRFindResult({len(self.lrs)} steps, {self.lrs[0]:.1e}..{self.lrs[-1]:.1e}, "
                f"suggestion {lr} ({self.method}){', stopped early' if self.stopped_early else ''})")

    def plot(self, title: str = "Learning-rate range test"):
        """The smoothed loss against the learning rate (log axis), the suggestion marked; its
        notebook output also holds an SVG (``hybridnb.live.static``) for saved notebooks."""
        import plotly.graph_objects as go

        from hybridnb.live.static import static_figure

        at = top = mark = None  # the smoothed loss at the suggestion; the y axis's top (None: auto)
        if self.suggestion is not None:
            at = self.losses[int(np.argmin(np.abs(np.log(self.lrs) - math.log(self.suggestion))))]
            mark = f"suggestion ({self.method}): {self.suggestion:.2g}"
        finite = self.losses[np.isfinite(self.losses)]
        if finite.size and finite.min() > 0:  # a diverged tail must not flatten the curve
            top = 1.05 * float(min(finite.max(), 4 * finite.min()))
        fig = static_figure(go.Figure(), functools.partial(self._image, title, at, mark, top))
        fig.add_scatter(x=self.lrs, y=self.raw_losses, mode="lines", name="loss per step",
                        line=dict(color="lightgrey"))
        fig.add_scatter(x=self.lrs, y=self.losses, mode="lines", name="smoothed loss",
                        line=dict(color="royalblue"))
        if at is not None:
            fig.add_scatter(x=[self.suggestion], y=[at], mode="markers", name=mark,
                            marker=dict(size=12, color="crimson", symbol="circle"))
            fig.add_vline(x=self.suggestion, line_dash="dot", line_color="crimson")
        fig.update_layout(template="plotly_white", height=360, title=title,
                          xaxis=dict(type="log", title="learning rate"),
                          yaxis=dict(title="training loss", range=None if top is None else [0, top]))
        return fig

    def _image(self, title: str, at: float | None, mark: str | None, top: float | None):
        """``plot()``'s static image, drawn from the sweep with matplotlib (no pyplot)."""
        from matplotlib.figure import Figure
        from matplotlib.ticker import FuncFormatter, NullLocator

        ax = Figure(figsize=(7, 3.6)).add_subplot(title=title, xscale="log", xlabel="learning rate",
                                                  ylabel="training loss")
        # plain "1e-05" labels, no minor ticks: mathtext labels would treble the drawing's time
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.plot(self.lrs, self.raw_losses, color="lightgrey", label="loss per step")
        ax.plot(self.lrs, self.losses, color="royalblue", label="smoothed loss")
        if at is not None:
            ax.axvline(self.suggestion, color="crimson", linestyle=":")
            ax.plot([self.suggestion], [at], "o", color="crimson", label=mark)
        if top is not None:
            ax.set_ylim(0, top)
        ax.grid(color="#e5e5e5")
        ax.legend(loc="upper left", bbox_to_anchor=(1, 1), frameon=False, fontsize=8)
        return ax.figure


def lr_find(loop, data, *, start_lr: float = 1e-7, end_lr: float = 1.0, num_steps: int = 100,
            beta: float = 0.98, diverge: float = 4.0, suggest: str = "valley") -> LRFindResult:
    """Sweep the learning rate over ``num_steps`` real steps on ``data`` (a Dataset, a
    DataLoader or ``(X, y)``) on ``loop`` and restore its state afterwards; see the module."""
    if not 0 < start_lr < end_lr:
        raise ValueError(f"lr_find: need 0 < start_lr < end_lr, got start_lr={start_lr!r}, "
                         f"end_lr={end_lr!r}")
    if num_steps < 5:
        raise ValueError(f"lr_find: num_steps={num_steps!r} is too few to read a curve (use >= 5)")
    if not 0 <= beta < 1 or diverge <= 1:
        raise ValueError(f"lr_find: beta={beta!r} must be in [0, 1) and diverge={diverge!r} > 1")
    if suggest not in SUGGESTIONS:
        raise ValueError(f"lr_find: suggest={suggest!r}; use one of {SUGGESTIONS}")
    capped = ""
    if quick() and num_steps > QUICK_STEPS:
        num_steps, capped = QUICK_STEPS, f"quick mode: the sweep capped at {QUICK_STEPS} steps"
    bus, placement = loop.bus, loop.placement
    loader = opening.loader(loop, data, shuffle=True, what="lr_find data")
    placement.place([loader])
    # the speedups fit would choose for this data (decided once per device; fit keeps them)
    placement.speed_up(loader, loop.settings.batch_size, opening.plan(loader, loop.settings).total_steps)
    applied = placement.applied_speedups
    used = tuple(applied.applied) if applied is not None else ()
    bus.note("lr_find", f"sweeping lr {start_lr:.0e} to {end_lr:.0e} over at most {num_steps} "
             f"steps on {placement.device} ({placement.precision.name}; speedups: "
             f"{', '.join(used) or 'none'})")  # said as the sweep's view opens
    lrs = start_lr * (end_lr / start_lr) ** (np.arange(num_steps) / (num_steps - 1))
    curve = Curve(lrs, beta, diverge)
    try:
        batches = min(len(loader), num_steps)
    except TypeError:  # a stream: one epoch of the sweep's steps
        batches = num_steps
    epochs = math.ceil(num_steps / batches)
    with opening.trial(loop, loader, Plan(epochs, batches, batches, epochs * batches), curve,
                       Sweep(lrs / loop.settings.lr)):
        loop.fit(loader, None)
    result = LRFindResult(lrs[:len(curve.raw)], np.array(curve.smooth), np.array(curve.raw),
                          None, suggest, curve.diverged, speedups=used)
    result.suggestion, why = suggestion(result.lrs, result.losses, suggest)
    result.note = "; ".join(n for n in (capped, why) if n)
    bus.say("lr_find", f"{len(result.lrs)} steps"
            f"{' (stopped: the loss diverged)' if curve.diverged else ''}; suggestion "
            f"{'none' if result.suggestion is None else f'{result.suggestion:.3g}'} ({suggest})")
    return result


class Curve:
    """Each step's loss, smoothed; ends the fit (``CancelFit``) after the last learning rate or
    once the smoothed loss passes ``diverge`` times its best."""

    def __init__(self, lrs: np.ndarray, beta: float, diverge: float) -> None:
        self.sweep, self.beta, self.diverge = lrs, beta, diverge
        self.raw: list[float] = []  # the step k's loss at k - 1: its lr is sweep[k - 1]
        self.smooth: list[float] = []
        self.diverged = False

    def __call__(self, event) -> None:
        if not isinstance(event, StepEnded):
            return
        k = event.step  # from 1; a rewind to the last good state (a lost device) goes back
        del self.raw[k - 1:], self.smooth[k - 1:]
        self.raw.append(event.loss)
        avg = 0.0
        for loss in self.raw:  # bias-corrected exponential moving average
            avg = self.beta * avg + (1 - self.beta) * loss
        smooth = avg / (1 - self.beta ** len(self.raw)) if math.isfinite(event.loss) else math.inf
        self.smooth.append(smooth)
        if not math.isfinite(smooth) or (k > 1 and smooth > self.diverge * min(self.smooth)):
            self.diverged = True
            raise CancelFit
        if k >= len(self.sweep):
            raise CancelFit


class Sweep(Constant):
    """The sweep's learning rates as factors of the trainer's, one per optimizer step."""

    def __init__(self, factors: np.ndarray) -> None:
        self.factors = factors

    def factor(self, step: int) -> float:
        return float(self.factors[min(step, len(self.factors) - 1)])


def suggestion(lrs: np.ndarray, losses: np.ndarray, method: str = "valley"
               ) -> tuple[float | None, str]:
    """The suggested LR on a smoothed curve, and a note when there is none."""
    keep = np.isfinite(losses)
    lrs, losses = np.asarray(lrs)[keep], np.asarray(losses)[keep]
    if len(losses) < 5:
        return None, f"only {len(losses)} finite losses: too few to suggest a learning rate"
    if method == "steepest":
        # Lightning's rule, skipping the first 10 steps (their average holds few losses)
        lo, w = min(10, len(losses) // 5), max(2, len(losses) // 10)
        log_lr = np.log(lrs)
        slope = (losses[lo + w:] - losses[lo:-w]) / (log_lr[lo + w:] - log_lr[lo:-w])
        if not len(slope) or slope.min() >= 0:
            return None, "the loss never falls: no steepest descent to suggest"
        k = lo + int(np.argmin(slope))
        return float(np.exp((log_lr[k] + log_lr[k + w]) / 2)), ""
    # fastai's valley: the longest decreasing subsequence of the losses, from start to end
    lds = [1] * len(losses)  # the longest one ending at each loss
    end = 0
    for i in range(1, len(losses)):
        lds[i] = max((lds[j] + 1 for j in range(i) if losses[j] > losses[i]), default=1)
        if lds[i] > lds[end]:
            end = i
    start = end - lds[end] + 1
    if end - start < 2:
        return None, "the loss never falls for long: no valley to suggest"
    third = (end - start) / 3
    return float(lrs[start + int(third) + int(third / 2)]), ""
