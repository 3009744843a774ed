"""Isolated training: the steps run in a forked worker process that the kernel supervises.

Whatever the GPU does to the worker (an abort or segfault in a C++ thread, a sticky CUDA error,
a kernel launch that never returns), the kernel survives it: ``run_isolated(work)`` forks a
worker in its own process group, the worker runs ``work(channel)`` and sends messages back
(view updates, events, its last good state, step completions, its result), and the kernel
watches it. When the worker dies, or no step completes within the step timeout, the kernel
kills the worker's whole process group, reaps it, and returns an ``Outcome`` that names what
happened and keeps the last state the worker sent, so the caller can carry on from there.

Why fork: models, datasets and functions defined in notebook cells live in the kernel's
``__main__``; a forked worker already has them. Forking is only safe while CUDA is not
initialised in the kernel (``isolate_decision`` checks; ``hn.detect()`` probes in a child).

Rules for the caller (the kernel side):
- Run no threads of your own across ``run_isolated`` (the memory sampler, throttled renderers):
  a forked process gets a copy of every lock, and a lock another thread held at the fork stays
  held forever in the worker. Stop such threads before and start them again after.
- Python reseeds its ``random`` module in a forked child; torch and numpy generators are copied.
  Seed or restore RNG states inside ``work``.
- The worker is headless (``HYBRIDNB_HEADLESS=1``) and marked ``HYBRIDNB_ISOLATED=1``; it draws
  nothing: the kernel's ``on_message`` gets its view updates and draws them. Its stdout and
  stderr are copied into the kernel's (the cell's output); the last lines are in the Outcome.

Ctrl-C while supervising asks the worker to stop (``channel.stop_requested()`` turns true): it
finishes its step, sends its state and result, and the Outcome says it was interrupted; if it
has not finished within ``stop_grace`` (or at a second Ctrl-C) it is killed. ``should_stop``
(e.g. the live view's Stop button) sends the same request without a time limit.
"""

from __future__ import annotations

import collections
import contextlib
import faulthandler
import multiprocessing
import os
import select
import signal
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hybridnb.env import HEADLESS_ENV, ISOLATED_ENV, LAUNCHED_ENV
from hybridnb.output import OutputLines
from hybridnb.train.worker_channel import (
    DONE,
    ERROR,
    HEARTBEAT,
    STATE,
    STEP_DONE,
    Channel,
    FrameReader,
    Message,
    StopFlag,
    widen_pipe,
)

STEP_TIMEOUT_FLOOR_S = 120.0         # the automatic step timeout is never shorter than this
STEP_TIMEOUT_FACTOR = 20.0           # ... and at least this many median steps
FIRST_STEP_GRACE_S = 600.0           # the first steps: CUDA start-up, compiling, autotuning
WARMUP_STEPS = 3                     # steps that run under first_step_grace
STOP_GRACE_S = 30.0                  # after Ctrl-C: time to finish the step and send the result
EXIT_GRACE_S = 10.0                  # after "done"/"error": time for the worker to exit by itself
REAP_S = 10.0                        # after SIGKILL: time to reap (a process stuck in a driver)
TAIL_LINES = 120                     # the worker's last output lines kept in the Outcome

_SIGNAL_HINTS = {
    "SIGKILL": "sent by the Linux out-of-memory killer when RAM runs out, or by a person",
    "SIGABRT": "an abort in native code, e.g. a CUDA error raised in a C++ thread",
    "SIGSEGV": "a crash in native code: the GPU driver or a C++ extension",
    "SIGBUS": "a crash in native code: the GPU driver or a C++ extension",
}


# ============================================================================ the decision

def fork_available() -> bool:
    return hasattr(os, "fork") and "fork" in multiprocessing.get_all_start_methods()


