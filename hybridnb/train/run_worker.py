"""The runner that runs the same Loop in a supervised worker process (worker_fit.py: the job).

The kernel hands the worker a ``FitJob`` (the settings, the model, the data, the start state,
the notes not yet said); the worker builds the same Trainer from it and serves it (``serve``):
its Loop runs there, its view draws through the channel, and every state it keeps is sent. The
kernel applies each state as it arrives, so whatever ends the worker (an error, a kill, a hang,
Ctrl-C) it holds what an in-process run would: an error is re-raised after its state was
applied; a death or hang continues on the CPU here from the last state received (the start state
when none came); an interrupt keeps the last state.
"""

from __future__ import annotations

import contextlib
import functools
import random
import time

import pandas as pd

from hybridnb.processes.worker import startup as worker_startup
from hybridnb.train import isolate, outside_state, recovery
from hybridnb.train.bus import Ended, Lost, Started
from hybridnb.train.state import RunState, Stop
from hybridnb.train.worker_fit import FitJob, Hooks, KernelView, reraise


class Worker:
    """Fit (and afterwards evaluate, predict, lr_find, find_batch_size) in a spawned worker."""

    name = "worker"

    def fit(self, trainer, train, val, train_loader, val_loader, early=None) -> pd.DataFrame:
        """The fit in a supervised worker (``early``: the worker ``fit`` started first); if it
        dies or hangs, on the CPU here from the last state it sent."""
        device, start, loop = trainer.device, trainer.state_dict(), trainer.loop
        job = FitJob(trainer.settings.for_worker(), trainer.model, train, val, start,
                     list(trainer.bus.pending), random.getstate())
        trainer.progress.view = trainer.progress.make_view(trainer.live)  # drawn here
        kernel = KernelView(trainer.bus, lambda: loop.state.history)

        def on_message(message) -> None:
            if message.kind == "state":  # applied as it arrives: a lost worker loses nothing
                trainer.bus.pending.clear()  # the worker said them; its state holds them
                loop.restore(message.payload, events=True)
            kernel.on_message(message)

        job.sent_at = time.monotonic()
        try:
            out = run_job(trainer, job, prestarted=early, on_message=on_message,
                          should_stop=lambda: trainer.progress.stop_requested
                          or trainer.should_stop)
        except BaseException:  # the worker's own error: its last state is applied already
            kernel.finish()
            raise
        if out.status == "done":
            if out.result["stopped"] == Stop.STOP_BUTTON and trainer.should_stop and \
                    not trainer.progress.stop_requested:  # one flag carried both: the callback's
                out.result["stopped"] = Stop.CALLBACK
                if kernel.summary is not None:
                    kernel.summary["stopped"] = Stop.CALLBACK.value
            kernel.finish()
            trainer.bus.pending.clear()
            adopt(trainer, out.result)
            loop.restore(out.result, events=True)  # the model holds the weights fit chose
            bring_back(trainer, out.result.get("outside_state"))
            loop.state.stopped = out.result["stopped"]
            return trainer.history
        if out.state is None:  # nothing arrived: the start state (each state that came is
            loop.restore(start, events=True)  # applied already, as it arrived)
        if not kernel.started:  # lost before it drew anything: the kernel's view starts here
            trainer.bus.emit(Started(loop.run_info()))
        trainer.bus.emit(Lost(out.reason))
        if out.status == "interrupted":
            trainer.event("interrupt", f"{out.reason}; the last good state (step "
                          f"{loop.state.global_step}) is kept")
            trainer.bus.emit(Ended(trainer.summary(Stop.INTERRUPT)))
            return trainer.history
        lose_device(trainer)
        where = ("the run continues in this process" if device.type == "cpu" else
                 f"{device} is not used again in this process: the run continues on the CPU")
        trainer.event("worker_lost", f"{out.reason}. {where} from the last good state (step "
                      f"{loop.state.global_step}) in fp32"
                      + ("" if device.type == "cpu" else "; steps will be slower"))
        loop.state.micro = None
        loop.fit(train_loader, val_loader, view_started=True)
        return trainer.history

    def job(self, trainer, what: str, **job) -> tuple[bool, object]:
        """``job`` (a FitJob field) in a worker after an isolated fit; (True, its result).
        (False, None) when this process does it: the worker was lost (said once; the rest runs
        on the CPU here)."""
        out = run_job(trainer, FitJob(trainer.settings.for_worker(), trainer.model, **job))
        if out.status == "done":
            return True, out.result
        trainer.bus.note("worker_lost", f"{out.reason}; {what} on the CPU in this process")
        lose_device(trainer)
        return False, None


