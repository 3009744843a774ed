"""Target standardisation for training, folded into the model afterwards.

A regression network starts out predicting values near 0 with a spread near 1. Response times
(about 0.9 s, spread 0.4 s) are far from that: with Adam each weight moves about ``lr`` per step,
so the final bias alone needs ~1000 steps at ``lr=1e-3`` just to reach the mean, and the short
CPU runs end before the model has learnt anything else. Training on ``(y - mean) / std`` of the
training targets removes that, and :meth:`TargetScaling.fold_into` then folds ``* std + mean``
into the model's final affine layer, so the saved model (and the submission, which carries only
a braindecode model and its weights) predicts in the target's own units.

>>> ts = TargetScaling.fit(train.y)                   # mean and std of the training targets
>>> trainer.fit(train.dataset(scale=1e6, target=ts))  # learns on standardised targets
>>> ts.fold_into(trainer.model)                       # the model now predicts seconds
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TargetScaling:
    """``y -> (y - mean) / std`` for training; ``invert`` and ``fold_into`` undo it."""

    mean: float
    std: float

    def __post_init__(self) -> None:
        if not (np.isfinite(self.mean) and np.isfinite(self.std) and self.std > 0):
            raise ValueError(f"TargetScaling(mean={self.mean!r}, std={self.std!r}): both must be "
                             "finite and std > 0 (are the training targets all the same?)")

    @classmethod
    def fit(cls, y) -> TargetScaling:
        """Mean and standard deviation of the finite values of ``y`` (the training targets)."""
        y = np.asarray(y, dtype=np.float64).reshape(-1)
        y = y[np.isfinite(y)]
        if len(y) < 2:
            raise ValueError(f"TargetScaling.fit needs at least 2 finite targets, got {len(y)}")
        return cls(float(y.mean()), float(y.std()))

    def apply(self, y):
        """Standardised targets (numpy arrays or torch tensors)."""
        return (y - self.mean) / self.std

    def invert(self, pred):
        """Predictions back in the target's units."""
        return pred * self.std + self.mean

    def fold_into(self, model, n_chans: int | None = None, n_times: int | None = None):
        """Make ``model`` predict ``invert(model(x))`` by rescaling its final affine layer (the
        last ``Linear`` or convolution of ``model.final_layer``, else of the model) in place.
        Checked on a random input; raises ValueError, leaving the weights as they were, when
        the output does not follow (a non-linearity after that layer). Returns ``model``."""
        import torch

        layer = _final_affine(model)
        shape = (2, n_chans or getattr(model, "n_chans", None) or 129,
                 n_times or getattr(model, "n_times", None) or 200)
        param = next(model.parameters())
        x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(param)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                before = model(x).double()
                weight = _stored_weight(layer)
                saved = (weight.detach().clone(), layer.bias.detach().clone())
                # a parametrized weight (braindecode's max-norm Linear) stores the original:
                # set it to the scaled effective weight, which the constraint then leaves alone
                # when std <= 1 (checked below like everything else)
                weight.copy_(layer.weight.detach() * self.std)
                layer.bias.mul_(self.std).add_(self.mean)
                after = model(x).double()
                expected = before * self.std + self.mean
                if not torch.allclose(after, expected, rtol=1e-4,
                                      atol=1e-4 * (abs(self.mean) + self.std)):
                    weight.copy_(saved[0])
                    layer.bias.copy_(saved[1])
                    raise ValueError(
                        f"TargetScaling.fold_into: the output of {type(model).__name__} is not "
                        f"affine in its final layer {type(layer).__name__} (something non-linear "
                        "follows it, or a weight constraint caps the scaled weights); keep the "
                        "model as it is and call invert() on its predictions instead")
        finally:
            model.train(was_training)
        return model


def _final_affine(model):
    """The last Linear / Conv layer with a bias of ``model.final_layer`` (braindecode's name for
    the read-out), else of the whole model."""
    import torch

    kinds = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
    where = getattr(model, "final_layer", model)
    layers = [m for m in where.modules() if isinstance(m, kinds) and m.bias is not None]
    if not layers:
        raise ValueError(f"TargetScaling.fold_into: {type(model).__name__} has no Linear or "
                         "convolution layer with a bias to fold the target scaling into")
    return layers[-1]


def _stored_weight(layer):
    """The tensor that holds ``layer``'s weight: the parametrization's original, if any."""
    from torch.nn.utils import parametrize

    if parametrize.is_parametrized(layer, "weight"):
        return layer.parametrizations.weight.original
    return layer.weight