def cuda_initialized() -> bool:
    """Whether this process has a CUDA context (never creates one; False if torch is absent)."""
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def isolate_decision(isolate: bool | str, device: Any, *, in_distributed: bool
                     ) -> tuple[bool, str]:
    """Whether ``fit`` should run its steps in an isolated worker, and the reason in a sentence.

    ``"auto"``: on for CUDA/ROCm runs where fork is available and CUDA is not initialised in
    this process; off on the CPU, under torchrun / ``hn.launch`` (each rank is already a
    supervised process), inside a worker, and where fork is unavailable. ``True`` isolates on the
    CPU too; where isolation cannot work it is off and the reason says why (say it once:
    ``say_once``).
    """
    if isolate not in ("auto", True, False):
        raise ValueError(f"isolate={isolate!r}: use 'auto', True or False")
    kind = str(device).split(":", 1)[0]
    if isolate is False:
        return False, "isolate=False: training in this process"
    env = os.environ
    if env.get(ISOLATED_ENV):
        return False, "already inside an isolated worker: training in this process"
    if in_distributed or env.get(LAUNCHED_ENV) == "1" or "LOCAL_RANK" in env:
        return False, ("distributed run (torchrun or hn.launch): each rank is already a "
                       "supervised process, training in it without a second worker")
    if not fork_available():
        return False, ("isolated training needs os.fork, which this platform lacks: training "
                       "in this process (a GPU crash or hang can take the kernel down)")
    if kind == "cpu":
        if isolate is True:
            return True, "isolate=True: training on the CPU in a supervised worker process"
        return False, "CPU run: training in this process (isolation guards accelerator runs)"
    if kind != "cuda":
        return False, (f"isolated training supports CUDA/ROCm devices, not {kind!r}: training "
                       "in this process")
    if cuda_initialized():
        return False, (
            "CUDA is already initialised in this kernel (something used the GPU before fit: a "
            "model or tensor moved to 'cuda', a torch.cuda call), and a forked worker cannot "
            "use it: training in this process, without isolation. Restart the kernel and call "
            "fit before anything touches the GPU (hn.detect() is safe) to get isolation.")
    return True, ("training in a supervised worker process: a crash or hang of the GPU costs "
                  "the steps since the last good state, not the kernel")


_said: set[str] = set()


def say_once(reason: str) -> None:
    """Print ``reason`` to stderr the first time this process sees it."""
    if reason not in _said:
        _said.add(reason)
        print(f"hybridnb: {reason}", file=sys.stderr)


def auto_step_timeout(step_seconds: list[float], floor: float = STEP_TIMEOUT_FLOOR_S,
                      factor: float = STEP_TIMEOUT_FACTOR) -> float:
    """max(floor, factor x the median step): generous, so only a real hang trips it."""
    if not step_seconds:
        return floor
    return max(floor, factor * statistics.median(step_seconds))


# ============================================================================ the outcome

@dataclass
class Outcome:
    """How an isolated run ended.

    ``status``: "done" (the worker returned ``result``), "error" (``work`` raised: ``error``
    holds type, message and ``traceback``), "died" (a signal or an exit without a result),
    "hung" (no step completed in time), "interrupted" (Ctrl-C and the worker did not finish).
    ``reason`` says it in a sentence. ``state`` is the last complete "state" payload (None if
    none came), sent after ``state_steps`` completed steps.
    """

    status: str
    reason: str
    result: Any = None
    error: dict | None = None
    state: Any = None
    state_steps: int | None = None
    steps: int = 0
    median_step_s: float | None = None
    seconds: float = 0.0
    exit: str = ""                 # "code 0", "signal SIGABRT", "not reaped" ...
    interrupted: bool = False      # a Ctrl-C reached the kernel while supervising
    stop_sent: bool = False        # the worker was asked to stop (Ctrl-C or should_stop)
    bytes_received: int = 0
    output_tail: str = ""          # the worker's last lines of stdout/stderr

    @property
    def ok(self) -> bool:
        return self.status == "done"

    @property
    def traceback(self) -> str:
        return (self.error or {}).get("traceback", "")


# ============================================================================ the supervisor

