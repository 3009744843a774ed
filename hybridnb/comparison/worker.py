"""A compare() variant in its own process (the default): ``ChildVariant`` answers
``call(request, *args, stage=...)`` in the caller as a ``session.VariantSession`` does in process;
``python -m hybridnb.comparison.worker WIRING NAME`` (``processes.framed``) runs the session. Its
first request is the job (a cloudpickled ``session.VariantSession``: a notebook's functions
travel), answered {"status": "ok"} once loaded; then ``prepare`` and ``window`` (steps) until
``close``.

A variant's own process cannot take the caller down: its death (a signal, an abort, a refused
allocation) is status "crashed" naming the signal and its last line; no answer within
``timeout`` seconds kills its process group (status "timeout"). The caller's one ``Watch`` kills
every variant's process group on an interrupt, and each dies with the caller.

Why a fresh interpreter and not ``fork``: a forked child of a process that has run a
multi-threaded OpenMP region hangs in its own first parallel region (libgomp is not fork-safe;
measured: a Conv1d backward never returns), and one thread would measure the wrong CPU speed. It
costs one ``import torch`` per variant (~3-5 s), paid in parallel.
"""

from __future__ import annotations

import contextlib
import pickle
import sys
import threading
from typing import NoReturn

from hybridnb.processes.channel import ANSWER, Channel, Inbox, Message
from hybridnb.processes.child import leave, start_framed
from hybridnb.processes.ended import Ending
from hybridnb.processes.framed import connect
from hybridnb.processes.supervise import Watch, Watched

WORKER_MODULE = "hybridnb.comparison.worker"
CLOSE_S = 5.0  # after "close": time for the variant's process to exit by itself


class ChildVariant:
    """The variant's own process, watched by the caller's ``Watch``. Its job is its first
    request, written by a thread so every variant starts at once; "ready" waits for its answer."""

    def __init__(self, job_bytes: bytes, watch: Watch, name: str, timeout: float | None) -> None:
        self.timeout, self.watch = timeout, watch
        self.answers: list[dict] = []

        def start():  # also sets self.requests, the pipe to the process
            child, self.requests = start_framed(WORKER_MODULE, name, requests=True,
                                                merge_output=True)
            return child

        self.watched: Watched = watch.start(start, name=f"the variant's process ({name})",
                                            on_message=self._take, stop_grace=0.0,
                                            forward_output=False)
        self._job = threading.Thread(target=self.requests.send_packed, args=(job_bytes, False),
                                     daemon=True, name=f"hybridnb-{name}-job")  # not pickled again
        self._job.start()

    def _take(self, message: Message) -> None:
        if message.kind == ANSWER:
            self.answers.append(message.payload)

    def call(self, request: str, *args, stage: str = "") -> dict:
        """Send one request and wait for its answer (at most ``timeout`` seconds)."""
        if request != "ready":  # "ready" is the answer to the job, already on its way
            with contextlib.suppress(OSError):  # the process is gone; the watch says how
                self.requests.send(request, args)
        self.watched.arm(self.timeout)
        self.watch.run(until=lambda: bool(self.answers) or self.watched.ended)
        self.watched.arm(None)
        if self.answers:
            return self.answers.pop(0)
        out = self.watch.end(self.watched)
        if out.status == Ending.TIMEOUT:
            return {"status": Ending.TIMEOUT.value, "note": (
                f"no answer within {self.timeout:g} s during {stage}; its process group was "
                f"killed (raise compare's timeout= if it is only slow)")}
        exit_, last = self.watched.child.exit, self.watched.child.last_words.best()
        return {"status": "crashed", "note": (
            f"the variant's process was {exit_.says() if exit_ is not None else 'lost'} "
            f"during {stage}" + (f"; its last words: {last}" if last else ""))}

    def close(self) -> None:
        """Ask the process to finish, then make sure nothing of its process group is left."""
        if not self.watched.ended and not self._job.is_alive():  # the pipe has room
            with contextlib.suppress(OSError):
                self.requests.send("close")
            self.watched.arm(CLOSE_S)
            self.watch.run(until=lambda: self.watched.ended)
        self.watch.end(self.watched)
        # the job's writer gets EPIPE now that the process is gone; its descriptor is closed
        # only once it has returned (a closed number could be reused under a late write)
        self._job.join(timeout=CLOSE_S)
        if not self._job.is_alive():
            self.requests.close()


def serve(channel: Channel, inbox: Inbox) -> None:
    """Load the job, then answer requests until ``close`` or until the caller closes its end."""
    first = inbox.get()
    if first is None:
        return
    try:
        session = pickle.loads(first.payload)  # a session.VariantSession
    except Exception as exc:  # noqa: BLE001 - a job this process cannot load becomes an answer
        note = f"the variant's process could not load its job: {type(exc).__name__}: {exc}"
        channel.send(ANSWER, {"status": "failed", "note": note})
        return  # the caller asks a failed variant nothing more
    channel.send(ANSWER, {"status": "ok"})
    while True:
        request = inbox.get()  # "prepare" or "window" (the caller sends no other)
        if request is None or request.kind == "close":
            return
        channel.send(ANSWER, session.call(request.kind, *(request.payload or ())))


def main(argv: list[str] | None = None) -> NoReturn:
    channel, inbox, _ = connect(sys.argv[1:] if argv is None else argv)
    code = 0
    try:
        serve(channel, inbox)
    except BaseException:  # noqa: BLE001 - said on stderr, where the caller reads last words
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(BaseException):  # exiting anyway
            channel.flush()
    leave(code)  # no interpreter teardown (about a second with torch loaded)


if __name__ == "__main__":
    sys.exit(main())
