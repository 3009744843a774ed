"""``hn.launch(fn, *args, num_processes=N)``: multi-process (DDP) training from a notebook cell.

Like Accelerate's ``notebook_launcher``: workers are forked by default, so a function defined in
a notebook is already in their memory; forking is only safe while CUDA is not initialised in the
kernel, so ``launch`` refuses when it is. The ranks get the torchrun environment plus
``HYBRIDNB_LAUNCHED=1``, so ``Trainer(strategy="auto")`` inside ``fn`` runs DDP. Rank 0's output
is streamed as text (widgets cannot be drawn from another process). The first interrupt asks
every rank to stop after the current step and save a checkpoint; a second kills them.
"""

from __future__ import annotations

import io
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from hybridnb import platform
from hybridnb.env import (  # HEADLESS: text view
    HEADLESS_ENV,
    LAUNCHED_ENV,
    NOTEBOOK_FRONTENDS,
    current,
    frontend,
)
from hybridnb.processes.channel import DONE, ERROR, Message
from hybridnb.processes.child import start_fork, start_spawn
from hybridnb.processes.ended import Ending
from hybridnb.processes.supervise import Watch, Watched

GRACE_S = 10.0  # after one rank fails, the others' time to stop (rank 0 saves a checkpoint)


class LaunchError(RuntimeError):
    """A worker of ``launch`` failed; the message has its traceback and last output."""


