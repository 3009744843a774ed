"""Targets on another scale than the model's outputs: said once, never rescaled.

Targets in milliseconds, or whose mean lies many stds from where a fresh model predicts, make a
regression spend its first epochs finding the mean (and with MSE dwarf the learning rate).
"""

from __future__ import annotations

import math

import torch

FAR_STDS = 3.0      # the outputs' mean this many target stds from the targets' mean
LARGE_STD = 50.0    # targets spread this wide (milliseconds, raw counts) whatever the outputs


class TargetScale:
    """The check: ``targets(y)`` with the first batch arms the hook; the first forward after it
    judges, says it on ``bus`` (the run's) when off, and removes itself."""

    def __init__(self, model: torch.nn.Module, bus, enabled: bool = True, loss="mse",
                 task: str = "regression") -> None:
        self.model, self.bus, self.enabled = model, bus, enabled and task == "regression"
        self.loss = f"loss={loss!r}" if isinstance(loss, str) else "a regression loss"
        self.kind_checked = task != "regression"

    def targets(self, y) -> None:
        if not self.kind_checked and isinstance(y, torch.Tensor) and y.numel() >= 1:
            self.kind_checked = True  # once per Trainer, whatever compile says
            said = judge_kind(y, self.loss)
            if said:
                self.bus.note("target_kind", said)
                self.enabled = False  # the scale of such targets says nothing more
        if not self.enabled or not isinstance(y, torch.Tensor) or y.numel() < 2:
            return
        self.enabled = False  # once per Trainer (so never while the hook waits)
        y = y.detach().cpu()  # held until the hook fires: maybe after the GPU is lost

        def judge_output(module, args, out) -> None:
            hook.remove()
            if not isinstance(out, torch.Tensor) or out.numel() != y.numel():
                return  # the loss says what is wrong with the output's structure
            with torch.no_grad():
                yf = y.reshape(-1).float().to(out.device)
                keep = torch.isfinite(yf)
                if int(keep.sum()) < 2:
                    return
                yf, of = yf[keep], out.detach().reshape(-1)[keep].float()
                y_mean, y_std, o_mean, o_std = torch.stack(
                    [yf.mean(), yf.std(), of.mean(), of.std()]).tolist()
            message = judge(y_mean, y_std, o_mean, o_std)
            if message:
                self.bus.note("target_scale", message)

        hook = self.model.register_forward_hook(judge_output)


CONSTANT_AT = 8  # targets in the first batch all equal: said from this many on

SET_TARGET = ("for classification use loss='cross_entropy' with one model output per class; "
              "for regression set the target the windows carry (braindecode: "
              "create_windows_from_events(..., targets_from='metadata') or a target_transform "
              "on the dataset)")


def judge_kind(y: torch.Tensor, loss: str) -> str | None:
    """What to say about the first batch's targets under a regression loss: integer codes
    (class labels? braindecode's event codes?) or one constant value, or None."""
    flat = y.detach().reshape(-1)
    if flat.dtype == torch.bool or not flat.dtype.is_floating_point:
        values = torch.unique(flat.long().cpu())
        shown = ", ".join(str(int(v)) for v in values[:8]) + (", ..." if len(values) > 8
                                                               else "")
        return (f"the targets are integers ({shown} in the first batch): class labels or event "
                f"codes? {loss} fits them as numbers: {SET_TARGET}; integer quantities (counts, "
                "ages) can stay")
    if flat.numel() >= CONSTANT_AT:
        first = flat[:1]
        if bool(torch.isfinite(first).all()) and bool((flat == first).all()):
            return (f"the first batch's {flat.numel()} targets are all {float(first):.6g}: a "
                    f"constant target teaches {loss} nothing ({SET_TARGET})")
    return None


def judge(y_mean: float, y_std: float, o_mean: float, o_std: float) -> str | None:
    """What to say about targets (mean, std) against first outputs (mean, std), or None."""
    if not all(map(math.isfinite, (y_mean, y_std, o_mean, o_std))) or y_std <= 0:
        return None
    away = abs(y_mean - o_mean) / y_std
    large = y_std >= LARGE_STD
    if away < FAR_STDS and not large:
        return None
    seen = (f"the first batch's targets have mean {y_mean:.4g} and std {y_std:.4g}; the model's "
            f"first outputs have mean {o_mean:.3g} (std {o_std:.3g})")
    why = []
    if large:
        why.append("targets spread in the hundreds (milliseconds? raw counts?) make the loss "
                   "and its gradients that many times larger than the learning rate expects")
    if away >= FAR_STDS:
        why.append(f"the outputs start {away:.1f} target stds from the targets' mean, so the "
                   "first epochs are spent finding it")
    units = ", or use other units (seconds, not milliseconds)" if large else ""
    return (f"{seen}: {'; '.join(why)}. Standardise the targets (y - mean) / std and undo it on "
            f"the predictions (pred * std + mean){units}, or start the output layer's bias at "
            "the targets' mean; hybridnb does not rescale them")