def bring_back(trainer, payload: dict | None) -> None:
    """What the worker's fit changed on the model outside its state dict (attributes,
    non-persistent buffers) set on the kernel's model; what could not come is said once."""
    lost = outside_state.apply(trainer.model, payload)
    if lost:
        trainer.event("outside_state", outside_state.describe(lost))


def lose_device(trainer) -> None:
    """The device is lost: never used again in this process; the rest runs on the CPU here."""
    trainer.loop.continue_on_cpu()
    trainer.isolated = False


def adopt(trainer, result: dict) -> None:
    """What the worker decided and measured (precision, speedups, FLOPs, batch size) is the
    kernel Trainer's from now on (nothing here touches the device). A worker that lost its GPU
    and finished on the CPU (its event said so) leaves the Trainer on the CPU too."""
    if result.get("device") == "cpu" and trainer.device.type != "cpu":
        lose_device(trainer)
    if trainer.placement.adopt(result["placement"]):
        trainer.loop.build_step(compiled=False)
    trainer.batch_size = result["config"]["batch_size"]
    trainer.grad_accum = result["config"]["grad_accum"]


def run_job(trainer, job: FitJob, **supervise):
    """``job`` in a fresh worker process (spawned: whatever this process did before, CUDA,
    threads, OpenMP, cannot break it); the worker's own error is re-raised here."""
    out = isolate.run_isolated(functools.partial(work, type(trainer), job), start="spawn",
                               step_timeout=trainer.settings.step_timeout, **supervise)
    if out.status == "error":
        raise reraise(out.error)
    return out


def work(trainer_class, job: FitJob, channel) -> object:
    """In the isolated worker: a Trainer (``trainer_class``) built from the job serves it."""
    hooks = Hooks(job.hooks)
    fits = job.predict is None and job.find_batch is None and job.lr_find is None
    watch = outside_state.Watch(job.model) if fits else None  # the model as the kernel sent it
    settings, hook_notes = hooks.settings(job.settings)
    trainer = trainer_class.from_settings(job.model, settings, channel=channel, hooks=hooks)
    return serve(trainer, job, hook_notes, moved=settings.device != job.settings.device,
                 watch=watch)


def serve(trainer, job: FitJob, hook_notes: list, moved: bool,
          watch: outside_state.Watch | None = None) -> object:
    """In the isolated worker: the job's fit (or evaluation, lr_find, batch-size search) here;
    returns the final state (or the result). ``moved``: a hook changed the device (the
    kernel's run stays on the one it believes in). ``watch``: the model's state outside its
    state dict as it arrived; a fit's result carries what changed (``outside_state``)."""
    channel, loop, bus = trainer.heartbeat.channel, trainer.loop, trainer.bus
    if job.predict is not None or job.find_batch is not None or job.lr_find is not None:
        channel.heartbeat(phase="evaluate", grace=loop.grace("the first batch"))
        bus.pending.clear()
        if job.predict is not None:
            data, with_targets = job.predict
            return loop.predict(loop.loader(data, shuffle=False, what="data"), with_targets)
        if job.lr_find is not None:
            return trainer.lr_find(job.lr_find[0], **job.lr_find[1])
        dataset, kwargs = job.find_batch
        found = trainer.find_batch_size(dataset, **kwargs)
        return {"found": found, "batch_size": trainer.batch_size,
                "grad_accum": trainer.grad_accum, "events": trainer.events}
    bus.pending[:] = list(job.notes or []) + hook_notes
    began = worker_startup()
    if job.sent_at is not None and {"spawned_at", "ready_at"} <= set(began):
        bus.pending.append(("worker_start", isolate.startup_note(
            began["spawned_at"], began["ready_at"], job.sent_at)))
    channel.heartbeat(phase="setup")  # the job arrived: alive (its faults come later)
    if job.py_random is not None:
        random.setstate(job.py_random)
    train_loader, val_loader = loop.open(job.train, job.val)
    loop.state = RunState.fresh([], carry=loop.state)
    loop.load_state_dict(job.start)
    loop.bind_schedule()
    try:
        loop.fit(train_loader, val_loader)
    except BaseException:
        # whatever ended the fit, the kernel gets the state the worker holds now (what an
        # in-process run would hold), then the error (best effort: the pipe may be gone)
        with contextlib.suppress(Exception):
            channel.state(recovery.to_cpu(loop.state_dict()))
        raise
    trainer.heartbeat.beat("hand-over")
    state = recovery.to_cpu(loop.state_dict())
    if moved:
        state["device"] = job.settings.device
    if watch is not None:
        state["outside_state"] = watch.changes().to_payload()
    return {**state, "stopped": loop.state.stopped, "placement": trainer.placement.facts()}
