"""The Loop: fit (epochs, steps, validation, checkpoints, stops, recovery) over the Trainer's parts,
wherever it is placed (the kernel, or an isolated worker: ``run_here.py``, ``run_worker.py``).

It takes the parts explicitly (learner, placement, checkpoints, progress, stopping, heartbeat,
batch check, bus), owns the settings in force and the run's state (``RunState``: position,
history, the fit's plan and loaders), and emits what happens on the ``Bus`` as typed events
(bus.py); the view, loggers, callbacks and heartbeat are listeners. Read ``fit`` -> ``_epochs``
-> ``_epoch`` -> ``_between_steps`` top to bottom.
"""

from __future__ import annotations

import contextlib
import enum
import math
import os

from hybridnb.env import quick
from hybridnb.events import EpochRow, StepRow, ValidationRow
from hybridnb.measure.memory import reset_peak
from hybridnb.train import recovery, setup
from hybridnb.train.blocks import checkpointed_blocks
from hybridnb.train.bus import Bus, Ended, EpochEnded, Started, StateKept, StepEnded, Validated
from hybridnb.train.data import epoch_batches, make_loader, plan_epochs
from hybridnb.train.evaluation import metrics as scores_of
from hybridnb.train.evaluation import predict_loader
from hybridnb.train.interrupt import GracefulInterrupt
from hybridnb.train.recovery import Came
from hybridnb.train.schedules import tell_validation
from hybridnb.train.seeding import rng_state, seed_everything
from hybridnb.train.settings import Settings
from hybridnb.train.state import HISTORY_COLUMNS, Plan, RunState, Stop


class Epoch(enum.Enum):
    """How a pass over the epoch's batches ended."""

    COMPLETE = "complete"
    REWOUND = "rewound"    # back to the last good state (lost device, bad steps): go again
    STOPPED = "stopped"    # Stop, Ctrl-C or early stopping: ``state.stopped`` says why


