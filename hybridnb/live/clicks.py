"""Getting a button click to Python while the kernel is busy running the training cell.

A kernel executing a cell does not read its shell channel, so a widget's click waits until the
cell ends — too late for a Stop button. Two ways around it, tried in this order:

1. **Kernel subshells** (ipykernel >= 7): a subshell is a second shell thread with its own event
   loop. The button's comm is told to route its messages to a private subshell, which runs the
   click handler at once while the main thread trains. The handler only sets a flag.
2. **jupyter-ui-poll** (kernels with ``do_one_iteration``, i.e. ipykernel 6): the training loop
   pumps pending messages between steps (throttled by the view).

Where neither exists the button is disabled and says to interrupt the kernel instead (the
Trainer treats an interrupt exactly like Stop). Note: jupyter-ui-poll 1.1 silently does nothing on
ipykernel 7.4, whose kernel has no ``do_one_iteration``; that is why subshells come first.
"""

from __future__ import annotations

import threading
from typing import Any


def _kernel() -> Any | None:
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    return getattr(shell, "kernel", None) if shell is not None else None


class ClickRoute:
    """How clicks reach Python; ``mode`` is ``"subshell"``, ``"ui_poll"`` or ``"none"``."""

    mode = "none"

    def __init__(self, note: str = ""):
        self.note = note

    def poll(self) -> None:
        """Deliver pending clicks now (only the ui_poll route needs this)."""

    def close(self) -> None:
        """Release the subshell or poller; safe to call twice."""


class SubshellRoute(ClickRoute):
    mode = "subshell"

    def __init__(self, kernel: Any, widget: Any, timeout: float = 5.0):
        super().__init__()
        self._manager = kernel.shell_channel_thread.manager
        self._loop = self._manager._shell_channel_io_loop
        self._timeout = timeout
        self.subshell_id = self._on_channel_thread(self._manager._create_subshell)
        comm = widget.comm
        if not hasattr(comm, "_reply_subshell_for"):
            self.close()
            raise RuntimeError("this ipykernel's comms cannot be routed to a subshell")
        sid = self.subshell_id
        # Every message for this comm (the click) now goes to our subshell's thread.
        comm._reply_subshell_for = lambda data, default: sid

    def _on_channel_thread(self, fn, *args):
        """Run ``fn`` on the kernel's shell-channel thread (where subshells are managed)."""
        box: dict[str, Any] = {}
        done = threading.Event()

        def call():
            try:
                box["value"] = fn(*args)
            except BaseException as exc:
                box["error"] = exc
            finally:
                done.set()

        self._loop.add_callback(call)
        if not done.wait(self._timeout):
            raise TimeoutError(f"the kernel's shell-channel thread did not answer in "
                               f"{self._timeout} s")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def close(self) -> None:
        sid, self.subshell_id = self.subshell_id, None
        if sid is not None:
            try:
                self._on_channel_thread(self._manager._delete_subshell, sid)
            except Exception:  # the kernel is shutting down; nothing left to release
                pass


class UiPollRoute(ClickRoute):
    mode = "ui_poll"

    def poll(self) -> None:
        from jupyter_ui_poll import ui_events

        with ui_events() as ui_poll:
            ui_poll(20)


def route_clicks(widget: Any, kernel: Any | None = None) -> ClickRoute:
    """Choose how ``widget``'s clicks reach Python during a busy cell (see module doc)."""
    kernel = _kernel() if kernel is None else kernel
    if kernel is None:
        return ClickRoute("no running kernel delivers clicks: interrupt (Ctrl-C / ■) to stop; "
                          "the checkpoint and history are kept")
    reason = ""
    if getattr(kernel, "shell_channel_thread", None) is not None:
        try:
            return SubshellRoute(kernel, widget)
        except Exception as exc:
            reason = f"kernel subshell unavailable ({type(exc).__name__}: {exc}); "
    if hasattr(kernel, "do_one_iteration"):
        try:
            import jupyter_ui_poll  # noqa: F401
            return UiPollRoute(reason.rstrip("; "))
        except ImportError:
            reason += "jupyter-ui-poll is not installed; "
    return ClickRoute(reason + "this kernel cannot deliver clicks while it trains: interrupt "
                      "the kernel (■) to stop; the checkpoint and history are kept")