def run_isolated(work: Callable[[Channel], Any], *,
                 on_message: Callable[[Message], None] | None = None,
                 step_timeout: float | None = None,
                 first_step_grace: float = FIRST_STEP_GRACE_S,
                 poll: float = 0.1,
                 should_stop: Callable[[], bool] | None = None,
                 stop_grace: float = STOP_GRACE_S,
                 timeout_floor: float = STEP_TIMEOUT_FLOOR_S,
                 warmup_steps: int = WARMUP_STEPS,
                 forward_output: bool = True) -> Outcome:
    """Run ``work(channel)`` in a forked worker, pass each message to ``on_message``, and return
    how it ended (see ``Outcome``). Nothing is left running when this returns or raises.

    ``step_timeout``: seconds a step may take (None: ``auto_step_timeout`` of the measured steps
    with ``timeout_floor``); until ``warmup_steps`` steps completed ``first_step_grace`` applies
    if longer. A "step_done" or "heartbeat" message restarts the clock. ``poll``: how often the
    worker and ``should_stop`` are checked when no message comes. An exception from
    ``on_message`` kills the worker and propagates.
    """
    if not fork_available():
        raise RuntimeError("run_isolated needs os.fork, which this platform lacks; train in "
                           "this process (Trainer(isolate=False))")
    for name, value in (("first_step_grace", first_step_grace), ("poll", poll),
                        ("stop_grace", stop_grace), ("timeout_floor", timeout_floor)):
        if not value > 0:
            raise ValueError(f"{name}={value!r} must be > 0 seconds")
    if step_timeout is not None and not step_timeout > 0:
        raise ValueError(f"step_timeout={step_timeout!r} must be > 0 seconds, or None (auto)")
    sup = _Supervisor(work, on_message, step_timeout, first_step_grace, poll, should_stop,
                      stop_grace, timeout_floor, warmup_steps,
                      {HEADLESS_ENV: "1", ISOLATED_ENV: "1"}, forward_output)
    return sup.run()


