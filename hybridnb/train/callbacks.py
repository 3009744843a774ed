"""Callbacks: user code the Trainer calls at a fit's start, after each optimizer step, after
each epoch, and at its end (README: "Logs, callbacks, schedules, saved models")::

    class MyCallback:  # every method optional
        def on_fit_start(self, trainer): ...
        def on_step_end(self, trainer, row): ...    # row: global_step, epoch, step, loss, lr, ...
        def on_epoch_end(self, trainer, row): ...   # row: the epoch's history row, a dict
        def on_fit_end(self, trainer): ...

A hook sets ``trainer.should_stop = True`` to end the fit cleanly after the current step (or the
epoch); ``trainer.stopped == "callback"``. They run once, in the user's process, also when the
fit trains in an isolated worker (the worker's rows are heard in the kernel; ``trainer.model``
there is updated when the fit ends). An exception inside a callback ends the fit as a
``CallbackError`` naming the callback and method; the last checkpoint is kept.
"""

from __future__ import annotations

HOOKS = ("on_fit_start", "on_step_end", "on_epoch_end", "on_fit_end")


class CallbackError(RuntimeError):
    """An exception raised inside a user's callback (its ``__cause__``)."""


def check_callbacks(callbacks) -> tuple:
    """``callbacks=`` as a tuple of objects with at least one hook; clear errors otherwise."""
    if callbacks is None:
        return ()
    if not isinstance(callbacks, (list, tuple)):
        callbacks = [callbacks]
    for cb in callbacks:
        if isinstance(cb, type):
            raise TypeError(f"callbacks=[{cb.__name__}] passes the class: pass an instance, "
                            f"callbacks=[{cb.__name__}()]")
        if not any(callable(getattr(cb, h, None)) for h in HOOKS):
            raise TypeError(f"callbacks: {type(cb).__name__} has none of the methods "
                            f"{', '.join(HOOKS)}; a callback defines at least one")
    return tuple(callbacks)


def call(callbacks: tuple, hook: str, *args) -> None:
    """``hook(*args)`` on every callback that has it; an exception becomes a ``CallbackError``."""
    for cb in callbacks:
        method = getattr(cb, hook, None)
        if method is None:
            continue
        try:
            method(*args)
        except Exception as exc:  # the user's code: any error, wrapped and re-raised
            raise CallbackError(f"callback {type(cb).__name__}.{hook} raised "
                                f"{type(exc).__name__}: {exc}") from exc
