"""Callbacks: the user's objects with any of ``on_fit_start(trainer)``, ``on_step_end(trainer,
row)``, ``on_epoch_end(trainer, row)``, ``on_fit_end(trainer)`` (rows as dicts), run in the user's
process, also for an isolated fit. What a hook may do (``trainer.should_stop = True``) and what
an error in one does: README, "Logs, callbacks, schedules, saved models"."""

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