def launch(fn: Callable[..., Any], *args: Any, num_processes: int | None = None,
           master_port: int | None = None, start_method: str | None = None) -> Any:
    """Run ``fn(*args)`` in ``num_processes`` processes (one per GPU, or CPU processes with
    gloo) and return rank 0's result (it must pickle).

    ``num_processes=None``: every GPU that passed ``hn.detect()``'s probe (on a CPU-only machine
    ``fn`` is just called). ``start_method``: "fork" (default) or "spawn" (fresh interpreters;
    ``fn`` and ``args`` must pickle with cloudpickle)."""
    n = num_processes
    if n is None:
        from hybridnb.hardware.detect import detect

        n = max(1, sum(1 for g in detect().gpus if g.trusted and g.backend in ("cuda", "rocm")))
    elif not (isinstance(n, int) and n >= 1):
        raise ValueError(f"num_processes={n!r} must be an integer >= 1")
    if start_method not in (None, "fork", "spawn"):
        raise ValueError(f"start_method={start_method!r}: use 'spawn'"
                         + (" or 'fork'" if platform.fork() else ""))
    if n > 1 and not platform.child_pipes():
        platform.say_once(f"hn.launch: {platform.child_pipes().why}; running fn once in this "
                          f"process (1 process instead of {n})")
        n = 1
    if n == 1:
        return fn(*args)
    # start_fork spawns (and says so once) where this OS cannot fork
    method = start_method or ("fork" if platform.fork() else "spawn")
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
    return _run(fn, args, n, master_port or free_port(), method)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Rank:
    """One rank's process under the watch, and its result (rank 0) or its error."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.result: Any = None
        self.error: dict | None = None
        self.done = False
        self.watched: Watched | None = None

    def take(self, message: Message) -> None:
        if message.kind == DONE:
            self.result, self.done = message.payload, True
        elif message.kind == ERROR:
            self.error = message.payload

    def failed(self) -> str | None:
        """Why this rank failed (its traceback, or how its process ended), or None."""
        if self.error is not None:
            return str(self.error.get("traceback") or self.error.get("message"))
        ended = self.watched.child.exit
        if not self.watched.ended or (ended is not None and ended.code == 0):
            return None
        return f"process {self.index} {ended.says() if ended else self.watched.outcome.reason}"

    def output(self) -> str:
        return self.watched.child.output_text()


def _run(fn, args, n: int, port: int, method: str) -> Any:
    """Start the ranks under one watch, stream rank 0's output, collect its result; a failing
    rank gives the others ``GRACE_S`` to stop, then every rank is killed."""
    begin = start_fork if method == "fork" else start_spawn
    base = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(n),
            "LOCAL_WORLD_SIZE": str(n), LAUNCHED_ENV: "1", HEADLESS_ENV: "1", "GROUP_RANK": "0"}
    try:  # whether this process's output understands a redrawn \r progress line
        draws_cr = frontend() in NOTEBOOK_FRONTENDS or bool(sys.stdout.isatty())
    except (AttributeError, ValueError):  # no stdout, or a closed one
        draws_cr = False
    ranks = [_Rank(i) for i in range(n)]
    failure: list = []  # (rank, why, when)

    def failed_long_enough() -> bool:
        if not failure:
            why = next(((r, w) for r in ranks for w in [r.failed()] if w is not None), None)
            if why is not None:
                failure.append((*why, time.monotonic()))
        return bool(failure) and time.monotonic() > failure[0][2] + GRACE_S

    with Watch(keep_interrupt=True, interrupt_note=(
            "interrupt sent to every rank: they stop after the current step and save a "
            "checkpoint (interrupt again to kill them)")) as watch:
        for rank in ranks:
            env = {**base, "RANK": str(rank.index), "LOCAL_RANK": str(rank.index)}
            # SIGINT when this process dies: the ranks stop after an agreed step and save
            rank.watched = watch.start(
                lambda env=env, i=rank.index: begin(_rank_main, i, fn, args, draws_cr, env=env,
                                                    death_signal=signal.SIGINT,
                                                    merge_output=True),
                name=f"rank {rank.index}", on_message=rank.take, stop_signal=signal.SIGINT,
                forward_output=rank.index == 0)
        watch.run(until=failed_long_enough)
        watch.close()
    killed = [r.index for r in ranks if r.watched.outcome.status == Ending.INTERRUPTED]
    if killed:  # a second interrupt, or ranks that did not stop within the stop grace
        raise KeyboardInterrupt(f"hn.launch: rank(s) {killed} killed after the interrupt")
    failed_long_enough()
    if failure:
        rank, why, _ = failure[0]
        shown = [rank, *[r for r in ranks if r is not rank and r.output().strip()][:1]]
        raise LaunchError(
            f"rank {rank.index} of {n} failed; the other ranks were stopped.\n{why}"
            + "".join(f"\n--- last output of rank {r.index} ---\n{r.output()}" for r in shown
                      if r.output().strip())) from None
    if not ranks[0].done:
        raise LaunchError("rank 0 ended without a result (interrupted?)")
    return ranks[0].result


def _rank_main(channel, index: int, fn, args, draws_cr: bool) -> Any:
    """One rank (in its own process): its output, fn, rank 0's result back."""
    sys.stdout = _PipeText(1, draws_cr)
    sys.stderr = _PipeText(2, draws_cr)
    import torch

    if "OMP_NUM_THREADS" not in current():  # set: the user chose the thread count
        world = int(current()["WORLD_SIZE"])  # _run sets it for every rank
        torch.set_num_threads(max(1, torch.get_num_threads() // world))
    try:
        result = fn(*args)
    except KeyboardInterrupt:
        print(f"rank {index}: interrupted", file=sys.stderr, flush=True)
        raise
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        # only after success: leaving while another rank waits in a collective could block
        # both; a failed rank just exits, and the others' collectives then fail at once
        dist.destroy_process_group()
    return result if index == 0 else None


class _PipeText(io.TextIOWrapper):
    """Line-buffered text on a pipe that says it is a terminal when the parent's output draws
    ``\\r`` progress lines (so the text view shows its progress line)."""

    def __init__(self, fd: int, tty: bool) -> None:
        super().__init__(open(fd, "wb", buffering=0, closefd=False), encoding="utf-8",
                         errors="replace", line_buffering=True, write_through=True)
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty

