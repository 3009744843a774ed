"""Where a compare() variant runs: in its own process (the default) or in the caller's.

Both answer ``call(request, *args, stage=...)`` with the session's plain dicts. In its own process
a variant cannot take the caller down: if the process dies (any signal, an abort from a C++
thread, an allocation the OS refuses) the answer is status "crashed" naming the signal and the
last line it wrote; if it does not answer within ``timeout`` seconds its whole process group is
killed and the answer is status "timeout".

Why a fresh interpreter (``python -m hybridnb.comparison.worker``) and not ``fork``: a forked child
of a process that has already run a multi-threaded OpenMP region (any torch CPU op of some size)
hangs in its own first parallel region (libgomp is not fork-safe; measured: a Conv1d backward never
returns), and limiting the child to one thread would measure the wrong CPU speed. A fresh process
also works when the caller has already initialised CUDA. It costs one ``import torch`` per variant
(~3-5 s), paid in parallel: every variant's process starts at once, before the first warm-up.
The model function, loss and batch travel by cloudpickle (joblib's dependency), so functions and
classes defined in a notebook or a script work.
"""

from __future__ import annotations

import contextlib
import os
import sys
from multiprocessing import Pipe
from pathlib import Path

from hybridnb.comparison.session import Job, VariantSession
from hybridnb.processes.child import start_command
from hybridnb.processes.ended import Ended


class LocalVariant:
    """The variant in the caller's process: fastest to start, and a crash ends the caller."""

    def __init__(self, job: Job) -> None:
        self.session = VariantSession(job)

    def call(self, request: str, *args, stage: str = "") -> dict:
        if request == "ready":
            return {"status": "ok"}
        return getattr(self.session, request)(*args)

    def close(self) -> None:
        self.session.release()


class ChildVariant:
    """The variant in its own process group (``hybridnb.processes``), started now; see the
    module docstring. Its output is read into a bounded tail (its last words name a crash)."""

    def __init__(self, job_bytes: bytes, folder: Path, name: str, timeout: float | None) -> None:
        self.timeout = timeout
        self.ended: dict | None = None  # the final answer once the process is gone
        job_file = folder / f"{name}.job"
        job_file.write_bytes(job_bytes)
        self.conn, theirs = Pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [p for p in sys.path if p] + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        try:
            self.child = start_command(
                [sys.executable, "-m", "hybridnb.comparison.worker", str(job_file),
                 str(theirs.fileno())], env=env, merge_output=True,
                pass_fds=(theirs.fileno(),))
        finally:
            theirs.close()

    def call(self, request: str, *args, stage: str = "") -> dict:
        """Send one request and wait for its answer (at most ``timeout`` seconds)."""
        if self.ended is not None:
            return self.ended
        try:
            self.conn.send((request, *args))
            if not self._answered():
                self._end()
                self.ended = {"status": Ended.TIMEOUT.value, "note": (
                    f"no answer within {self.timeout:g} s during {stage}; its process group was "
                    f"killed (raise compare's timeout= if it is only slow)")}
                return self.ended
            return self.conn.recv()
        except (EOFError, OSError):  # the process is gone: BrokenPipe, ConnectionReset, EOF
            self._end()
            self.ended = {"status": "crashed", "note": self._death(stage)}
            return self.ended

    def _answered(self) -> bool:
        """Wait for the answer (or the end of the connection) while reading the process's output
        so a chatty variant never blocks on a full pipe; False after ``timeout`` seconds."""
        import select
        import time

        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            left = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
            if left <= 0:
                return self.conn.poll(0)
            ready = select.select([self.conn, *self.child.output_fds], [], [], left)[0]
            for fd in ready:
                if fd in self.child.output_fds:
                    self.child.read_output(fd)
            if self.conn in ready:
                return True

    def close(self) -> None:
        """Ask the process to finish, then make sure nothing of its process group is left."""
        if self.ended is None:
            with contextlib.suppress(EOFError, OSError):
                self.conn.send(("close",))
                self.conn.poll(5)
        self._end()
        self.ended = self.ended or {"status": "closed"}

    def _end(self) -> None:
        """Kill the process group, reap the process and release the pipes, once."""
        for fd in list(self.child.output_fds):  # its last words, before they are dropped
            self.child.read_output(fd)
        self.child.close()
        self.conn.close()

    def _death(self, stage: str) -> str:
        exit_ = self.child.exit
        how = exit_.says() if exit_ is not None else "lost"
        last = self.child.last_words.best()
        tail = f"; its last words: {last}" if last else ""
        return f"the variant's process was {how} during {stage}{tail}"
