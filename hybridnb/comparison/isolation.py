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
import signal
import subprocess
import sys
import tempfile
from multiprocessing import Pipe
from pathlib import Path

from hybridnb.comparison.session import Job, VariantSession
from hybridnb.train.isolate import signal_name


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
    """The variant in its own process group, started now; see the module docstring."""

    def __init__(self, job_bytes: bytes, folder: Path, name: str, timeout: float | None) -> None:
        self.timeout = timeout
        self.ended: dict | None = None  # the final answer once the process is gone
        job_file = folder / f"{name}.job"
        job_file.write_bytes(job_bytes)
        self.log = tempfile.TemporaryFile(dir=folder)
        self.conn, theirs = Pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [p for p in sys.path if p] + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "hybridnb.comparison.worker", str(job_file),
                 str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), start_new_session=True, stdin=subprocess.DEVNULL,
                stdout=self.log, stderr=self.log, env=env)
        finally:
            theirs.close()

    def call(self, request: str, *args, stage: str = "") -> dict:
        """Send one request and wait for its answer (at most ``timeout`` seconds)."""
        if self.ended is not None:
            return self.ended
        try:
            self.conn.send((request, *args))
            if not self.conn.poll(self.timeout):
                self._end()
                self.ended = {"status": "timeout", "note": (
                    f"no answer within {self.timeout:g} s during {stage}; its process group was "
                    f"killed (raise compare's timeout= if it is only slow)")}
                return self.ended
            return self.conn.recv()
        except (EOFError, OSError):  # the process is gone: BrokenPipe, ConnectionReset, EOF
            code = self._end()
            self.ended = {"status": "crashed", "note": _death(code, stage, self._last_line())}
            return self.ended

    def close(self) -> None:
        """Ask the process to finish, then make sure nothing of its process group is left."""
        if self.ended is None:
            with contextlib.suppress(EOFError, OSError):
                self.conn.send(("close",))
                self.conn.poll(5)
        self._end()
        self.log.close()
        self.ended = self.ended or {"status": "closed"}

    def _end(self) -> int:
        """Kill the process group (the process is not reaped before this, so its id is still
        its own), reap the process and release the pipe, once; returns its exit code."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.conn.close()
        return self.proc.returncode

    def _last_line(self) -> str:
        with contextlib.suppress(OSError, ValueError):
            self.log.seek(0)
            lines = [ln.strip() for ln in self.log.read().decode(errors="replace").splitlines()]
            lines = [ln for ln in lines if ln]
            return lines[-1][:240] if lines else ""
        return ""


def _death(code: int, stage: str, last: str) -> str:
    if code < 0:
        how = f"killed by {signal_name(-code)}"
    else:
        how = f"exited with code {code}"
    tail = f"; its last words: {last}" if last else ""
    return f"the variant's process was {how} during {stage}{tail}"
