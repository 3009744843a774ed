"""Getting a button click to Python while the kernel is busy running the training cell.

A kernel executing a cell does not read its shell channel, so a widget's click waits until the
cell ends: too late for a Stop button. Two ways around it, tried in this order:

1. **Kernel subshells** (ipykernel >= 7): the button's comm routes its messages to a private
   subshell thread, which runs the click handler (it only sets a flag) while the main thread
   trains.
2. **jupyter-ui-poll** (kernels with ``do_one_iteration``, i.e. ipykernel 6): the training loop
   pumps pending messages between steps (throttled by the view). jupyter-ui-poll 1.1 silently
   does nothing on ipykernel 7.4, which is why subshells come first.

Where neither exists the button is disabled and says to interrupt the kernel instead (the
Trainer treats an interrupt exactly like Stop).
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any


class ClickRoute:
    """How clicks reach Python; ``mode`` is ``"subshell"``, ``"ui_poll"`` or ``"none"``."""

    mode = "none"

    def __init__(self, note: str = ""):
        self.note = note

    def poll(self) -> None:
        """Deliver pending clicks now (only the ui_poll route needs this)."""

    def close(self) -> None:
        """Release the subshell; safe to call twice."""


class SubshellRoute(ClickRoute):
    mode = "subshell"

    def __init__(self, kernel: Any, widget: Any, timeout: float = 5.0):
        super().__init__()
        if not hasattr(widget.comm, "_reply_subshell_for"):
            raise RuntimeError("this ipykernel's comms cannot be routed to a subshell")
        self._manager = kernel.shell_channel_thread.manager
        self._loop = self._manager._shell_channel_io_loop
        self._timeout = timeout
        sid = self.subshell_id = self._on_channel_thread(self._manager._create_subshell)
        widget.comm._reply_subshell_for = lambda data, default: sid  # clicks go to our subshell

    def _on_channel_thread(self, fn, *args):
        """Run ``fn`` on the kernel's shell-channel thread (where subshells are managed)."""
        future: Future = Future()

        def call():
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # broad: re-raised by result(), on the caller's thread
                future.set_exception(exc)

        self._loop.add_callback(call)
        try:
            return future.result(self._timeout)
        except FutureTimeout:
            raise TimeoutError(f"the kernel's shell-channel thread did not answer in "
                               f"{self._timeout} s") from None

    def close(self) -> None:
        sid, self.subshell_id = self.subshell_id, None
        if sid is not None:
            with contextlib.suppress(Exception):  # broad: the kernel is shutting down
                self._on_channel_thread(self._manager._delete_subshell, sid)


class UiPollRoute(ClickRoute):
    mode = "ui_poll"

    def poll(self) -> None:
        from jupyter_ui_poll import ui_events

        with ui_events() as ui_poll:
            ui_poll(20)


def route_clicks(widget: Any, kernel: Any | None = None) -> ClickRoute:
    """Choose how ``widget``'s clicks reach Python during a busy cell (see module doc)."""
    if kernel is None:
        from IPython import get_ipython

        kernel = getattr(get_ipython(), "kernel", None)
    if kernel is None:
        return ClickRoute("no running kernel delivers clicks: interrupt (Ctrl-C / ■) to stop; "
                          "the checkpoint and history are kept")
    reason = ""
    if getattr(kernel, "shell_channel_thread", None) is not None:
        try:
            return SubshellRoute(kernel, widget)
        except Exception as exc:  # broad: ipykernel internals; the fallback says why
            reason = f"kernel subshell unavailable ({type(exc).__name__}: {exc}); "
    if hasattr(kernel, "do_one_iteration"):  # jupyter-ui-poll: a dependency of hybridnb
        return UiPollRoute(reason.rstrip("; "))
    return ClickRoute(reason + "this kernel cannot deliver clicks while it trains: interrupt "
                      "the kernel (■) to stop; the checkpoint and history are kept")
