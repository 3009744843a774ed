"""The Loop: a fit's epochs and steps wherever it runs (the kernel, or an isolated worker:
``run_worker.py``). Read ``fit`` -> ``_epochs`` -> ``_epoch`` ->
``_between_steps`` top to bottom, as fastai's ``_do_fit`` / ``_do_epoch``.

It runs over the Trainer's parts (learner, placement, checkpoints, progress, stopping, heartbeat,
batch check, bus) and one data-only ``RunState`` (state.py; ``SAVED`` lists what a checkpoint
holds of it). The loaders are ``opening.Loaders``', the full saved state and the rewinds to it
``saved.py``'s, validation ``validation.Validation``'s. What happens is emitted on the ``Bus`` as
typed events; the view, loggers, callbacks and heartbeat listen. A listener that raises
``CancelFit`` ends the fit normally after the current step (lr_find's sweep does).
"""

from __future__ import annotations

import enum
import math

from hybridnb.events import EpochRow, StepRow
from hybridnb.measure.memory import reset_peak
from hybridnb.strategies.batches import batch_len
from hybridnb.train import opening, saved, setup
from hybridnb.train.blocks import checkpointed_blocks, say_checkpointed
from hybridnb.train.bus import Bus, Ended, EpochEnded, Started, StateKept, StepEnded
from hybridnb.train.data import epoch_batches
from hybridnb.train.interrupt import GracefulInterrupt, agreed_stop, stop_asked, stop_words
from hybridnb.train.opening import Loaders
from hybridnb.train.recovery import Came
from hybridnb.train.settings import Settings
from hybridnb.train.state import HISTORY_COLUMNS, RunState, Stop
from hybridnb.train.validation import Validation


class CancelFit(Exception):
    """Raised by a bus listener to end the fit now, normally (fastai's ``CancelFitException``)."""


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
        self.loaders = Loaders(settings.loader_kwargs)
        self.interrupt: GracefulInterrupt | None = None  # set while a fit runs
        self.first_step = 0  # the global step this fit started at
        self.stop_flag = lambda: False  # the Trainer's ``should_stop`` (set by a callback)
        checkpoints.on_keep = lambda state: bus.emit(StateKept(
            state["position"]["global_step"], state))

    fitting = property(lambda self: self.interrupt is not None)

    def fit(self, train_loader, val_loader, view_started: bool = False) -> None:
        """The whole fit from ``state`` (the view already runs when ``view_started``)."""
        s, placement = self.settings, self.placement
        grace = self.heartbeat.grace("set-up and the first step", compiling=bool(placement.compile),
                                     device_type=placement.device.type, bus=self.bus)
        self.heartbeat.beat("setup", grace=grace)
        placement.place(self.loaders.opened)
        placement.speed_up(train_loader, s.batch_size, self.state.plan.total_steps)
        # this fit's bookkeeping: its last validation, its restores to each step
        self.validation, self.rewind = Validation(self), saved.Rewind(self)
        failed = True
        with GracefulInterrupt() as self.interrupt, \
                checkpointed_blocks(self.learner.model, s.grad_checkpointing) as blocks, \
                setup.compile_settings(bool(placement.compile), placement.device,
                                       placement.precision):
            setup.build_step(self, compiled=bool(placement.compile))
            self.checkpoints.keep(saved.state_dict(self))
            self.first_step = self.state.global_step
            if not view_started:
                self.progress.view = self.progress.make_view(
                    s.live, channel=self.heartbeat.channel, is_main=placement.strategy.is_main)
                self.bus.emit(Started(opening.run_info(self)))
            self.bus.flush()
            say_checkpointed(blocks, s.grad_checkpointing, self.bus)
            self.heartbeat.beat("first step", grace=grace)
            try:
                self._epochs(train_loader, val_loader)
                failed = False
            except CancelFit:
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
                metrics, stop = self.validation.at_epoch_end(val_loader)
            except KeyboardInterrupt:  # in a step, loading data or validating
                self.rewind.after_interrupt()
                self._stop(Stop.STOP_BUTTON if stop_asked(self) is Stop.STOP_BUTTON else
                           Stop.INTERRUPT, "the current step or validation was dropped")
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
        learner.start_epoch(state.epoch)
        if state.batches_done == 0:
            reset_peak(placement.device)
        self.progress.new_epoch(placement.device, state.global_step == self.first_step,
                                placement.flops_per_sample, placement.precision.name)
        window = []
        batches = self.progress.batches(epoch_batches(loader, state, self.bus.say))
        for i, batch in enumerate(batches, start=state.batches_done):
            if i >= plan.batches_per_epoch:
                break
            window.append(self.batch_check(batch))
            if len(window) < self.settings.grad_accum and i + 1 < plan.batches_per_epoch:
                continue
            learner.set_lr(learner.schedule.factor(state.global_step) * state.lr_scale)
            self.heartbeat.before_step(first=state.global_step == self.first_step)
            outcome = placement.recovery.run(window)
            if outcome.kind is Came.DEVICE_LOST:
                self.rewind.to_cpu(outcome.detail)
                return Epoch.REWOUND
            if outcome.kind is Came.RESTORE:
                self.rewind.after_bad_steps()
                return Epoch.REWOUND
            n = sum(batch_len(b) for b in window)
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
        asked = agreed_stop(stop_asked(self), self.placement.strategy)
        if asked is not None:
            return self._stop(asked, "stopping after the current step")
        if s.val_every and state.global_step % s.val_every == 0 and val_loader is not None:
            if self.validation.between_steps(val_loader):
                return self._stop(Stop.EARLY_STOPPING, None)
        if s.checkpoint_every and state.global_step % s.checkpoint_every == 0:
            self._save_last()
        elif (s.snapshot_every and state.global_step % s.snapshot_every == 0
              and (self.learner.guard is None or self.learner.guard.streak == 0)):
            self.checkpoints.keep(saved.state_dict(self))
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
        self._save_last()
        self.bus.emit(EpochEnded(epoch, state.global_step, state.history, view_row))

    def _stop(self, reason: Stop, message: str | None) -> bool:
        if message:
            folder = self.settings.checkpoint_dir
            kept = f"checkpoint saved in {folder}" if folder else \
                "no checkpoint_dir, state kept in memory"
            self.bus.say(reason.value, f"{stop_words(reason)}: "
                         f"{message}; {kept}")
        self._save_last()
        self.state.stopped = reason
        return True

    def _save_last(self) -> None:
        """The last good state kept, and written when this fit has a ``checkpoint_dir``."""
        if self.settings.checkpoint_dir is None:
            return self.checkpoints.keep(saved.state_dict(self))
        self.heartbeat.beat("checkpoint")
        self.checkpoints.save_last(self.placement.strategy.for_file(saved.state_dict(self)))
        self.heartbeat.beat("step")

    def _finish(self, failed: bool) -> None:
        """The model takes the weights fit chose; the view ends (the last state is written)."""
        self.placement.end_fit()
        if failed and self.settings.checkpoint_dir is not None:
            self.checkpoints.save_crash(self.placement.strategy.file_ready)
        said = None if failed else self.learner.take_final_weights(self.state.best,
                                                                   self.settings)
        if said:
            self.bus.say(*said)
        summary = self.progress.summary(self.state, self.settings.monitor, self.placement.device,
                                        self.placement.precision.name)
        self.bus.emit(Ended({**summary, "failed": failed}))
