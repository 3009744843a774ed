"""An isolated fit emits what an in-process fit emits: the worker forwards its bus events
unchanged and the kernel emits them again, so the view, loggers and callbacks hear the same
typed events, in the same order, with the same rows, either way."""

from __future__ import annotations

import math

from tiny import sine_data, sine_net

from hybridnb.events import Event
from hybridnb.train.bus import Ended, Started, StateKept, StepEnded
from hybridnb.train.trainer import Trainer

# said only where the fit runs in a worker: why it is isolated, how long the worker took to start
WORKER_ONLY = {"isolate", "worker_start"}


def stream(isolate: bool) -> list:
    tr = Trainer(sine_net(), device="cpu", batch_size=32, epochs=2, val_every=3, lr=1e-2,
                 seed=0, live=False, verbose=False, isolate=isolate, speedups=False,
                 precision="fp32")
    heard = []
    tr.bus.subscribe(heard.append)
    tr.fit(sine_data(128), val=sine_data(64, seed=1))
    assert tr.isolated is isolate
    return [ev for ev in heard if not (isinstance(ev, Event) and ev.kind in WORKER_ONLY)]


def described(ev) -> tuple:
    """What a listener reads of an event (times and process ids aside)."""
    if isinstance(ev, Event):
        return "Event", ev.kind, ev.message, ev.step, ev.epoch
    if isinstance(ev, Started):
        return "Started", {k: v for k, v in ev.run.items() if k != "pid"}
    if isinstance(ev, StateKept):
        return "StateKept", ev.step
    if isinstance(ev, Ended):
        return "Ended", ev.summary["stopped"], ev.summary["failed"], len(ev.summary["history"])
    row = {k: round(v, 4) if isinstance(v, float) and math.isfinite(v) else v
           for k, v in ev.row.items() if not k.endswith(("_s", "_pct", "mfu"))}
    return type(ev).__name__, getattr(ev, "step", None), type(ev.row).__name__, row


def test_an_isolated_fit_emits_what_an_in_process_fit_emits():
    here, worker = stream(isolate=False), stream(isolate=True)
    assert [described(ev) for ev in worker] == [described(ev) for ev in here]
    assert sum(isinstance(ev, StepEnded) for ev in worker) == 8
    assert [type(ev) for ev in worker[:2]] == [StateKept, Started] and isinstance(worker[-1], Ended)
