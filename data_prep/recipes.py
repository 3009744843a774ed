"""The deep recipe of each challenge: the braindecode model, its arguments and how it is trained.

One definition, used by notebooks 04 and 05, ``bench/bench_scores.py`` (the fold table and the
selection) and the submission zip (the :class:`~data_prep.submission.ModelSpec` it rebuilds).
Both recipes were chosen with ``python -m bench.bench_scores --select``: trained on fold 0's
training subjects of a *development release* (the "folds" generator with another seed: other
subjects than any reported score), scored on that fold's validation + test subjects;
``bench/results/scores-select-latest.md`` holds that comparison.

* Challenge 1 (response time): ShallowFBCSPNet read as an evoked response with a nonlinearity:
  its temporal and spatial filters, then ELU (not square and log, which would throw the slow
  potential's sign away), the mean over 0.05-s bins, a linear read-out of those bins. The
  response time sits in *when* the potential peaks, so fine bins (0.05 s rather than last
  round's 0.2 s) and the nonlinearity (the read-out of a latency is not linear in the
  amplitude) both count.
* Challenge 2 (externalizing): ShallowFBCSPNet with its pooling over the whole 2-s crop: each
  feature is one filtered band power per crop (learnt spatial filters, then square, mean, log),
  the read-out a linear map of them, starting at zero, i.e. at the training mean.

Both learn standardised targets (:class:`~data_prep.targets.TargetScaling`) with MSE (the
challenge's nRMSE is an RMSE), the Trainer's default optimizer (AdamW) and schedule, EMA
weights and a fixed number of epochs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

from .submission import ModelSpec, challenge_spec

if TYPE_CHECKING:
    import torch

__all__ = ["Recipe", "C1", "C2", "SCALE", "CROP", "RECIPES"]

SCALE = 1e6   # volts -> microvolts: what the models learn on (the zip multiplies volts by it)
CROP = 200    # Challenge 2: the 2-s crop of each 4-s window the model sees


@dataclass(frozen=True)
class Recipe:
    """A model (``spec``, rebuilt in the submission zip) and its training settings.

    ``zero_readout``: the last layer starts at zero, so the model starts by predicting the
    training mean and moves only as far as the data push it. ``epochs`` and ``batch_size`` are
    the recipe's; a notebook short of time passes fewer epochs to :meth:`trainer_kwargs`.
    """

    spec: ModelSpec
    lr: float = 3e-3
    epochs: int = 12
    batch_size: int = 64
    loss: str = "mse"
    ema: float = 0.99
    zero_readout: bool = False

    def build(self, seed: int = 0) -> torch.nn.Module:
        """A fresh model, its weights drawn with ``seed``."""
        import torch

        torch.manual_seed(seed)
        model = self.spec.build()
        if self.zero_readout:
            last = [m for m in model.modules()
                    if isinstance(m, (torch.nn.Conv2d, torch.nn.Conv1d, torch.nn.Linear))][-1]
            torch.nn.init.zeros_(last.weight)
            if last.bias is not None:
                torch.nn.init.zeros_(last.bias)
        return model

    def trainer_kwargs(self, **overrides) -> dict:
        """The settings for ``hybridnb.Trainer(model, **recipe.trainer_kwargs())``."""
        return {"loss": self.loss, "lr": self.lr, "epochs": self.epochs,
                "batch_size": self.batch_size, "ema": self.ema, **overrides}

    def describe(self) -> str:
        """One line: the model, its arguments beyond the challenge's shape, the settings."""
        base = challenge_spec(self.spec.name).kwargs
        args = ", ".join(f"{k}={v}" for k, v in self.spec.kwargs.items()
                         if base.get(k, object()) != v)
        return (f"{self.spec.name}({args}); {self.loss.upper()} loss, lr {self.lr:g}, "
                f"{self.epochs} epochs, batch {self.batch_size}, EMA {self.ema}"
                + (", read-out starting at zero" if self.zero_readout else ""))

    def to_dict(self) -> dict:
        return {**asdict(self), "spec": self.spec.to_dict()}

    def but(self, **changes) -> Recipe:
        """This recipe with some settings changed (``spec_kwargs=`` changes model arguments)."""
        kwargs = changes.pop("spec_kwargs", None)
        name = changes.pop("model", None)
        recipe = replace(self, **changes)
        if kwargs is not None or name is not None:
            spec = self.spec
            new = dict(spec.kwargs) if name is None else challenge_spec(name).kwargs
            new.update(kwargs or {})
            recipe = replace(recipe, spec=ModelSpec(name or spec.name, new, spec.input_scale))
        return recipe


_SHALLOW = {"final_conv_length": "auto", "n_filters_time": 20, "n_filters_spat": 20}

C1 = Recipe(challenge_spec("ShallowFBCSPNet", input_scale=SCALE, **_SHALLOW,
                           conv_nonlin="torch.nn.ELU", activation_pool_nonlin="torch.nn.Identity",
                           pool_time_length=5, pool_time_stride=5))
C2 = Recipe(challenge_spec("ShallowFBCSPNet", input_scale=SCALE, **_SHALLOW,
                           pool_time_length=176, pool_time_stride=1), zero_readout=True)
RECIPES = {1: C1, 2: C2}