class _Supervisor:
    def __init__(self, work, on_message, step_timeout, first_step_grace, poll, should_stop,
                 stop_grace, timeout_floor, warmup_steps, env, forward_output) -> None:
        self.work, self.on_message, self.should_stop = work, on_message, should_stop
        self.step_timeout, self.first_step_grace = step_timeout, first_step_grace
        self.poll, self.stop_grace, self.floor = poll, stop_grace, timeout_floor
        self.warmup_steps, self.env, self.forward_output = warmup_steps, env, forward_output
        self.queue: collections.deque[Message] = collections.deque()
        self.durations: collections.deque[float] = collections.deque(maxlen=201)
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.last_line = self.error_line = ""  # before faulthandler's dump, if any
        self.in_dump = False
        self.steps = self.interrupts = 0
        self.state = self.state_steps = self.result = self.error = None
        self.got_done = self.stop_sent = False
        self.finished_at: float | None = None
        self.stop_deadline: float | None = None
        self.stop_wait = 0.0
        self.grace: float | None = None
        self.exit_info: tuple[str, int] | None = None
        self.reaped = False
        self.exit_text = ""
        self.pidfd: int | None = None
        self.pid: int | None = None
        self.fds: list[int] = []
        self.stop = StopFlag()

    # ---------------------------------------------------------------- start and stop
    def run(self) -> Outcome:
        try:
            with self._sigint():  # before the fork: a Ctrl-C can never strand a worker
                self._start()
                cause = self._loop()
        finally:
            if self.pid is not None:
                self._kill_and_reap()
            self._close()
        return self._outcome(cause)

    def _start(self) -> None:
        msg_r, msg_w = os.pipe()
        self.fds += (msg_r, msg_w)
        widen_pipe(msg_w)
        out_r, out_w = os.pipe()
        self.fds += (out_r, out_w)
        err_r, err_w = os.pipe()
        self.fds += (err_r, err_w)
        sys.stdout.flush()  # or the worker would print again what is still buffered here
        sys.stderr.flush()
        parent = os.getpid()
        with warnings.catch_warnings():  # python >= 3.12 warns on fork in a threaded process;
            # the kernel's own threads (ZMQ, heartbeat) hold no lock the worker needs
            warnings.filterwarnings("ignore", message=r".*fork\(\) may lead to deadlocks",
                                    category=DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the worker; never returns
            _worker(self.work, parent, msg_w, out_w, err_w, (msg_r, out_r, err_r), self.stop,
                    self.env)
        self.pid = pid
        with contextlib.suppress(OSError):  # the worker does it too; whichever comes first
            os.setpgid(pid, pid)
        for fd in (msg_w, out_w, err_w):
            os.close(fd)
            self.fds.remove(fd)
        self.t0 = self.last_progress = self.last_step = time.monotonic()
        self.reader = FrameReader(msg_r)
        self.text_fds = {out_r: 1, err_r: 2}
        for fd in self.text_fds:
            os.set_blocking(fd, False)
        self.outputs = {fd: OutputLines(self.tail) for fd in self.text_fds}
        if hasattr(os, "pidfd_open"):
            with contextlib.suppress(OSError):
                self.pidfd = os.pidfd_open(pid)
                self.fds.append(self.pidfd)

    @contextlib.contextmanager
    def _sigint(self):
        """Count Ctrl-Cs instead of raising, so no message is torn mid-read (main thread only;
        elsewhere a KeyboardInterrupt is counted where it lands)."""
        previous = None
        if threading.current_thread() is threading.main_thread():
            with contextlib.suppress(ValueError):
                previous = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            yield
        finally:
            if previous is not None or signal.getsignal(signal.SIGINT) == self._on_sigint:
                signal.signal(signal.SIGINT, previous if previous is not None
                              else signal.default_int_handler)

    def _on_sigint(self, signum, frame) -> None:
        self.interrupts += 1

    def _kill_and_reap(self) -> None:
        """SIGKILL the worker's process group (its own children too) and collect the worker.

        The group is killed before the worker is reaped: while it is unreaped its id cannot be
        reused, so the signal cannot reach an unrelated process."""
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(self.pid, signal.SIGKILL)
        if self.reaped:
            return
        deadline = time.monotonic() + REAP_S
        while True:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (a SIGCHLD handler)
                self.reaped = True
                return
            if pid:
                self.reaped = True
                if self.exit_info is None:
                    self.exit_info = _decode_status(status)
                return
            if time.monotonic() > deadline:  # stuck in the kernel (a driver); reap it later
                self.exit_text = f"not reaped {REAP_S:.0f} s after SIGKILL (stuck in a driver?)"
                threading.Thread(target=_reap_later, args=(self.pid,), daemon=True).start()
                return
            time.sleep(0.005)

    def _close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()
        self.stop.close()

    # ---------------------------------------------------------------- the loop
    def _loop(self) -> str:
        while True:
            wait = max(0.0, min(self.poll, self._deadline() - time.monotonic()))
            fds = ([] if self.reader.eof else [self.reader.fd]) + list(self.text_fds)
            if self.pidfd is not None and self.exit_info is None:
                fds.append(self.pidfd)
            try:
                ready = select.select(fds, [], [], wait)[0]
                self._read(ready)
                self._deliver()
            except KeyboardInterrupt:  # not the main thread: it lands here
                self.interrupts += 1
            self._watch_stop()
            if self._peek_exit() is not None:
                self._read(list(self.text_fds) + [self.reader.fd])  # what it wrote before
                self._deliver()
                return "exited"
            now = time.monotonic()
            if self.interrupts >= 2:
                return "interrupted"
            if self.finished_at is not None:
                if now > self.finished_at + EXIT_GRACE_S:
                    return "finished"
                continue
            if self.stop_deadline is not None and now > self.stop_deadline:
                return "stop_timeout"
            if now > self._deadline():
                return "hung"

    def _read(self, ready: list[int]) -> None:
        if self.reader.fd in ready and not self.reader.eof:
            self.queue.extend(self.reader.read())
        for fd in ready:
            if fd in self.text_fds:
                self._pump_text(fd)

    def _pump_text(self, fd: int) -> None:
        """Copy what the worker printed to this process's stdout/stderr and keep the tail."""
        stream = self.text_fds[fd]
        while True:
            try:
                data = os.read(fd, 65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                del self.text_fds[fd]
                os.close(fd)
                self.fds.remove(fd)
                return
            text, lines = self.outputs[fd].feed(data)
            if self.forward_output:
                out = sys.stdout if stream == 1 else sys.stderr
                out.write(text)
                out.flush()
            for line in lines:
                self._watch_line(line.strip())

    def _watch_line(self, line: str) -> None:
        """Keep the line that best says why the worker died: the last one naming an error
        before faulthandler's stack dump (a C++ ``what():``, a CUDA message), else the last."""
        if line.startswith("Fatal Python error"):
            self.in_dump = True
            self.last_line = self.last_line or line
        elif line and not self.in_dump and not line.startswith("frame #"):
            self.last_line = line
            if "error" in line.lower():
                self.error_line = line

    def _deliver(self) -> None:
        while self.queue:
            message = self.queue.popleft()
            self._note(message)
            if self.on_message is not None:
                self.on_message(message)

    def _note(self, m: Message) -> None:
        now = time.monotonic()
        if m.kind == STEP_DONE:
            self.steps += 1
            info = m.payload if isinstance(m.payload, dict) else {}
            seconds, at = info.get("seconds"), info.get("at")
            at = now if at is None else at  # time.monotonic() is one clock for both processes
            if seconds is None and self.steps > 1:  # the first one includes start-up
                seconds = at - self.last_step
            if seconds is not None:
                self.durations.append(float(seconds))
            self.last_step, self.last_progress = at, now
            self.grace = None
        elif m.kind == HEARTBEAT:
            self.last_progress = now
            grace = m.payload.get("grace") if isinstance(m.payload, dict) else None
            self.grace = float(grace) if grace else None
        elif m.kind == STATE:
            self.state, self.state_steps = m.payload, self.steps
        elif m.kind in (DONE, ERROR):
            if m.kind == DONE:
                self.result, self.got_done = m.payload, True
            else:
                self.error = m.payload if isinstance(m.payload, dict) else {
                    "type": "?", "message": str(m.payload), "traceback": ""}
            self.finished_at = now

    def _watch_stop(self) -> None:
        asked = self.interrupts > 0
        if not asked and self.should_stop is not None and not self.stop_sent:
            asked = bool(self.should_stop())
        if asked and not self.stop_sent:
            self.stop.set()
            self.stop_sent = True
        if self.interrupts and self.stop_deadline is None and self.finished_at is None:
            median = statistics.median(self.durations) if self.durations else 0.0
            self.stop_wait = max(self.stop_grace, 3 * median)
            self.stop_deadline = time.monotonic() + self.stop_wait
            print("hybridnb: interrupt: the worker stops after its current step and sends its "
                  "state (interrupt again to kill it)", file=sys.stderr)

    def _limit(self) -> tuple[float, str]:
        """Seconds allowed since the last progress, and the name of the rule that set them."""
        if self.step_timeout is not None:
            limit, name = self.step_timeout, "step_timeout"
        else:
            limit, name = auto_step_timeout(list(self.durations), self.floor), "step_timeout"
        if self.steps < self.warmup_steps and self.first_step_grace > limit:
            limit, name = self.first_step_grace, "first_step_grace"
        if self.grace is not None and self.grace > limit:
            limit, name = self.grace, "the grace the worker asked for"
        return limit, name

    def _deadline(self) -> float:
        if self.finished_at is not None:
            return self.finished_at + EXIT_GRACE_S
        deadline = self.last_progress + self._limit()[0]
        if self.stop_deadline is not None:
            deadline = min(deadline, self.stop_deadline)
        return deadline

    def _peek_exit(self) -> tuple[str, int] | None:
        """How the worker ended, once it has; it stays unreaped (see ``_kill_and_reap``)."""
        if self.exit_info is not None:
            return self.exit_info
        if hasattr(os, "waitid"):
            try:
                r = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                self.exit_info, self.reaped = ("unknown", -1), True
                return self.exit_info
            if r is None:
                return None
            killed = r.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
            self.exit_info = ("signal", r.si_status) if killed else ("code", r.si_status)
            return self.exit_info
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if not pid:
            return None
        self.reaped, self.exit_info = True, _decode_status(status)
        return self.exit_info

    # ---------------------------------------------------------------- the outcome
    def _outcome(self, cause: str) -> Outcome:
        now = time.monotonic()
        median = statistics.median(self.durations) if self.durations else None
        how, number = self.exit_info or ("unknown", -1)
        exit_text = self.exit_text or (f"signal {signal_name(number)}" if how == "signal"
                                       else f"code {number}" if how == "code" else "unknown")
        out = Outcome(status="", reason="", result=self.result, error=self.error,
                      state=self.state, state_steps=self.state_steps, steps=self.steps,
                      median_step_s=median, seconds=now - self.t0, exit=exit_text,
                      interrupted=self.interrupts > 0, stop_sent=self.stop_sent,
                      bytes_received=self.reader.bytes_read,
                      output_tail="\n".join([*self.tail, *filter(
                          None, (o.partial for o in self.outputs.values()))]))
        steps = f"after {self.steps} step{'s' if self.steps != 1 else ''}"
        if self.got_done:
            out.status, out.reason = "done", f"the worker finished {steps}"
        elif self.error is not None:
            first = (str(self.error.get("message", "")).strip().splitlines() or [""])[0][:200]
            out.status = "error"
            out.reason = f"the worker raised {self.error.get('type', '?')} {steps}: {first}"
        elif cause == "hung":
            limit, name = self._limit()
            out.status = "hung"
            out.reason = (f"no step completed in {_secs(now - self.last_progress)} ({name}"
                          f"={_secs(limit)}); the worker was killed {steps}")
        elif cause == "interrupted":
            out.status, out.reason = "interrupted", f"interrupted twice: the worker was killed {steps}"
        elif cause == "stop_timeout":
            out.status = "interrupted"
            out.reason = (f"interrupted: the worker had not stopped {_secs(self.stop_wait)} "
                          f"after Ctrl-C and was killed {steps}")
        else:  # it exited without "done" or "error"
            out.status = "died"
            if how == "signal":
                name = signal_name(number)
                hint = _SIGNAL_HINTS.get(name)
                out.reason = f"worker killed by {name} {steps}" + (f" ({hint})" if hint else "")
            else:
                out.reason = f"worker exited with {exit_text} {steps} without sending a result"
            last = self.error_line or self.last_line
            if last:
                out.reason += f"; its last output: {last[:200]}"
        if self.reader.partial and out.status != "done":
            out.reason += "; a message it was sending was cut off"
        return out


# ============================================================================ the worker

def _worker(work, parent: int, msg_w: int, out_w: int, err_w: int, read_fds, stop: StopFlag,
            env: dict[str, str]) -> None:
    """The forked child: its own process group, its output into pipes, ``work``, exit.

    It always leaves with ``os._exit``: never back into the kernel's code, its atexit handlers
    or its threads' teardown."""
    code = 70
    channel = None
    try:
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)  # a Ctrl-C in the kernel's group does not reach it; killpg does
        _die_with(parent)
        for fd in read_fds:
            os.close(fd)
        os.environ.update(env)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.close(out_w)
        os.close(err_w)
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace",
                          closefd=False)
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace",
                          closefd=False)
        sys.stdin = open(os.devnull)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        faulthandler.enable(file=sys.stderr)  # a segfault or abort prints the Python stack
        channel = Channel(msg_w, stop)
        result = work(channel)
        if not channel.finished:
            try:
                channel.send(DONE, result)
            except Exception as exc:
                raise TypeError(f"work's result ({type(result).__name__}) cannot be sent to the "
                                f"kernel ({type(exc).__name__}: {exc}); return plain values "
                                "(numbers, dicts, CPU tensors)") from exc
        code = 0
    except BaseException as exc:
        if channel is not None and not channel.finished:
            channel.send_error(exc)
        else:
            with contextlib.suppress(BaseException):
                import traceback

                traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _die_with(parent: int) -> None:
    """Linux: the worker gets SIGKILL if the kernel dies (best effort elsewhere)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except Exception:
        pass
    if os.getppid() != parent:  # the kernel died before prctl took effect
        os._exit(1)


# ============================================================================ small helpers

def _decode_status(status: int) -> tuple[str, int]:
    if os.WIFSIGNALED(status):
        return "signal", os.WTERMSIG(status)
    return "code", os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1


def signal_name(number: int) -> str:
    """"SIGABRT" for 6; "signal N" for a number Python does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _secs(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"


def _reap_later(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
