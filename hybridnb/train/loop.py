"""The Loop: a fit's epochs and steps wherever it runs (the kernel, or an isolated worker). Read
``fit`` -> ``_epochs`` -> ``_epoch`` -> ``_between_steps`` top to bottom, as fastai's ``_do_fit``.

It runs over the Trainer's parts and one data-only ``RunState`` (state.py); a fit's set-up and
end are ``opening.fitting``'s, saved states and rewinds ``saved.py``'s. What happens is emitted
on the ``Bus``; a listener that raises ``CancelFit`` ends the fit normally after the current step.
"""

from __future__ import annotations

import math

from hybridnb.events import StepRow
from hybridnb.measure.memory import reset_peak
from hybridnb.strategies.batches import batch_len
from hybridnb.train import opening, saved
from hybridnb.train.bus import Bus, StepEnded
from hybridnb.train.data import epoch_batches
from hybridnb.train.interrupt import STOP_WORDS, agreed_stop, stop_asked
from hybridnb.train.opening import Loaders
from hybridnb.train.settings import Settings
from hybridnb.train.state import RunState, Stop


class Loop:
    """Runs a fit over the parts; ``state`` is the run, ``settings`` the options in force."""

    def __init__(self, settings: Settings, *, learner, placement, checkpoints, progress,
                 heartbeat, batch_check, bus: Bus) -> None:
        self.settings, self.state = settings, RunState()
        self.learner, self.placement, self.checkpoints = learner, placement, checkpoints
        self.progress, self.heartbeat = progress, heartbeat
        self.batch_check, self.bus = batch_check, bus
        self.loaders = Loaders(settings.loader_kwargs)
        self.interrupt = None  # the GracefulInterrupt while a fit runs
        self.first_step = 0  # the global step this fit started at
        self.stop_flag = lambda: False  # the Trainer's ``should_stop`` (set by a callback)

    fitting = property(lambda self: self.interrupt is not None)

    def fit(self, train_loader, val_loader, view_started: bool = False) -> None:
        """The whole fit from ``state`` (the view already runs when ``view_started``)."""
        with opening.fitting(self, train_loader, view_started):
            self._epochs(train_loader, val_loader)

    def _epochs(self, train_loader, val_loader) -> None:
        """Epochs until done or stopped (``state.stopped`` says why it stopped early)."""
        while self.state.epoch < self.state.plan.epochs:
            try:
                if self._epoch(train_loader, val_loader):
                    continue
                if self.state.stopped is not None:  # Stop, Ctrl-C or early stopping
                    return
                metrics, stop = self.validation.at_epoch_end(val_loader)
            except KeyboardInterrupt:  # in a step, loading data or validating
                saved.after_interrupt(self)
                self._stop(Stop.STOP_BUTTON if stop_asked(self) is Stop.STOP_BUTTON else
                           Stop.INTERRUPT, "the current step or validation was dropped")
                return
            ended = self.progress.epoch_ended(self.state, self.learner.lr(), metrics,
                                              self.placement.device, self.settings.grad_accum)
            self.state.end_epoch()
            saved.save_last(self)
            self.bus.emit(ended)
            if stop:
                self.state.stopped = Stop.EARLY_STOPPING
                return
            if self.placement.strategy.agree(self.stop_flag()) and \
                    self.state.epoch < self.state.plan.epochs:  # asked on any rank: every rank
                self.bus.say(Stop.CALLBACK.value, "a callback set trainer.should_stop: stopping "
                             "after this epoch")
                self.state.stopped = Stop.CALLBACK  # the epoch's checkpoint is written
                return

    def _epoch(self, loader, val_loader) -> bool:
        """One epoch from the current position; True when it went back to the last good state
        (a lost device, bad steps), to run again."""
        state, learner, placement = self.state, self.learner, self.placement
        learner.start_epoch(state.epoch)
        if state.batches_done == 0:
            reset_peak(placement.device)
        monitor = self.progress.new_epoch(placement.device, state.global_step == self.first_step,
                                          placement.flops_per_sample, placement.precision.name)
        window = []
        batches = monitor.batches(epoch_batches(loader, state, self.bus))
        for i, batch in enumerate(batches, start=state.batches_done):
            if i >= state.plan.batches_per_epoch:
                break
            window.append(self.batch_check(batch))
            if len(window) < self.settings.grad_accum and i + 1 < state.plan.batches_per_epoch:
                continue
            learner.set_lr(learner.schedule.factor(state.global_step) * state.lr_scale)
            self.heartbeat.before_step(first=state.global_step == self.first_step)
            came, loss, detail = placement.recovery.run(window)
            if came == "device_lost":
                saved.continue_on_cpu(self, detail)
                return True
            if came == "restore":
                saved.after_bad_steps(self)
                return True
            n = sum(batch_len(b) for b in window)
            if came == "ok":
                state.acc.add(loss, n)
            state.batches_done += len(window)
            state.global_step += 1
            window = []
            monitor.step_done(n)
            loss, lr = math.nan if loss is None else loss, learner.lr()
            state.steps.append((state.global_step, state.epoch, loss, lr))
            row = StepRow(self.progress.row(state, self.settings.grad_accum, lr, loss=loss))
            self.bus.emit(StepEnded(state.global_step, state.epoch, loss, lr, row))
            with monitor.paused():
                if self._between_steps(val_loader):
                    return False  # stopped: ``state.stopped`` says why
        return False

    def _between_steps(self, val_loader) -> bool:
        """Stop requests, validation, checkpoints and snapshots; True when the fit stops here."""
        state, s = self.state, self.settings
        asked = agreed_stop(stop_asked(self), self.placement.strategy)
        if asked is not None:
            return self._stop(asked, "stopping after the current step")
        if s.val_every and state.global_step % s.val_every == 0 and val_loader is not None:
            if self.validation.between_steps(val_loader):
                return self._stop(Stop.EARLY_STOPPING, None)
        if s.checkpoint_every and state.global_step % s.checkpoint_every == 0:
            saved.save_last(self)
        elif (s.snapshot_every and state.global_step % s.snapshot_every == 0
              and (self.learner.guard is None or self.learner.guard.streak == 0)):
            self.checkpoints.keep(saved.state_dict(self))
        return False

    def _stop(self, reason: Stop, message: str | None) -> bool:
        """The fit stops here for ``reason`` (said with ``message``), its last state saved."""
        if message:
            folder = self.settings.checkpoint_dir
            kept = f"checkpoint saved in {folder}" if folder else \
                "no checkpoint_dir, state kept in memory"
            self.bus.say(reason.value, f"{STOP_WORDS[reason]}: {message}; {kept}")
        saved.save_last(self)
        self.state.stopped = reason
        return True
