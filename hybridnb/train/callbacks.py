"""Callbacks: user code the Trainer calls at a fit's start, after each optimizer step, after
each epoch, and at its end.

The protocol (every method optional; a missing one is skipped)::

    class MyCallback:
        def on_fit_start(self, trainer): ...
        def on_step_end(self, trainer, row): ...    # row: global_step, epoch, step, loss, lr, ...
        def on_epoch_end(self, trainer, row): ...   # row: the epoch's history row, a dict
        def on_fit_end(self, trainer): ...

**Stopping a run**: a hook sets ``trainer.should_stop = True`` (return values are ignored). The
fit ends cleanly after the current step (or right after the epoch, from ``on_epoch_end``): the
step's weights are kept, the last checkpoint written, ``trainer.stopped == "callback"``, and
``on_fit_end`` is called; ``fit(..., resume=True)`` continues from there. Each fit starts with
``should_stop = False``. In an isolated fit the flag reaches the worker through the same stop
flag as the Stop button; the worker runs a step or so ahead of the rows the kernel has seen, so
it stops at the first step boundary after the flag arrives.

They run once, in the user's process (the notebook's kernel), also when the fit trains in an
isolated worker: the worker sends each epoch's row, the kernel calls the callbacks with it, so a
callback defined in a notebook cell can change that notebook's state. During an isolated fit
``trainer.model`` in the kernel is updated only when the fit ends; use ``row`` (and
``checkpoint_dir``) in ``on_epoch_end``. ``on_fit_end`` is called when fit returns normally
(also after early stopping or an interrupt), with the weights fit chose in ``trainer.model``.

An exception inside a callback ends the fit and is re-raised as ``CallbackError`` naming the
callback's class and method (the original as its cause); the run's last checkpoint is kept as
for any error, so ``fit(..., resume=True)`` continues after the fix.
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
    """``hook(*args)`` on every callback that has it; an exception becomes a ``CallbackError``
    naming the callback and the hook."""
    for cb in callbacks:
        method = getattr(cb, hook, None)
        if method is None:
            continue
        try:
            method(*args)
        except Exception as exc:  # the user's code: any error, wrapped and re-raised
            raise CallbackError(f"callback {type(cb).__name__}.{hook} raised "
                                f"{type(exc).__name__}: {exc}") from exc
