"""``hn.launch(fn, *args, num_processes=N)``: multi-process (DDP) training from a notebook cell.

Like Accelerate's ``notebook_launcher``: the workers are started with the ``fork`` start method,
because a function defined in a notebook lives in the kernel's ``__main__``, which a ``spawn``ed
process cannot import; a forked worker already has it in memory. Forking is only safe while CUDA
is not initialised in the kernel (a CUDA context does not survive ``fork``), so ``launch`` refuses
with a clear message when it is; ``hn.detect()`` is safe to call first (it probes in a child).

Each worker gets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1``, a free
``MASTER_PORT`` and ``HYBRIDNB_LAUNCHED=1``, so ``Trainer(strategy="auto")`` inside ``fn`` runs
DDP. Rank 0's output is streamed into the cell (as text: widgets cannot be drawn from another
process); the other ranks' output is kept and shown if they fail. ``launch`` returns rank 0's
result (it must be picklable: a history table, metrics, a state_dict). A failing rank stops all
the others (no hang) and ``launch`` raises with its traceback. The first interrupt (the
notebook's stop button, Ctrl-C) asks every rank to stop after the current step and save a
checkpoint; a second one kills them. With one process ``launch`` simply calls ``fn``.
"""

from __future__ import annotations

import codecs
import collections
import io
import multiprocessing
import os
import pickle
import select
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from hybridnb.output import OutputLines
from hybridnb.env import HEADLESS_ENV, LAUNCHED_ENV, NOTEBOOK_FRONTENDS  # HEADLESS: text view

TAIL_LINES = 40
GRACE_S = 10.0  # after one rank fails, the others' time to stop (rank 0 saves a checkpoint)


class LaunchError(RuntimeError):
    """A worker of ``launch`` failed; the message has its traceback and last output."""


def launch(fn: Callable[..., Any], *args: Any, num_processes: int | None = None,
           master_port: int | None = None, start_method: str | None = None) -> Any:
    """Run ``fn(*args)`` in ``num_processes`` processes (one per GPU, or CPU processes with
    gloo) and return rank 0's result.

    ``num_processes=None`` uses every GPU that passed ``hn.detect()``'s probe (1 on a CPU-only
    machine, where ``fn`` is just called). ``start_method``: "fork" (default; needed for
    notebook-defined functions) or "spawn" (``fn`` must be importable; output is not captured).
    """
    n = _count(num_processes)
    if n == 1:
        return fn(*args)
    method = start_method or ("fork" if "fork" in multiprocessing.get_all_start_methods()
                              else "spawn")
    if method not in multiprocessing.get_all_start_methods():
        raise ValueError(f"start_method={start_method!r} is not available here; use one of "
                         f"{multiprocessing.get_all_start_methods()}")
    if start_method is None and method != "fork":
        print("hybridnb: fork is not available on this platform; starting workers with spawn "
              "(fn must be importable from a module, and their output is not captured)",
              file=sys.stderr)
    import torch

    if method == "fork" and torch.cuda.is_initialized():
        raise RuntimeError(
            "hn.launch() cannot start its workers: CUDA is already initialised in this kernel "
            "(something used the GPU before launch: a model or tensor moved to 'cuda', "
            "torch.cuda.* calls), and a forked process cannot use CUDA after that. Restart the "
            "kernel and call hn.launch(...) before anything touches the GPU; build the model "
            "and data inside the launched function (hn.detect() is safe to call before).")
    if method == "fork":
        import torch._dynamo  # noqa: F401  DDP imports it (seconds): once here, not once per rank
    return _Supervisor(fn, args, n, master_port or free_port(), method).run()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _count(num_processes: int | None) -> int:
    if num_processes is None:
        from hybridnb.hardware.detect import detect

        hw = detect()
        return max(1, sum(1 for g in hw.gpus if g.trusted and g.backend in ("cuda", "rocm")))
    if not (isinstance(num_processes, int) and num_processes >= 1):
        raise ValueError(f"num_processes={num_processes!r} must be an integer >= 1")
    return num_processes


def _frontend_draws_cr() -> bool:
    """Whether the parent's output understands a redrawn ``\\r`` progress line."""
    from hybridnb.env import frontend

    if frontend() in NOTEBOOK_FRONTENDS:
        return True
    try:
        return bool(sys.stdout.isatty())
    except (AttributeError, ValueError):
        return False


