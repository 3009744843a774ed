"""``Trainer.fit`` in an isolated worker: what the worker runs and what the kernel does with it.

The kernel (the notebook's process) never touches the GPU: it forks a worker (``isolate.py``)
that places the model and data on the device and runs the ordinary loop. The worker's live view
is a ``ChannelView`` that sends every call to the kernel, where the real renderer draws it (the
Stop button keeps working); at every snapshot and checkpoint the worker sends its state. When
the worker finishes, the kernel loads its final state into the Trainer (the model object the
user passed ends with the trained weights). When it dies (a signal, an abort or segfault in a C++
thread) or hangs past ``step_timeout``, the kernel records an event naming what happened and
continues the run on the CPU from the last state it received; ``history`` stays continuous.

A mixin of ``Trainer`` (the class is split by concern so the loop stays on one screen).
"""

from __future__ import annotations

import builtins
import random

import torch

from hybridnb.live import make_view
from hybridnb.train import isolate, recovery


class ChannelView:
    """The worker's live view: each call is sent to the kernel, which draws it."""

    def __init__(self, channel) -> None:
        self.channel = channel

    def start(self, run: dict) -> None:
        self.channel.send("view", ("start", run))

    def update(self, row: dict) -> None:
        self.channel.send("view", ("update", row))

    def event(self, ev) -> None:
        self.channel.send("view", ("event", ev))

    def end(self, summary: dict) -> None:
        self.channel.send("view", ("end", summary))
        self.channel.flush()

    @property
    def stop_requested(self) -> bool:
        return self.channel.stop_requested()


class WorkerError(Exception):
    """The traceback of an error raised in the isolated worker (the cause of the re-raise)."""


class Isolation:
    """``fit`` through an isolated worker, and the kernel's answer to how the worker ended."""

    def _fit_isolated(self, train_loader, val_loader):
        """Run the fit in a worker; returns the history (see the module doc)."""
        device, start = self.device, self.state_dict()
        py_random = random.getstate()  # a forked child reseeds Python's random module
        self._view = make_view(self.live)

        def work(channel):
            _in_worker(self, channel)
            random.setstate(py_random)
            self._fit_here(train_loader, val_loader)
            return {**recovery.to_cpu(self.state_dict()), "stopped": self.state.stopped}

        def on_message(m) -> None:
            if m.kind == "view":
                method, arg = m.payload
                getattr(self._view, method)(arg)

        out = isolate.run_isolated(work, on_message=on_message, step_timeout=self.step_timeout,
                                   should_stop=lambda: bool(self._view.stop_requested))
        if out.status == "done":
            self._restore(out.result, events=True)  # the model holds the weights fit chose
            self.state.stopped = out.result["stopped"]
            return self.history
        self._restore(out.state or start, events=True)
        if out.status == "error":
            raise _reraise(out.error)
        if out.status == "interrupted":
            self.event("interrupt", f"{out.reason}; the last good state (step "
                       f"{self.state.global_step}) is kept")
            self._view.end(self.summary("interrupt"))
            return self.history
        self._continue_on_cpu()
        self.event("worker_lost", f"{out.reason}. {device} is not used again in this process: the "
                   f"run continues on the CPU from the last good state (step "
                   f"{self.state.global_step}) in fp32; steps will be slower")
        self.state.micro = None
        return self._fit_here(train_loader, val_loader, view_started=True)


    def _predict_isolated(self, loader, with_targets: bool):
        """evaluate/predict after an isolated fit: in a worker as well (the kernel keeps away
        from the GPU); if the worker dies, on the CPU here, said once."""
        def work(channel):
            _in_worker(self, channel)
            return self._predict(loader, with_targets)

        out = isolate.run_isolated(work, step_timeout=self.step_timeout)
        if out.status == "done":
            return out.result
        if out.status == "error":
            raise _reraise(out.error)
        self._note("worker_lost", f"{out.reason}; predicting on the CPU in this process")
        self._continue_on_cpu()
        return self._predict(loader, with_targets)


def _in_worker(trainer, channel) -> None:
    """The forked copy of the Trainer becomes the one that trains: no further isolation, the
    channel to the kernel, one CPU thread (libgomp's thread pool does not survive a fork)."""
    trainer.isolated, trainer._channel = False, channel
    torch.set_num_threads(1)


def _reraise(error: dict) -> BaseException:
    """The worker's exception, rebuilt in the kernel with the same type and message when it is
    a builtin one (a RuntimeError otherwise), its traceback as the cause."""
    cls = getattr(builtins, error.get("type", ""), None)
    message = error.get("message", "")
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        cls, message = RuntimeError, f"{error.get('type')}: {message}"
    exc = cls(f"{message} (raised in the isolated training worker)")
    exc.__cause__ = WorkerError(error.get("traceback", ""))
    return exc
