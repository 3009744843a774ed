"""The run's settings: ``Trainer(...)``'s keyword arguments, checked once before any work (each
message names the argument, the value and the fix) and frozen in one picklable dataclass, so the
kernel and an isolated worker build the same run from the same object; ``resolved`` fills in
``detect()``'s advice once, so a worker never has to detect again."""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hybridnb.train import checkpoint
from hybridnb.train.habits import precision_name, unknown_keywords
from hybridnb.train.loggers import TensorBoardLogger, logger_names, patterns
from hybridnb.train.losses import CLASSIFICATION_NAMES, is_classification
from hybridnb.train.recovery import LossGuard

COMPILE_MODES = (False, True, "default", "reduce-overhead", "max-autotune")
# DataLoader arguments the Trainer itself sets for every Dataset it batches
TRAINER_LOADER_KEYS = {"batch_size", "shuffle", "sampler", "batch_sampler", "generator"}


@dataclass(frozen=True)
class Settings:
    """Every ``Trainer`` option (see ``Trainer``'s docstring for each one's meaning)."""

    loss: Any = "mse"
    class_weights: tuple[float, ...] | None = None
    lr: float = 1e-3
    epochs: int = 10
    batch_size: int | None = None
    device: Any = "auto"
    precision: str = "auto"
    live: Any = "auto"
    seed: int | None = None
    checkpoint_dir: Path | None = None
    optimizer: Any = None
    weight_decay: float = 0.01
    grad_accum: int | None = None
    clip_grad: float | None = 1.0
    schedule: Any = "warmup_cosine"
    warmup: float = 0.05
    ema: float | None = None
    early_stopping: int | None = None
    monitor: str = "val_loss"
    freeze: tuple[str, ...] | None = None
    compile: Any = False
    on_gpu_error: str = "recover"
    val_every: int | None = None
    checkpoint_every: int | None = None
    snapshot_every: int | None = 100
    steps_per_epoch: int | None = None
    loss_guard: Any = True
    huber_delta: float = 1.0
    reweight_after: int | None = None
    memory_fraction: float | None = None
    grad_checkpointing: bool = False
    loader_kwargs: dict | None = None
    strategy: Any = "auto"
    isolate: Any = "auto"
    step_timeout: float | None = None
    speedups: Any = "auto"
    logger: Any = "auto"
    log_dir: Path | None = None
    verbose: bool = True
    # filled in by resolved(): what detect() recommended, so nobody asks it again
    recommended_precision: str | None = None
    torch_threads: int | None = None
    resolved_: bool = False
    from_detect: tuple[str, ...] = ()  # the options resolved() took from detect()'s advice

    @property
    def task(self) -> str:
        """"classification" for ``loss="cross_entropy"`` (or torch's CrossEntropyLoss /
        NLLLoss), else "regression": which metrics validation and ``evaluate()`` give."""
        return "classification" if is_classification(self.loss) else "regression"

    @classmethod
    def build(cls, **kwargs: Any) -> Settings:
        """The checked settings; unknown names are a TypeError naming them, as a call would,
        each with the option that does the same (``max_epochs`` -> ``epochs=``)."""
        names = {f.name for f in dataclasses.fields(cls)} - _INTERNAL
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(unknown_keywords(unknown, names))
        if "precision" in kwargs:
            kwargs["precision"] = precision_name(kwargs["precision"])
        if kwargs.get("class_weights") is not None:
            kwargs["class_weights"] = _checked_weights(kwargs["class_weights"], kwargs)
        if isinstance(kwargs.get("freeze"), (list, str)):
            f = kwargs["freeze"]
            kwargs["freeze"] = (f,) if isinstance(f, str) else tuple(f)
        kwargs["checkpoint_dir"] = checkpoint.check_dir(kwargs.get("checkpoint_dir"))
        kwargs["log_dir"] = checkpoint.check_dir(kwargs.get("log_dir"), "log_dir")
        settings = cls(**kwargs)
        settings.check()
        return settings

    def check(self) -> None:
        """Every argument check in one place, before any work."""
        if not (isinstance(self.lr, (int, float)) and self.lr > 0):
            raise ValueError(f"lr={self.lr!r} must be a positive number")
        if not (isinstance(self.epochs, int) and self.epochs >= 1):
            raise ValueError(f"epochs={self.epochs!r} must be an integer >= 1")
        for name in ("batch_size", "grad_accum", "val_every", "checkpoint_every",
                     "snapshot_every", "steps_per_epoch", "early_stopping"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, int) and v >= 1):
                raise ValueError(f"{name}={v!r} must be None or an integer >= 1")
        if self.clip_grad is not None and not self.clip_grad > 0:
            raise ValueError(f"clip_grad={self.clip_grad!r} must be None or > 0")
        if self.compile not in COMPILE_MODES:
            raise ValueError(f"compile={self.compile!r} must be one of {COMPILE_MODES}")
        if self.on_gpu_error not in ("recover", "raise"):
            raise ValueError(f"on_gpu_error={self.on_gpu_error!r} must be 'recover' or 'raise'")
        mf = self.memory_fraction
        if mf is not None and not 0 < mf <= 1:
            raise ValueError(f"memory_fraction={mf!r} must be in (0, 1]")
        if not isinstance(self.monitor, str):
            raise ValueError(f"monitor={self.monitor!r} must be a metric name such as "
                             "'val_loss'")
        if not isinstance(self.loss_guard, (bool, LossGuard)):  # else the guard is off, unsaid
            raise ValueError(f"loss_guard={self.loss_guard!r}: use True, False or a "
                             "hybridnb.train.recovery.LossGuard(...)")
        if self.isolate not in ("auto", True, False):
            raise ValueError(f"isolate={self.isolate!r}: use 'auto', True or False")
        if self.step_timeout is not None and not self.step_timeout > 0:
            raise ValueError(f"step_timeout={self.step_timeout!r} must be > 0 seconds, or None "
                             "(automatic)")
        owned = sorted(set(self.loader_kwargs or ()) & TRAINER_LOADER_KEYS)
        if owned:
            raise ValueError(f"loader_kwargs={self.loader_kwargs!r}: {', '.join(owned)} is set by "
                             "the Trainer (it batches, shuffles and seeds every run the same "
                             "way): pass batch_size= to the Trainer and leave these out")
        names = self.loggers  # raises on an unknown name
        if self.logger != "auto" and patterns(names) and self.log_folder is None:
            raise ValueError(f"logger={self.logger!r} needs a folder to write into: pass "
                             "log_dir= (or checkpoint_dir=, which log_dir defaults to)")
        tensorboard = any(isinstance(lg, TensorBoardLogger) or lg == "tensorboard" for lg in names)
        if tensorboard and importlib.util.find_spec("tensorboard") is None:  # before training
            raise ImportError("logger='tensorboard' needs the tensorboard package: pip install "
                              "'hybridnb[tensorboard]' (or pip install tensorboard)")

    @property
    def loggers(self) -> tuple[str, ...]:
        """The loggers this run writes: ``"auto"`` is csv when there is a folder, else none."""
        if self.logger == "auto":
            return ("csv",) if self.log_folder is not None else ()
        return logger_names(self.logger)

    @property
    def log_folder(self) -> Path | None:
        """Where the loggers write: ``log_dir``, else ``checkpoint_dir``."""
        return self.log_dir if self.log_dir is not None else self.checkpoint_dir

    def for_worker(self) -> Settings:
        """What an isolated worker trains with: no isolation again, no loggers (they run in the
        user's process, as callbacks do), and this process's torch threads when none are named
        (a fresh interpreter would take every core)."""
        return dataclasses.replace(self, isolate=False, logger=None,
                                   torch_threads=self.torch_threads or torch.get_num_threads())

    @property
    def needs_detect(self) -> bool:
        """Whether some option is left to ``hn.detect()``'s recommendation."""
        return not self.resolved_ and ("auto" in (self.device, self.precision)
                                       or self.batch_size is None or self.grad_accum is None)

    def resolved(self, hw: Any, device: torch.device) -> Settings:
        """With ``device`` (checked) and what ``hw`` (``detect()``'s answer, or None) advises."""
        batch_size = self.batch_size if self.batch_size is not None else hw.settings.batch_size
        # detect()'s accumulation goes with its batch size: a batch size given alone is the
        # effective batch, never silently multiplied
        grad_accum = self.grad_accum if self.grad_accum is not None else (
            hw.settings.grad_accum if self.batch_size is None else 1)
        from_hw = self.device == "auto" and hw is not None
        taken = tuple(name for name, left in (
            ("device", from_hw), ("precision", self.precision == "auto" and hw is not None),
            ("batch_size", self.batch_size is None),
            ("grad_accum", self.grad_accum is None and self.batch_size is None)) if left)
        if self.loader_kwargs is not None:
            loader = dict(self.loader_kwargs)
        elif from_hw:
            loader = dict(hw.dataloader_kwargs())
        else:
            loader = {"num_workers": 0, "pin_memory": device.type == "cuda"}
        return dataclasses.replace(
            self, device=str(device), batch_size=int(batch_size), grad_accum=int(grad_accum),
            loader_kwargs=loader, resolved_=True, from_detect=self.from_detect or taken,
            recommended_precision=hw.precision if hw is not None else self.recommended_precision,
            torch_threads=self.torch_threads or (int(hw.settings.torch_threads) if from_hw
                                                 and hw.settings.torch_threads else None))

    def chosen(self, precision: str | None = None, speedups: tuple = ()) -> list[str]:
        """What the Trainer chose on the user's behalf, in words for the run's header
        (``precision``, ``speedups``: what the placement decided for ``"auto"``)."""
        said = []
        if "batch_size" in self.from_detect:
            said.append(f"batch {self.batch_size}" + (
                f" × grad_accum {self.grad_accum}" if "grad_accum" in self.from_detect else "")
                + " (detect())")
        if "device" in self.from_detect:
            said.append(f"device {self.device} (detect())")
        if self.precision == "auto" and precision:
            said.append(f"precision {precision} (auto)")
        if self.speedups == "auto" and speedups:
            said.append(f"speedups {', '.join(speedups)} (auto)")
        if self.schedule == "warmup_cosine":
            said.append(f"schedule warmup_cosine (warmup {self.warmup:g})")
        if self.clip_grad == 1.0:
            said.append("clip_grad 1.0")
        if self.weight_decay == 0.01 and self.optimizer in (None, "adamw", "adam", "sgd"):
            said.append(f"weight_decay 0.01 ({self.optimizer or 'adamw'})")
        return said

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)


_INTERNAL = {"recommended_precision", "torch_threads", "resolved_", "from_detect"}


def _checked_weights(weights, kwargs: dict) -> tuple[float, ...]:
    """``class_weights=``: one non-negative weight per class, for ``loss="cross_entropy"``."""
    loss = kwargs.get("loss", "mse")
    if not (isinstance(loss, str) and loss in CLASSIFICATION_NAMES):
        raise ValueError(f"class_weights= goes with loss='cross_entropy' (loss={loss!r}); a "
                         "loss module of your own takes its weights itself (e.g. "
                         "torch.nn.CrossEntropyLoss(weight=...))")
    try:
        values = tuple(float(w) for w in torch.as_tensor(weights).reshape(-1).tolist())
    except (TypeError, ValueError, RuntimeError):
        values = ()  # not numbers
    if not any(values) or any(not (w >= 0 and w < float("inf")) for w in values):
        raise ValueError(f"class_weights={weights!r} must be finite numbers >= 0, one per class, "
                         "not all 0")
    return values

