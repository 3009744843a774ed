"""What learns (fastai's Learner), built once from the settings, with its parts' states in and out
together (checkpoints and the worker's hand-over)."""

from __future__ import annotations

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from hybridnb.train import recovery, setup
from hybridnb.train.losses import make_loss
from hybridnb.train.schedules import make_schedule
from hybridnb.train.settings import Settings


class Learner:
    """Model, parameters, optimizer, loss, schedule, EMA and guard of one run."""

    def __init__(self, model: torch.nn.Module, settings: Settings) -> None:
        self.model = model  # a Module: Trainer checked it
        self.frozen = setup.freeze(model, list(settings.freeze or ()))
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError(_no_params(model, settings.freeze))
        self.optimizer = setup.make_optimizer(settings.optimizer, self.params, settings.lr,
                                              settings.weight_decay)
        self.ema = make_ema(model, settings.ema) if settings.ema is not None else None
        self.ema_decay = settings.ema
        self.loss_fn = make_loss(settings.loss, huber_delta=settings.huber_delta,
                                 reweight_after=settings.reweight_after,
                                 class_weights=settings.class_weights)
        self.schedule = make_schedule(settings.schedule, warmup=settings.warmup,
                                      optimizer=self.optimizer)
        self.input_shape: tuple[int, ...] | None = None  # one sample's x, from the first batch
        guard = settings.loss_guard  # True, False or a LossGuard: Settings.check refuses others
        self.guard = recovery.LossGuard() if guard is True else guard or None

    def see_input(self, x) -> None:
        """One sample's input shape, from the first batch, for ``Trainer.save``."""
        if self.input_shape is None and isinstance(x, torch.Tensor) and x.dim() >= 1:
            self.input_shape = tuple(int(n) for n in x.shape[1:])

    @property
    def dtype(self) -> torch.dtype:
        """The dtype inputs are cast to (the first trainable parameter's)."""
        return self.params[0].dtype

    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def set_lr(self, factor: float) -> None:
        """Every group's LR at ``factor`` of its initial LR."""
        for group in self.optimizer.param_groups:
            group["lr"] = group["initial_lr"] * factor

    def start_epoch(self, epoch: int) -> None:
        self.model.train()
        if hasattr(self.loss_fn, "set_epoch"):
            self.loss_fn.set_epoch(epoch)

    def eval_model(self, fitting: bool) -> torch.nn.Module:
        """During fit, validation scores the EMA weights when EMA is on; after fit the model
        holds the weights fit chose (best or EMA), so evaluate/predict score exactly those."""
        return self.ema.module if self.ema is not None and fitting else self.model

    def follow_rewrites(self) -> None:
        """The EMA copy takes the model's layers as the speedups rewrote them, keeping its
        averaged weights: it was copied before the rewrite, and validation scores it, so
        without this every validation ran the stock (slower) layers."""
        if self.ema is not None:
            averaged = self.ema.state_dict()
            self.ema = make_ema(self.model, self.ema_decay)
            self.ema.load_state_dict(averaged)

    def state_dict(self, strategy) -> dict:
        """Weights, optimizer, EMA, schedule (CPU copies) and guard."""
        return {**recovery.to_cpu({
            "model": self.model.state_dict(),
            "optimizer": strategy.optimizer_state(self.optimizer),
            "ema": None if self.ema is None else self.ema.state_dict(),
            "schedule": self.schedule.state_dict()}),
            "guard": None if self.guard is None else self.guard.state_dict(),
            "input_shape": None if self.input_shape is None else list(self.input_shape)}

    def load_state_dict(self, state: dict, strategy) -> None:
        self.model.load_state_dict(state["model"])
        # a copy: torch's load keeps CPU tensors as given, and training on would change the
        # snapshot a later restore goes back to
        strategy.load_optimizer_state(self.optimizer, recovery.to_cpu(state["optimizer"]))
        self.schedule.load_state_dict(state["schedule"])
        if self.ema is not None and state["ema"] is not None:
            self.ema.load_state_dict(state["ema"])
        if self.guard is not None and state["guard"] is not None:
            self.guard.load_state_dict(state["guard"])
        if state.get("input_shape") is not None:
            self.input_shape = tuple(int(n) for n in state["input_shape"])
        self.optimizer.zero_grad(set_to_none=True)

    def take_final_weights(self, best, settings) -> tuple[str, str] | None:
        """After a whole fit the model holds the best weights (early stopping) or the EMA's;
        the note that says so, or None."""
        if settings.early_stopping and best.model is not None:
            self.model.load_state_dict(best.model)
            return "best_restored", (f"model holds the best weights ({settings.monitor} "
                                     f"{best.value:.4g} at epoch {best.epoch}, step {best.step})")
        if self.ema is not None:
            self.model.load_state_dict(self.ema.module.state_dict())
            return "ema_weights", "model holds the EMA weights" + (
                " (raw weights are in last.pt)" if settings.checkpoint_dir else "")
        return None

    def to(self, device: torch.device) -> None:
        """Model, EMA and optimizer state on ``device``."""
        self.model.to(device)
        if self.ema is not None:
            self.ema.to(device)
        if self.optimizer.state:  # loading casts the state to each parameter's device
            self.optimizer.load_state_dict(self.optimizer.state_dict())

    def rebuild_on_cpu(self) -> None:
        """Fresh CPU storage after a lost device (nothing reads the device again)."""
        for module in (self.model, self.ema):
            if module is not None:  # every read of the lost device fails: fresh CPU storage
                module.to_empty(device="cpu")
                for p in module.parameters():
                    p.grad = None


def _no_params(model: torch.nn.Module, freeze) -> str:
    """Why nothing would train, and what to do."""
    name = type(model).__name__
    if not any(True for _ in model.parameters()):
        return (f"{name} has no parameters to train (its layers are not registered as "
                "submodules? keep them as attributes or in nn.ModuleList, not a plain list)")
    if freeze:
        return f"freeze={list(freeze)!r} leaves no trainable parameter in {name}"
    return (f"every parameter of {name} has requires_grad=False: unfreeze the layers to train "
            "(p.requires_grad_(True)), or use freeze=[...] to leave some untrained")


def make_ema(model: torch.nn.Module, decay: float) -> AveragedModel:
    """An EMA copy of ``model`` with torch's AveragedModel, buffers (batch-norm statistics)
    averaged too: after each step ``ema = decay * ema + (1 - decay) * weights``."""
    if not 0.0 < decay < 1.0:
        raise ValueError(f"ema={decay!r}: the decay must be between 0 and 1 (e.g. 0.999)")
    return AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)