class Loop:
    """Runs a fit over the parts; ``state`` is the run, ``settings`` the options in force."""

    def __init__(self, settings: Settings, *, learner, placement, checkpoints, progress,
                 stopping, heartbeat, batch_check, bus: Bus) -> None:
        self.settings, self.state = settings, RunState()
        self.learner, self.placement, self.checkpoints = learner, placement, checkpoints
        self.progress, self.stopping, self.heartbeat = progress, stopping, heartbeat
        self.batch_check, self.bus = batch_check, bus
        self.loader_kwargs = dict(settings.loader_kwargs)
        self.interrupt: GracefulInterrupt | None = None  # set while a fit runs
        self.stop_flag = lambda: False  # the Trainer's ``should_stop`` (set by a callback)
        checkpoints.on_keep = lambda state: bus.emit(StateKept(
            state["position"]["global_step"], state))

    @property
    def fitting(self) -> bool:
        return self.interrupt is not None

    # ------------------------------------------------------------------ the fit
    def fit(self, train_loader, val_loader, view_started: bool = False) -> None:
        """The whole fit from ``state`` (the view already runs when ``view_started``)."""
        s, placement = self.settings, self.placement
        grace = self.grace("set-up and the first step")
        self.heartbeat.beat("setup", grace=grace)
        placement.place(self.state.loaders, self.bus.note, self.bus.pending)
        placement.speed_up(train_loader, s.batch_size, self.state.plan.total_steps, self.bus.note)
        failed = True
        with GracefulInterrupt() as self.interrupt, \
                checkpointed_blocks(self.learner.model, s.grad_checkpointing) as blocks, \
                setup.compile_settings(bool(placement.compile), placement.device,
                                       placement.precision):
            self.build_step(compiled=bool(placement.compile))
            self.checkpoints.keep(self.state_dict())
            self.state.first_step = self.state.global_step
            self._start_view(blocks, view_started)
            self.heartbeat.beat("first step", grace=grace)
            try:
                self._epochs(train_loader, val_loader)
                failed = False
            finally:
                self._finish(failed)
                self.interrupt = None  # a Ctrl-C that stopped fit does not also stop evaluate()
                self.bus.open = False

    def _epochs(self, train_loader, val_loader) -> None:
        """Epochs until done or stopped (``state.stopped`` says why it stopped early)."""
        while self.state.epoch < self.state.plan.epochs:
            try:
                end = self._epoch(train_loader, val_loader)
                if end is Epoch.REWOUND:
                    continue
                if end is Epoch.STOPPED:
                    return
                metrics, stop = self._validate_epoch(val_loader)
            except KeyboardInterrupt:  # outside a step: loading data or validating
                self._interrupted()
                return
            self._end_epoch(metrics)
            if stop:
                self.state.stopped = Stop.EARLY_STOPPING
                return
            if self.placement.strategy.agree(self.stop_flag()) and \
                    self.state.epoch < self.state.plan.epochs:  # asked on any rank: every rank
                self.bus.say(Stop.CALLBACK.value, "a callback set trainer.should_stop: stopping "
                             "after this epoch")
                self.state.stopped = Stop.CALLBACK  # the epoch's checkpoint is written
                return

    def _epoch(self, loader, val_loader) -> Epoch:
        """One epoch from the current position."""
        state, learner, placement, plan = self.state, self.learner, self.placement, \
            self.state.plan
        accum = self.settings.grad_accum
        learner.start_epoch(state.epoch)
        if state.batches_done == 0:
            reset_peak(placement.device)
        self.progress.new_epoch(placement.device, state.global_step == state.first_step,
                                placement.flops_per_sample, placement.precision.name)
        window = []
        batches = self.progress.batches(epoch_batches(loader, state, self.bus.say))
        for i, batch in enumerate(batches, start=state.batches_done):
            if i >= plan.batches_per_epoch:
                break
            window.append(self.batch_check(batch))
            if len(window) < accum and i + 1 < plan.batches_per_epoch:
                continue
            learner.set_lr(learner.schedule.factor(state.global_step) * state.lr_scale)
            self.heartbeat.before_step(first=state.global_step == state.first_step)
            outcome = placement.recovery.run(window)
            if outcome.kind is Came.DEVICE_LOST:
                return self._move_to_cpu(outcome.detail)
            if outcome.kind is Came.RESTORE:
                return self._restore_after_bad_steps()
            n = sum(recovery.batch_len(b) for b in window)
            if outcome.kind is Came.OK:
                state.acc.add(outcome.loss, n)
            state.batches_done += len(window)
            state.global_step += 1
            window = []
            self.progress.step_done(n)
            self._step_ended(outcome.loss)
            with self.progress.paused():
                if self._between_steps(val_loader):
                    return Epoch.STOPPED
        return Epoch.COMPLETE

    def _between_steps(self, val_loader) -> bool:
        """Stop requests, validation every ``val_every`` steps, checkpoints and snapshots;
        True when the fit stops here."""
        state, s = self.state, self.settings
        # summed over ranks: a stop asked on any rank stops every rank after this same step
        asked = self.stop_asked()
        interrupt, button, callback = self.placement.strategy.sum([
            float(asked is Stop.INTERRUPT), float(asked is Stop.STOP_BUTTON),
            float(asked is Stop.CALLBACK)])
        if interrupt:
            return self._stop(Stop.INTERRUPT, "interrupted: stopping after the current step")
        if button:
            return self._stop(Stop.STOP_BUTTON, "Stop clicked: stopping after the current step")
        if callback:
            return self._stop(Stop.CALLBACK, "a callback set trainer.should_stop: stopping "
                              "after the current step")
        if s.val_every and state.global_step % s.val_every == 0 and val_loader is not None:
            metrics = self._validate(val_loader)
            self.learner.model.train()
            state.last_val = (state.global_step, metrics)
            row = self.progress.row(state, s.grad_accum, self.learner.lr(),
                                    loss=state.steps[-1][2], **metrics)
            self.bus.emit(Validated(state.global_step, metrics, ValidationRow(row)))
            if self._after_validation(metrics):
                return self._stop(Stop.EARLY_STOPPING, None)
        if s.checkpoint_every and state.global_step % s.checkpoint_every == 0:
            self._save_last()
        elif (s.snapshot_every and state.global_step % s.snapshot_every == 0
              and (self.learner.guard is None or self.learner.guard.streak == 0)):
            self.checkpoints.keep(self.state_dict())
        return False

    def _step_ended(self, loss: float | None) -> None:
        state, lr = self.state, self.learner.lr()
        loss = math.nan if loss is None else loss
        state.steps.append((state.global_step, state.epoch, loss, lr))
        row = self.progress.row(state, self.settings.grad_accum, lr, loss=loss)
        self.bus.emit(StepEnded(state.global_step, state.epoch, loss, lr, StepRow(row)))

    def _end_epoch(self, metrics: dict) -> None:
        state, lr = self.state, self.learner.lr()
        history_row = self.progress.epoch_row(state, lr, metrics, self.placement.device)
        history_row.update({k: float(v) for k, v in metrics.items()  # the task's own metrics
                            if k in HISTORY_COLUMNS and k not in history_row})
        view_row = EpochRow(self.progress.row(state, self.settings.grad_accum, lr,
                                              loss=history_row["train_loss"], epoch_end=True,
                                              **metrics))
        state.history.append(history_row)
        epoch = state.epoch
        state.end_epoch()
        if self.settings.checkpoint_dir is not None:
            self._save_last()
        else:
            self.checkpoints.keep(self.state_dict())
        self.bus.emit(EpochEnded(epoch, state.global_step, state.history, view_row))

    # ------------------------------------------------------------------ set-up
    def open(self, train, val) -> tuple:
        """The loaders and the plan of this fit."""
        train_loader = self.loader(train, shuffle=True, what="train")
        val_loader = None if val is None else self.loader(val, shuffle=False, what="val")
        self.state.plan = self.plan_for(train_loader, self.bus.note)
        self.state.loaders = [ld for ld in (train_loader, val_loader) if ld is not None]
        self.state.train_gen = getattr(train_loader, "generator", None)
        return train_loader, val_loader

    def plan_for(self, train_loader, note=lambda kind, message: None) -> Plan:
        """Epochs, batches and optimizer steps of a fit on ``train_loader`` (``steps_per_epoch``,
        ``grad_accum`` and quick mode's caps applied; ``note`` hears quick mode's cap)."""
        s = self.settings
        epochs, batches, said = plan_epochs(train_loader, s.epochs, s.steps_per_epoch,
                                            s.grad_accum, quick())
        if said:
            note("quick", said)
        steps = math.ceil(batches / s.grad_accum)
        return Plan(epochs, batches, steps, epochs * steps)

    def begin(self, pending: dict | None) -> None:
        """A fresh run state: ``pending`` (a checkpoint to continue from) or a seeded start."""
        self.state = RunState.fresh(self.state.events, carry=self.state)
        if self.learner.guard is not None:
            self.learner.guard.reset()  # a resumed run loads the checkpoint's guard below
        if pending is not None:
            self.load_state_dict(pending)
        elif self.settings.seed is not None:
            seed_everything(self.settings.seed)
        self.bind_schedule()

    def bind_schedule(self) -> None:
        """The schedule told the run's optimizer steps (a factory builds its scheduler now: an
        error before the first step); a resumed fit's replaced scheduler is said once."""
        schedule = self.learner.schedule
        schedule.bind(self.state.plan.total_steps)
        if getattr(schedule, "replaced", None):
            self.bus.note("schedule", schedule.replaced)

    def loader(self, data, shuffle: bool, what: str, note=None):
        """Batches of ``data`` for this run (``note``: who hears the loader's notes; default
        the bus)."""
        s = self.settings
        return make_loader(data, batch_size=s.batch_size, shuffle=shuffle, what=what,
                           seed=s.seed, strategy=self.placement.strategy,
                           loader_kwargs=self.loader_kwargs, note=note or self.bus.note)

    def build_step(self, compiled: bool) -> None:
        self.placement.build_step(compiled, self.bus.say, updating=self.interrupt.updating
                                  if self.interrupt else contextlib.nullcontext,
                                  state=self.state)

    def _start_view(self, blocks: list[str], started: bool) -> None:
        """The view for this fit (in an isolated worker: the channel to the kernel's view);
        ``started``: the kernel's view already runs (continuing after the worker was lost)."""
        if not started:
            channel, strategy = self.heartbeat.channel, self.placement.strategy
            self.progress.view = self.progress.make_view(self.settings.live, channel=channel,
                                                         is_main=strategy.is_main)
            self.bus.emit(Started(self.run_info()))
        self.bus.flush()
        if self.settings.grad_checkpointing:
            self.bus.say("grad_checkpointing", (
                f"recomputing activations of {len(blocks)} blocks ({', '.join(blocks[:6])}"
                f"{'...' if len(blocks) > 6 else ''}) in backward") if blocks else (
                "no top-level block with parameters and without batch norm to checkpoint; "
                "running without"))

    def run_info(self) -> dict:
        plan, model, s = self.state.plan, self.learner.model, self.settings
        applied = self.placement.applied_speedups
        chosen = s.chosen(self.placement.precision.name,
                          tuple(applied.applied) if applied is not None else ())
        return {"epochs": plan.epochs, "steps_per_epoch": plan.steps_per_epoch,
                "batch_size": s.batch_size, "grad_accum": s.grad_accum, "chosen": chosen,
                "total_steps": plan.total_steps, "device": str(self.placement.device),
                "precision": self.placement.precision.name, "model": type(model).__name__,
                "n_params": sum(p.numel() for p in model.parameters()),
                "monitor": s.monitor, "quick": quick(), "pid": os.getpid(),
                "metric": "val_accuracy" if s.task == "classification" else None}

    def grace(self, what: str) -> float | None:
        return self.heartbeat.grace(what, compiling=bool(self.placement.compile),
                                    device_type=self.placement.device.type, note=self.bus.note)

    # ------------------------------------------------------------------ stops and validation
    def stop_asked(self) -> Stop | None:
        """Whether a stop was asked, and how: Ctrl-C (here, or the kernel's when in a worker),
        a callback's ``trainer.should_stop`` or the Stop button."""
        if self.interrupt is not None and self.interrupt.requested:
            return Stop.INTERRUPT
        if self.stop_flag():
            return Stop.CALLBACK
        if self.heartbeat.in_worker:
            return self.heartbeat.stop_asked()
        return Stop.STOP_BUTTON if self.progress.stop_requested else None

    def _stop(self, reason: Stop, message: str | None) -> bool:
        if message:
            folder = self.settings.checkpoint_dir
            self.bus.say(reason.value, message + (f"; checkpoint saved in {folder}" if folder
                                                  else "; no checkpoint_dir, state kept in "
                                                  "memory"))
        self._save_last()
        self.state.stopped = reason
        return True

    def _validate(self, loader) -> dict:
        scores = scores_of(*self.predict(loader, with_targets=True, phase="validation"),
                           task=self.settings.task)
        metrics = {"val_" + k: v for k, v in scores.items()}
        self.heartbeat.beat("step")
        return metrics

    def _validate_epoch(self, val_loader) -> tuple[dict, bool]:
        """The epoch's validation (reused when ``val_every`` just ran); whether to stop."""
        if val_loader is None:
            return {}, False
        if self.state.last_val[0] == self.state.global_step:
            return self.state.last_val[1], False
        metrics = self._validate(val_loader)
        return metrics, self._after_validation(metrics)

    def _after_validation(self, metrics: dict) -> bool:
        """Track the best weights; True when early stopping says stop (on every rank)."""
        state, stopping, learner = self.state, self.stopping, self.learner
        said = stopping.check(metrics)
        if said and not any(e.kind == "nonfinite_targets" for e in state.events):
            self.bus.say("nonfinite_targets", said)
        improved = stopping.improved(state.best, metrics)
        if improved is None:
            return False
        stopping.record(state.best, metrics, improved, state.global_step, state.epoch,
                        lambda: recovery.to_cpu(learner.eval_model(True).state_dict()))
        if improved:
            best = state.best
            self.checkpoints.save_best({"model": best.model, "monitor": self.settings.monitor,
                                        "value": best.value, "epoch": best.epoch,
                                        "global_step": best.step,
                                        "ema": learner.ema is not None})
        note = tell_validation(learner.schedule, improved, metrics.get(self.settings.monitor))
        if note:
            self.bus.say("lr_plateau", note)
        if self.placement.strategy.agree(stopping.should_stop(state.best)):
            self.bus.say("early_stop", stopping.message(state.best))
            return True
        return False

    def predict(self, loader, with_targets: bool, phase: str = "evaluate") -> tuple:
        """(predictions, targets, loss, non-finite targets) on ``loader`` in this process."""
        self.placement.place([loader], self.bus.note, self.bus.pending)
        in_fit = self.fitting
        return predict_loader(
            self.learner.eval_model(in_fit), loader, strategy=self.placement.strategy,
            precision=self.placement.precision, loss_fn=self.learner.loss_fn,
            with_targets=with_targets,
            # every batch: Ctrl-C or Stop ends a long validation within one batch (a callback's
            # stop waits for the step's end, as in process)
            stop_requested=lambda: (in_fit or self.heartbeat.in_worker)
            and self.stop_asked() not in (None, Stop.CALLBACK),
            cast=self.batch_check.cast, on_batch=lambda: self.heartbeat.beat(phase))

    def _finish(self, failed: bool) -> None:
        """Restore best/EMA weights, close the view (the last checkpoint is already written)."""
        best, model, learner = self.state.best, self.learner.model, self.learner
        self.placement.end_fit()
        if failed:
            self.checkpoints.save_crash(self.placement.strategy.file_ready)
        elif self.settings.early_stopping and best.model is not None:
            model.load_state_dict(best.model)
            self.bus.say("best_restored", f"model holds the best weights ({self.settings.monitor}"
                         f" {best.value:.4g} at epoch {best.epoch}, step {best.step})")
        elif learner.ema is not None:
            model.load_state_dict(learner.ema.module.state_dict())
            self.bus.say("ema_weights", "model holds the EMA weights (raw weights are in "
                         "last.pt)" if self.settings.checkpoint_dir else
                         "model holds the EMA weights")
        self.bus.emit(Ended({**self.summary(), "failed": failed}))

    def summary(self, stopped: Stop | None = None) -> dict:
        """What the view's end() and report() show (speeds are wall clock: progress.py)."""
        return self.progress.summary(self.state, self.settings.monitor, self.placement.device,
                                     self.placement.precision.name, stopped)

    def _save_last(self) -> None:
        self.heartbeat.beat("checkpoint")
        self.checkpoints.save_last(self.placement.strategy.for_file(self.state_dict()))
        self.heartbeat.beat("step")

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """Everything needed to continue exactly (see ``Trainer.state_dict``)."""
        gen, s, placement = self.state.train_gen, self.settings, self.placement
        rng = self.state.pending_rng if self.state.pending_rng is not None else {
            **rng_state(), "loader": gen.get_state() if gen is not None else None}
        return {"kind": "last", **self.learner.state_dict(placement.strategy),
                "rng": recovery.to_cpu(rng), **recovery.to_cpu(self.state.state_dict()),
                "scaler": placement.precision.scaler.state_dict(),
                "config": {"lr": s.lr, "epochs": s.epochs, "batch_size": s.batch_size,
                           "grad_accum": s.grad_accum, "seed": s.seed,
                           "model": type(self.learner.model).__name__},
                "device": str(placement.device), "precision": placement.precision.name}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``; a checkpoint of another batch size continues the epoch
        after about as many samples (said)."""
        self.restore(state, events=True)
        s = self.settings
        old = (state.get("config", {}).get("batch_size"), state.get("config", {}).get("grad_accum"))
        if None not in old and old != (s.batch_size, s.grad_accum) and self.state.batches_done:
            samples = self.state.batches_done * old[0]
            self.state.batches_done = samples // s.batch_size // s.grad_accum * s.grad_accum
            self.bus.note("resume", f"the checkpoint used batch_size={old[0]} x grad_accum="
                          f"{old[1]}, this run {s.batch_size} x {s.grad_accum}: the epoch "
                          f"continues after about {samples} samples, not bit for bit")

    def restore(self, state: dict, events: bool = False) -> None:
        """Weights, optimizer, schedule, scaler, EMA, guard and the run's state."""
        placement = self.placement
        self.learner.load_state_dict(state, placement.strategy)
        if placement.precision.scaler.is_enabled() and state["scaler"]:
            placement.precision.scaler.load_state_dict(state["scaler"])
        self.state.load_state_dict(state, events=events)
        placement.resume_micro(self.state.micro)

    # ------------------------------------------------------------------ recovery
    def _move_to_cpu(self, detail: str) -> Epoch:
        """Sticky device error: continue the whole run on the CPU from the last good state
        (a CPU-side snapshot; nothing reads the lost device again)."""
        lost, snapshot = self.placement.device, self.checkpoints.snapshot
        self.bus.say("device_lost", f"{detail} — {lost} cannot be trusted again in this "
                     "process. Moving the run (model, optimizer state, scaler, EMA) to the CPU "
                     f"and continuing from the last good state (step "
                     f"{snapshot['position']['global_step']}) in fp32; steps will be slower")
        self.continue_on_cpu()
        self.learner.rebuild_on_cpu()
        self.restore(snapshot)
        self.state.micro = None  # the GPU's micro-batch size means nothing here
        self.build_step(compiled=False)
        return Epoch.REWOUND

    def continue_on_cpu(self) -> None:
        """The device is lost: never used again in this process; the rest runs on the CPU in
        fp32 (no pinned memory, no compile)."""
        self.placement.continue_on_cpu(self.state.loaders)
        self.loader_kwargs["pin_memory"] = False

    def _restore_after_bad_steps(self) -> Epoch:
        """``patience`` bad steps in a row: back to the last good state with the lower LR;
        a bounded number of times at the same place, then a clear error."""
        state, snapshot, guard = self.state, self.checkpoints.snapshot, self.learner.guard
        at = snapshot["position"]["global_step"]
        state.restores[at] = state.restores.get(at, 0) + 1
        if state.restores[at] > 3:
            raise FloatingPointError(
                f"the loss stays non-finite or spiking after 3 restores to step {at} (epoch "
                f"{snapshot['position']['epoch']}), with the learning rate cut to "
                f"{state.lr_scale:.3g} of the schedule. Likely causes: non-finite values in a "
                "custom loss or model output, or a learning rate far too high; check "
                "trainer.steps and trainer.events")
        lr_scale = state.lr_scale
        self.bus.say("restore", f"{guard.patience} bad steps in a row: restoring the last good "
                     f"state (step {at}) and keeping the lower learning rate ({lr_scale:.3g} "
                     "of the schedule)")
        self.restore(snapshot)
        state.lr_scale = lr_scale
        guard.streak = 0
        return Epoch.REWOUND

    def _interrupted(self) -> None:
        """A KeyboardInterrupt inside a step or a validation (or a stop asked during one):
        drop the step or the validation, keep the last good weights."""
        self.learner.optimizer.zero_grad(set_to_none=True)
        rec = self.placement.recovery
        if rec.phase == "update":  # the optimizer may have been half-way through
            self.restore(self.checkpoints.snapshot)
            self.bus.say("restore", "interrupted during the optimizer update: restored the last "
                         f"good state (step {self.state.global_step})")
        rec.phase = "idle"
        if self.stop_asked() is Stop.STOP_BUTTON:
            self._stop(Stop.STOP_BUTTON, "Stop clicked: the current step or validation was "
                       "dropped")
        else:
            self._stop(Stop.INTERRUPT, "interrupted: the current step or validation was dropped")
