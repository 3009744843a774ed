"""Start a child process, read it, signal it, reap it: the one module of hybridnb that sends
signals (tests check it). Every child leads its own process group, so ``Child.kill_group()``
reaches the helpers it started too (DataLoader workers, a driver's helper), and reaps it: no
orphan, no zombie. Starts hold Ctrl-C and SIGTERM until the child is made, so a start returns a
child the caller owns or leaves nothing (no process, no shared file). Children die with the
parent (``processes.lifeline``). POSIX only (``platform.child_pipes()``): elsewhere callers run
in process.
"""

from __future__ import annotations

import codecs
import collections
import contextlib
import faulthandler
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from hybridnb import platform
from hybridnb.env import HEADLESS_ENV, ISOLATED_ENV, current, warm_worker
from hybridnb.processes import lifeline
from hybridnb.processes.channel import (
    DONE,
    HEADER,
    MAGIC,
    READY,
    Channel,
    FrameReader,
    StopFlag,
    encode,
    widen_pipe,
    write_all,
)
from hybridnb.processes.ended import Exit
from hybridnb.processes.output import LastWords

REAP_S = 10.0        # after SIGKILL: time to reap (a process stuck in a driver call cannot die)
TAIL_LINES = 120     # the child's last output lines kept
PARTIAL_CAP = 2000   # characters of an unfinished line kept (a progress bar without newlines)
WORKER_MODULE = "hybridnb.processes.worker"
WORKER_ENV = {HEADLESS_ENV: "1", ISOLATED_ENV: "1"}  # a worker draws nothing, never isolates again


