"""The kernel's side of an isolated fit (worker_fit.py: the worker's).

Each event the worker forwards is emitted again on the Trainer's bus (its view, loggers and
callbacks hear an isolated fit as one in process) and each state is applied as it arrives, so
whatever ends the worker the kernel holds what an in-process run would: an error is re-raised;
a death or hang continues on the CPU here from the last state received; an interrupt keeps the
last state. A stop asked here travels as one reason: "stop", "callback" or "interrupt".
"""

from __future__ import annotations

import builtins
import functools
import random
import time

from hybridnb import platform
from hybridnb.train import isolate, opening, outside_state, saved, worker_fit
from hybridnb.train.bus import Ended, EpochEnded, Started, StateKept
from hybridnb.train.heartbeat import EVENT
from hybridnb.train.state import Stop
from hybridnb.train.worker_fit import FitJob, FitResult

NOTICE = "worker_notice"  # a notice said around the job (payload, the next spare)


class Relay:
    """The worker's messages on ``loop``'s bus; its ``Ended`` held until the final state is here
    (``finish``): a worker lost during the hand-over leaves the view open for the run here."""

    def __init__(self, loop, carried: int) -> None:
        self.loop, self.carried, self.started, self.ended = loop, carried, False, None

    def hear(self, message) -> None:
        if message.kind == "state":  # applied as it arrives: a lost worker loses nothing
            state = message.payload  # its events came one by one: the run's already hold them
            saved.restore(self.loop, state)
            self.loop.bus.emit(StateKept(state["position"]["global_step"], state))
        elif message.kind == EVENT:
            event = message.payload
            if isinstance(event, Ended):
                self.ended = event
                return
            if isinstance(event, EpochEnded):  # as the worker's end_epoch: the next row's events
                self.loop.state.epoch_first_event = len(self.loop.state.events)
            self.loop.bus.emit(event)
            if isinstance(event, Started):  # the job's notes: the worker says them just after
                self.started = True
                del self.loop.bus.pending[:self.carried]
                self.loop.bus.flush()  # this process's own notes (notices, loggers'): said now

    def finish(self) -> None:
        if self.ended is not None:
            self.loop.bus.emit(self.ended)


def fit(trainer, train, val, train_loader, val_loader, early=None) -> None:
    """The fit in a supervised worker (``early``: the worker ``fit`` started first); if it
    dies or hangs, on the CPU here from the last state it sent."""
    device, loop = trainer.device, trainer.loop
    job = FitJob(trainer.settings.for_worker(), trainer.model, train, val, trainer.state_dict(),
                 list(trainer.bus.pending), random.getstate(), time.monotonic())
    trainer.progress.view = opening.make_view(trainer.live)  # drawn here
    relay = Relay(loop, len(job.notes))
    try:  # a notice around the job (platform.say): said once the view started, or the next fit
        with platform.notices_to(lambda sentence: trainer.bus.note(NOTICE, sentence)):
            out = run_job(trainer, job, prestarted=early, on_message=relay.hear,
                          should_stop=lambda: "callback" if trainer.should_stop
                          else trainer.progress.view.stop_requested)
    except BaseException:  # the worker's own error: its last state is applied already
        relay.finish()
        raise
    if out.status == "done":
        relay.finish()
        adopt(trainer, out.result)
        return
    if not relay.started:  # lost before it drew anything: the kernel's view starts here
        trainer.bus.emit(Started(opening.run_info(loop)))
    if out.status == "interrupted":
        trainer.event("interrupt", f"{out.reason}; the last good state (step "
                      f"{loop.state.global_step}) is kept")
        trainer.bus.emit(Ended(trainer.summary(Stop.INTERRUPT)))
        return
    lose_device(trainer)
    where = ("the run continues in this process" if device.type == "cpu" else
             f"{device} is not used again in this process: the run continues on the CPU")
    trainer.event("worker_lost", f"{out.reason}. {where} from the last good state (step "
                  f"{loop.state.global_step}) in fp32"
                  + ("" if device.type == "cpu" else "; steps will be slower"))
    loop.state.micro = None
    loop.fit(train_loader, val_loader, view_started=True)


def job(trainer, what: str, fn, *args, **kwargs) -> tuple[bool, object]:
    """(True, ``fn(loop, *args, **kwargs)``) on a worker's Loop after an isolated fit; (False,
    None) when the worker was lost (said once; this process does it, on the CPU)."""
    def hear(message) -> None:  # the job's events (a trial fit's view, steps, notes) as in process
        if message.kind == EVENT:
            if isinstance(message.payload, Started):
                trainer.progress.view = opening.make_view(trainer.live)  # drawn here
            trainer.bus.emit(message.payload)

    out = run_job(trainer, worker_fit.LoopJob(trainer.settings.for_worker(), trainer.model, fn,
                                              args, kwargs), on_message=hear)
    if out.status == "done":
        return True, out.result
    trainer.bus.note("worker_lost", f"{out.reason}; {what} on the CPU in this process")
    lose_device(trainer)
    return False, None


def lose_device(trainer) -> None:
    """The device is lost: never used again in this process; the rest runs on the CPU here."""
    trainer.placement.continue_on_cpu(trainer.loop.loaders)
    trainer.isolated = False


def adopt(trainer, result: FitResult) -> None:
    """The worker's fit is the Trainer's: its final state (its device too), what it decided and
    measured (nothing here touches the device) and what it changed outside its state dict."""
    state, loop = result.state, trainer.loop
    if state["device"] == "cpu" and trainer.device.type != "cpu":
        lose_device(trainer)
    if trainer.placement.adopt(result.placement):
        loop.placement.build_step(loop)
    trainer.batch_size = state["config"]["batch_size"]
    trainer.grad_accum = state["config"]["grad_accum"]
    saved.restore(loop, state)  # its events came one by one: the run's already hold them
    if lost := outside_state.apply(trainer.model, result.outside_state):
        trainer.event("outside_state", outside_state.describe(lost))
    loop.state.stopped = result.stopped


def run_job(trainer, job, **supervise):
    """``job`` in a fresh worker process (spawned: whatever this process did before, CUDA,
    threads, OpenMP, cannot break it); the worker's own error is re-raised here."""
    out = isolate.run_isolated(functools.partial(worker_fit.work, job), start="spawn",
                               step_timeout=trainer.settings.step_timeout, **supervise)
    if out.status == "error":
        raise reraise(out.error)
    return out


class WorkerError(Exception):
    """The traceback of an error raised in the isolated worker (the cause of the re-raise)."""


def reraise(error: dict) -> BaseException:
    """The worker's exception rebuilt here: a builtin type or KeyboardInterrupt as itself (else
    a RuntimeError), with its message and the worker's traceback as the cause."""
    cls = getattr(builtins, error.get("type", ""), None)
    message = error.get("message", "")
    where = " (raised in the isolated training worker)"
    if not (isinstance(cls, type) and issubclass(cls, (Exception, KeyboardInterrupt))):
        cls, message = RuntimeError, f"{error.get('type')}: {message}"
    try:
        exc = cls(message + where)
    except TypeError:  # a builtin that takes more arguments (UnicodeDecodeError)
        exc = RuntimeError(f"{error.get('type')}: {message}{where}")
    exc.__cause__ = WorkerError(error.get("traceback", ""))
    return exc