class _Supervisor:
    """Starts the workers, streams rank 0's output, collects its result, stops everything."""

    def __init__(self, fn, args, n: int, port: int, method: str) -> None:
        self.fn, self.args, self.n, self.port, self.method = fn, args, n, port, method
        self.outputs = [OutputLines(maxlen=TAIL_LINES) for _ in range(n)]

    def run(self) -> Any:
        import torch.multiprocessing as tmp

        capture = self.method == "fork"
        pipes = [os.pipe() for _ in range(self.n)] if capture else []
        ctx = multiprocessing.get_context(self.method)
        receiver, sender = ctx.Pipe(duplex=False)
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(self.port),
               "WORLD_SIZE": str(self.n), "LOCAL_WORLD_SIZE": str(self.n), LAUNCHED_ENV: "1",
               HEADLESS_ENV: "1"}
        sys.stdout.flush()  # or a forked worker would print what is still buffered here
        sys.stderr.flush()
        context = tmp.start_processes(
            _worker, args=(self.fn, self.args, env, sender, pipes, _frontend_draws_cr()),
            nprocs=self.n, join=False, start_method=self.method)
        sender.close()
        readers = {}
        for rank, (r, w) in enumerate(pipes):
            os.close(w)
            readers[r] = rank
        try:
            return self._supervise(context, receiver, readers)
        finally:
            _stop_all(context.processes)
            for fd in readers:
                os.close(fd)
            receiver.close()

    def _supervise(self, context, receiver, readers: dict[int, int]) -> Any:
        result, got, interrupts = None, False, 0
        open_fds = dict(readers)
        while True:
            try:
                waiting = list(open_fds) + ([receiver] if not got else [])
                ready = select.select(waiting, [], [], 0.1)[0] if waiting else []
                for item in ready:
                    if item is receiver:
                        try:
                            result, got = pickle.loads(receiver.recv_bytes()), True
                        except EOFError:
                            got = True  # rank 0 ended without sending (it failed or was stopped)
                    else:
                        self._pump(item, open_fds)
                if self._joined(context):
                    break
            except KeyboardInterrupt:
                interrupts += 1
                if interrupts > 1:
                    raise
                print("hybridnb: interrupt sent to every rank: they stop after the current "
                      "step and save a checkpoint (interrupt again to kill them)", file=sys.stderr)
                for p in context.processes:
                    if p.is_alive():
                        os.kill(p.pid, signal.SIGINT)
        for fd in list(open_fds):  # what is left; never block (a stray grandchild may hold it)
            while select.select([fd], [], [], 0.2)[0] and self._pump(fd, open_fds):
                pass
        if not got and receiver.poll():
            result, got = pickle.loads(receiver.recv_bytes()), True
        if not got or isinstance(result, _NoResult):
            raise LaunchError("rank 0 ended without a result" + (
                f": {result.why}" if isinstance(result, _NoResult) else " (interrupted?)"))
        return result

    def _joined(self, context) -> bool:
        from torch.multiprocessing.spawn import ProcessException

        try:
            return context.join(timeout=0, grace_period=GRACE_S)
        except ProcessException as exc:
            rank = exc.error_index
            tail = self.outputs[rank].text()
            others = [r for r in range(self.n) if r != rank and self.outputs[r].text()]
            raise LaunchError(
                f"rank {rank} of {self.n} failed; the other ranks were stopped.\n{exc}"
                + (f"\n--- last output of rank {rank} ---\n{tail}" if tail.strip() else "")
                + "".join(f"\n--- last output of rank {r} ---\n" + self.outputs[r].text()
                          for r in others[:1])) from None

    def _pump(self, fd: int, open_fds: dict[int, int]) -> bool:
        """Read what a rank wrote; rank 0's text goes to this process's stdout."""
        rank = open_fds[fd]
        try:
            data = os.read(fd, 65536)
        except OSError:
            data = b""
        if not data:
            del open_fds[fd]
            return False
        text, _ = self.outputs[rank].feed(data)
        if rank == 0:
            sys.stdout.write(text)
            sys.stdout.flush()
        return True


class _NoResult:
    def __init__(self, why: str) -> None:
        self.why = why


def _worker(index: int, fn, args, env: dict[str, str], sender, pipes, draws_cr: bool) -> None:
    """One rank: its environment, its output into the pipe, fn, rank 0's result back."""
    os.environ.update(env, RANK=str(index), LOCAL_RANK=str(index), GROUP_RANK="0")
    if hasattr(os, "setpgrp"):
        os.setpgrp()  # a Ctrl-C reaches the ranks only through the parent, once
    # (torch's wrapper already asks Linux for a SIGINT when the parent dies: the ranks then stop
    # after an agreed step and save a checkpoint)
    if pipes:
        _redirect(pipes, index, draws_cr)
    import torch

    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, torch.get_num_threads() // int(env["WORLD_SIZE"])))
    try:
        result = fn(*args)
    except KeyboardInterrupt:  # torch's wrapper would end the rank silently with exit code 0
        print(f"rank {index}: interrupted", file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        # only after success: leaving while another rank waits in a collective could block
        # both; a failed rank just exits, and the others' collectives then fail at once
        dist.destroy_process_group()
    if index == 0:  # plain pickle: tensors are copied, not shared with a process about to end
        try:
            payload = pickle.dumps(result)
        except Exception as exc:
            payload = pickle.dumps(_NoResult(
                f"its result ({type(result).__name__}) cannot be sent back ({type(exc).__name__}"
                f": {exc}); return plain values such as trainer.history, metrics or a "
                "state_dict"))
        sender.send_bytes(payload)


def _redirect(pipes, index: int, draws_cr: bool) -> None:
    """Point fd 1 and 2 (C++ and NCCL output too) and sys.stdout/stderr at this rank's pipe."""
    mine = pipes[index][1]
    for r, w in pipes:
        os.close(r)
        if w != mine:
            os.close(w)
    os.dup2(mine, 1)
    os.dup2(mine, 2)
    os.close(mine)
    sys.stdout = _PipeText(1, draws_cr)
    sys.stderr = _PipeText(2, draws_cr)


class _PipeText(io.TextIOWrapper):
    """Line-buffered text on a pipe that says it is a terminal when the parent's output draws
    ``\\r`` progress lines (so the text view shows its progress line)."""

    def __init__(self, fd: int, tty: bool) -> None:
        super().__init__(open(fd, "wb", buffering=0, closefd=False), encoding="utf-8",
                         errors="replace", line_buffering=True, write_through=True)
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


def _stop_all(processes, grace_s: float = 5.0) -> None:
    """Terminate the workers still running, then kill those that ignore it."""
    alive = [p for p in processes if p.is_alive()]
    for p in alive:
        p.terminate()
    deadline = time.monotonic() + grace_s
    for p in alive:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(1.0)