class Child:
    """A started child: ``pid`` (also its process group), ``messages`` (its channel's reader;
    None for a command), ``output_fds`` (open stdout/stderr pipes: fd -> 1 or 2; ``err_r`` None:
    merged) and ``files`` (its job's shared-memory files, removed at ``close``)."""

    def __init__(self, pid: int, out_r: int, err_r: int | None,
                 popen: subprocess.Popen | None = None) -> None:
        self.pid, self.popen = pid, popen
        self.output_fds = {out_r: 1} if err_r is None else {out_r: 1, err_r: 2}
        self.messages: FrameReader | None = None  # set by the start that made a channel
        self.stop: StopFlag | None = None
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.last_words = LastWords()
        self._partial = dict.fromkeys(self.output_fds, "")  # per pipe, its unfinished line
        self._decoders = {fd: codecs.getincrementaldecoder("utf-8")("replace")
                          for fd in self.output_fds}  # a character may be split across reads
        for fd in self.output_fds:
            os.set_blocking(fd, False)
        self.files: list[str] = []
        self.exit: Exit | None = None
        self.reaped = False
        self.not_reaped = ""  # why the exit is unknown after kill_group(), when it is
        self.group_left = False  # reaped by poll (no waitid): its group may still have members
        self.pidfd: int | None = None
        if platform.pidfd():
            with contextlib.suppress(OSError):
                self.pidfd = os.pidfd_open(pid)

    def read_output(self, fd: int) -> tuple[int, str] | None:
        """What is there on one output pipe: (1 or 2, the text); None once it is closed. Its
        completed lines go to ``tail`` and ``last_words`` (a line redrawn with carriage returns
        counts by its last state)."""
        chunks: list[str] = []
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:  # (EINTR is retried by Python itself)
                break
            except OSError:
                data = b""
            if not data:
                stream = self.output_fds.pop(fd)
                os.close(fd)
                return (stream, "".join(chunks)) if chunks else None
            chunks.append(self._decoders[fd].decode(data))
            lines = (self._partial[fd] + chunks[-1]).split("\n")
            self._partial[fd] = lines.pop()[-PARTIAL_CAP:]
            for line in lines:
                self.tail.append(line.rsplit("\r", 1)[-1])
                self.last_words.feed(self.tail[-1])
        return self.output_fds[fd], "".join(chunks)

    def output_text(self) -> str:
        """The kept lines and any unfinished ones."""
        return "\n".join([*self.tail, *(p for p in self._partial.values() if p)])

    def wait_fds(self) -> list[int]:
        """The descriptors that become readable when something happens to it."""
        fds = list(self.output_fds)
        if self.messages is not None and not self.messages.eof:
            fds.append(self.messages.fd)
        if self.pidfd is not None and self.exit is None:
            fds.append(self.pidfd)
        return fds

    def poll(self) -> Exit | None:
        """How it ended, once it has; left unreaped where ``os.waitid`` allows (so ``kill_group``
        cannot hit a stranger), else reaped (a group's id is not reused while a member lives)."""
        if self.exit is not None:
            return self.exit
        if not platform.wait_without_reaping():
            ended = self._reap_now()
            self.group_left = ended is not None and ended.how != "unknown"
            return self.exit
        try:
            r = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped elsewhere
            self.exit, self.reaped = Exit("unknown", -1), True
            return self.exit
        if r is not None:
            killed = r.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
            self.exit = Exit("signal" if killed else "code", r.si_status)
        return self.exit

    def _reap_now(self) -> Exit | None:
        """Reap it if it has ended (never blocks): its exit, or None while it runs."""
        if self.popen is not None:
            rc = self.popen.poll()
            ended = None if rc is None else Exit.from_returncode(rc)
        else:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                ended = Exit.from_returncode(os.waitstatus_to_exitcode(status)) if pid else None
            except ChildProcessError:  # reaped elsewhere
                ended = Exit("unknown", -1)
        if ended is not None:
            self.reaped, self.exit = True, self.exit or ended
        return ended

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the child itself (not its group), while it is not reaped."""
        if not self.reaped:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, sig)

    def kill_group(self, reap_s: float = REAP_S) -> None:
        """SIGKILL its whole process group, then reap it; one still stuck in a driver call after
        ``reap_s`` is reaped later by a thread, and ``not_reaped`` says so."""
        if not self.reaped or self.group_left:  # reaped by poll: what it started may still run
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, platform.KILL)
            if not self.reaped:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(self.pid, platform.KILL)  # should it have left its group
            self.group_left = False
        deadline = time.monotonic() + reap_s
        while not self.reaped and self._reap_now() is None:
            if time.monotonic() > deadline:
                self.not_reaped = f"not reaped {reap_s:g} s after SIGKILL (stuck in a driver?)"
                if self.popen is None:  # (a Popen's is reaped by subprocess on a later Popen)
                    threading.Thread(target=os.waitpid, args=(self.pid, 0), daemon=True).start()
                return
            time.sleep(0.005)

    def close(self) -> None:
        """Kill and reap it if needed; release every descriptor and shared file."""
        self.kill_group()
        close_fds(list(self.output_fds))
        self.output_fds.clear()
        if self.messages is not None:
            self.messages.close()
        if self.pidfd is not None:
            close_fds([self.pidfd])
            self.pidfd = None
        if self.stop is not None:
            self.stop.close()
        if self.files:
            from hybridnb.processes.payload import discard

            discard(self.files)
            self.files = []

    def __del__(self) -> None:
        # a child nobody holds is killed (its start returned as a Ctrl-C reached the caller)
        if getattr(self, "reaped", True):
            return
        with contextlib.suppress(Exception):  # in __del__: nothing may escape
            self.close()


def start_fork(fn: Callable[..., Any], *args: Any, env: dict[str, str] | None = None,
               death_signal: int = platform.KILL, merge_output: bool = False) -> Child:
    """Fork a child that runs ``fn(channel, *args)`` and sends its return value back. ``env``:
    variables set in the child (default ``WORKER_ENV``). ``death_signal``: what it gets when this
    process dies (``hn.launch``'s ranks get SIGINT, to stop at an agreed step). ``merge_output``:
    one pipe for stdout and stderr. Where this OS cannot fork: spawned."""
    if not platform.fork():
        platform.say_once(f"{platform.fork().why}: start_fork starts a spawned child")
        return start_spawn(fn, *args, env=env, death_signal=death_signal,
                           merge_output=merge_output)
    return _atomically(lambda: _fork(fn, args, env, death_signal, merge_output))


def _fork(fn: Callable[..., Any], args: tuple, env: dict[str, str] | None, death_signal: int,
          merge_output: bool) -> Child:
    made: list[int] = []
    try:
        msg_r, msg_w = new_pipe(made)
        widen_pipe(msg_w)
        out_r, out_w = new_pipe(made)
        err_r, err_w = (None, None) if merge_output else new_pipe(made)
        wiring = lifeline.wiring()
        stop = StopFlag()  # last: nothing after it can fail
    except BaseException:  # cleanup, then re-raised
        close_fds(made)
        raise
    sys.stdout.flush()  # or the child would print again what is still buffered here
    sys.stderr.flush()
    with warnings.catch_warnings():  # python >= 3.12 warns on fork in a threaded process;
        # the kernel's own threads (ZMQ, heartbeat) hold no lock the worker needs
        warnings.filterwarnings("ignore", message=r".*fork\(\) may lead to deadlocks",
                                category=DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: it never returns into the parent's code (``leave``)
        code = 70
        try:
            with contextlib.suppress(OSError):
                os.setpgid(0, 0)  # a Ctrl-C in the parent's group does not reach it; killpg does
            lifeline.after_fork()
            lifeline.hold(wiring, death_signal)
            close_fds([fd for fd in (msg_r, out_r, err_r) if fd is not None])
            os.environ.update(WORKER_ENV if env is None else env)
            err_w = out_w if err_w is None else err_w
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            close_fds([out_w, err_w])
            sys.stdout, sys.stderr = (open(fd, "w", buffering=1, encoding="utf-8",
                                           errors="replace", closefd=False) for fd in (1, 2))
            prepare()
            channel = Channel(msg_w, stop)
            channel.send(READY)
            code = run(fn, args, {}, channel)
        finally:
            leave(code)
    with contextlib.suppress(OSError):  # the child does it too; whichever comes first
        os.setpgid(pid, pid)
    close_fds([fd for fd in (msg_w, out_w, err_w) if fd is not None])
    child = Child(pid, out_r, err_r)
    child.messages, child.stop = FrameReader(msg_r), stop
    return child


def start_spawn(fn: Callable[..., Any], *args: Any, env: dict[str, str] | None = None,
                death_signal: int = platform.KILL, merge_output: bool = False,
                **kwargs: Any) -> Child:
    """Start a fresh interpreter (``processes.worker``) that runs ``fn(channel, *args,
    **kwargs)``, as ``start_fork``. The job travels by ``payload``; the child has this process's
    environment, ``env`` on top; a part that cannot be pickled raises ``NotSendable``."""
    return _spawn((), env, death_signal, merge_output).send(fn, *args, **kwargs)


class PrestartedWorker:
    """A spawned worker started before its job exists (it imports while the job is packed)."""

    def __init__(self, child: Child, job: Requests) -> None:
        self.child = child
        self._job: Requests | None = job
        self.preload: tuple[str, ...] | None = None  # prestart_spawn's: the next spare imports it

    def send(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Child:
        """Hand the job over (written from a thread: the caller watches the worker at once): the
        ``Child``, for the caller to close. A failure or interrupt here kills the worker."""
        from hybridnb.processes.payload import discard, pack

        if self._job is None:
            raise RuntimeError("this prestarted worker was already given its job or closed")
        files: list[str] = []

        def hand_over() -> Child:
            threading.Thread(target=self._job.send_packed, args=(data,), daemon=True,
                             name="hybridnb-payload").start()
            self._job = None  # the thread closes it
            self.child.files.extend(files)
            return self.child

        try:
            data, _ = pack((fn, args, kwargs), files)
            return _atomically(hand_over)
        except BaseException:  # nothing is left: not the files, not the worker
            discard(files)
            self.close()
            raise

    def start_next(self) -> None:
        """Start the spare for the next request like this one (once), when this job is over: a
        spare's start-up (importing torch) would take CPU from the job."""
        from hybridnb.processes import spare

        preload, self.preload = self.preload, None
        if preload is not None:
            try:  # now: the environment may have changed since
                spare.replenish(spare.key_of(preload), lambda: _spawn(preload))
            except Exception as exc:  # noqa: BLE001 - said; the next fit starts a worker itself
                platform.say(f"no spare worker for the next fit ({type(exc).__name__}: {exc}); "
                             "it will start its own")

    def close(self) -> None:
        """Kill the worker if its job never came (after ``send``: nothing to do; a send that
        failed after the hand-over closed the child itself)."""
        with _held_signals():
            if self._job is not None:
                self._job.close()
                self._job = None
                self.child.close()


def prestart_spawn(*, preload: Sequence[str] = ("torch",)) -> PrestartedWorker:
    """A spawned worker that imports ``preload``, says "ready" and waits for its job
    (``PrestartedWorker.send``); with warm workers on, the spare the previous job left."""
    from hybridnb.processes import spare

    preload = tuple(preload)
    early = _atomically(lambda: spare.take(spare.key_of(preload))) if warm_worker() else None
    early = early or _spawn(preload)
    early.preload = preload
    return early


def _spawn(preload: Sequence[str], env: dict[str, str] | None = None,
           death_signal: int = platform.KILL, merge_output: bool = False) -> PrestartedWorker:
    """A worker started atomically (``_atomically``) that imports ``preload``."""
    return _atomically(lambda: PrestartedWorker(*start_framed(
        WORKER_MODULE, str(int(death_signal)), repr(time.monotonic()), ",".join(preload),
        env=WORKER_ENV if env is None else env, requests=True, merge_output=merge_output)))


NONE = "-"  # no request pipe, in WIRING


class Requests:
    """The parent's end of a child's request pipe."""

    def __init__(self, fd: int) -> None:
        self.fd: int | None = fd

    def send(self, kind: str, payload=None) -> None:
        """Write one request (blocks while the pipe is full; OSError once the child is gone)."""
        self._write(encode(kind, payload)[0])

    def send_packed(self, data: bytes, close: bool = True) -> None:
        """Write pickled bytes as they are (the child gets them as a ``PACKED`` message), then
        close unless ``close=False``; a child gone meanwhile ends it quietly."""
        with contextlib.suppress(OSError):
            self._write([HEADER.pack(MAGIC, len(data), 0), data])
        if close:
            self.close()

    def _write(self, parts: list) -> None:
        if self.fd is None:
            raise BrokenPipeError("the request pipe is closed")
        write_all(self.fd, parts)

    def close(self) -> None:
        if self.fd is not None:
            close_fds([self.fd])
            self.fd = None


def start_framed(module: str, *args: str, env: dict[str, str] | None = None,
                 requests: bool = False, merge_output: bool = False
                 ) -> tuple[Child, Requests | None]:
    """Start ``python -m module WIRING *args`` (``processes.framed``), with ``messages`` and
    ``stop``, unbuffered, in this process's environment (``env`` on top) with hybridnb's folder
    and ``sys.path`` on ``PYTHONPATH`` (a notebook may have added them to sys.path only)."""
    package_root = str(Path(__file__).resolve().parents[2])
    pythonpath = os.pathsep.join([package_root] + [p for p in sys.path if p]
                                 + [current().get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = {**current(), "PYTHONPATH": pythonpath, "PYTHONUNBUFFERED": "1", **(env or {})}
    made: list[int] = []
    stop: StopFlag | None = None
    try:
        msg_r, msg_w = new_pipe(made)
        widen_pipe(msg_w)
        req_r, req_w = new_pipe(made) if requests else (None, None)
        stop = StopFlag()
        fds = ",".join(str(x) for x in (msg_w, stop.fd, NONE if req_r is None else req_r,
                                        lifeline.wiring()))
        child = start_command([sys.executable, "-m", module, fds, *args],
                              env=env, merge_output=merge_output,
                              pass_fds=[fd for fd in (msg_w, stop.fd, req_r, lifeline.read_end())
                                        if fd is not None])
    except BaseException:  # cleanup, then re-raised
        close_fds(made)
        if stop is not None:
            stop.close()
        raise
    close_fds([fd for fd in (msg_w, req_r) if fd is not None])
    child.messages, child.stop = FrameReader(msg_r), stop
    return child, (Requests(req_w) if req_w is not None else None)


def start_command(argv: Sequence[str], *, env: dict[str, str] | None = None,
                  merge_output: bool = False, pass_fds: Sequence[int] = ()) -> Child:
    """Start a command in its own process group, stdin from /dev/null, its output through
    pipes. ``env``: its whole environment (default: this process's)."""
    made: list[int] = []
    try:
        out_r, out_w = new_pipe(made)
        err_r, err_w = (None, None) if merge_output else new_pipe(made)
        sys.stdout.flush()
        sys.stderr.flush()
        popen = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out_w,
                                 stderr=out_w if err_w is None else err_w, env=env,
                                 pass_fds=tuple(pass_fds), start_new_session=True)
    except BaseException:  # cleanup, then re-raised
        close_fds(made)
        raise
    close_fds([fd for fd in (out_w, err_w) if fd is not None])
    return Child(popen.pid, out_r, err_r, popen)


def prepare() -> None:
    """In a child: signals as a plain Python process has them, faulthandler on stderr, no stdin."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if platform.HANGUP is not None:  # a forked child inherits the parent's Watch handler
        signal.signal(platform.HANGUP, signal.SIG_DFL)
    faulthandler.enable(file=sys.stderr)  # a segfault or abort prints the Python stack
    sys.stdin = open(os.devnull)


def run(fn: Callable[..., Any], args: tuple, kwargs: dict, channel: Channel) -> int:
    """In a child: run ``fn(channel, *args, **kwargs)``, send its result or error; exit code."""
    try:
        result = fn(channel, *args, **kwargs)
        try:
            channel.send(DONE, result)
        except Exception as exc:  # noqa: BLE001 - any pickling failure: named
            raise TypeError(f"the result ({type(result).__name__}) cannot be sent to the "
                            f"parent ({type(exc).__name__}: {exc}); return plain values "
                            "(numbers, dicts, CPU tensors)") from exc
        return 0
    except BaseException as exc:  # reported to the parent, whatever it was
        channel.send_error(exc)
        return 1


def leave(code: int) -> NoReturn:
    """In a child: flush and exit at once (no atexit handlers, no interpreter teardown)."""
    with contextlib.suppress(BaseException):  # exiting anyway
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def new_pipe(made: list[int]) -> tuple[int, int]:
    """A pipe, its descriptors also added to ``made`` (closed together on failure)."""
    r, w = os.pipe()
    made += (r, w)
    return r, w


def close_fds(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


@contextlib.contextmanager
def _held_signals() -> Iterator[None]:
    """SIGINT and SIGTERM wait while the block runs and are delivered after it (Python runs
    handlers in the main thread only: elsewhere nothing can interrupt the block)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    old: dict[int, Any] = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            handler = signal.getsignal(sig)
            if handler is None or handler == signal.SIG_IGN:
                continue  # set outside Python, or ignored: nothing to hold
            old[sig] = signal.signal(sig, lambda number, frame: pending.append(number))
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(pending):
            signal.raise_signal(sig)


T = TypeVar("T", Child, "PrestartedWorker")


def _atomically(start: Callable[[], T]) -> T:
    """``start()`` with SIGINT and SIGTERM held (a start that failed cleaned up after itself);
    when a signal that came meanwhile raises (KeyboardInterrupt), what started is closed first."""
    started: T | None = None
    try:
        with _held_signals():
            started = start()
    except BaseException:
        if started is not None:
            with _held_signals():
                started.close()
        raise
    return started
