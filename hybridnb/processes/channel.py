"""The message pipe between a supervised child and its parent. A frame is header | pickled
``(kind, payload)`` with each plain tensor replaced by a reference | the tensors' specs | their
raw bytes. The parent reads the pipe (non-blocking: it keeps watching the child meanwhile)
straight into tensors it allocated, so a state of tens of MB costs one copy on each side;
tensors arrive on the CPU, contiguous; a frame cut short is never delivered. A frame with no
specs section is a request already packed (``Requests.send_packed``). The stop request goes the
other way through one shared byte (``StopFlag``), read every step.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import pickle
import select
import struct
import tempfile
import threading
import time
import traceback
from collections.abc import Generator
from typing import Any, NamedTuple

from hybridnb import platform

MAGIC = b"HNw1"
HEADER = struct.Struct("<4sQQ")
PIPE_BYTES = 1 << 20  # ask Linux for a 1 MiB pipe (the default 64 KiB means 16x more wakeups)
FLUSH_INTERVAL_S = 0.1  # small messages wait at most this long (or until an urgent one)
BATCH_BYTES = 64 << 10  # a message larger than this is written at once

# kinds the supervisor itself reads (every message also goes to the caller's on_message)
DONE, ERROR, STATE, STEP_DONE, HEARTBEAT = "done", "error", "state", "step_done", "heartbeat"
READY = "ready"  # a started child is up (imports done): its start-up allowance ends
ANSWER = "answer"  # a child's answer to its parent's request (processes.framed)
PACKED = "packed"  # a request whose payload is ``payload.pack``'s bytes, not pickled again
URGENT = frozenset((DONE, ERROR, STATE, HEARTBEAT, READY, ANSWER))  # written at once, with what came before


class Message(NamedTuple):
    kind: str
    payload: Any


def widen_pipe(fd: int) -> None:
    """Best effort: a larger pipe buffer (Linux only; the system limit may refuse it)."""
    with contextlib.suppress(ImportError, AttributeError, OSError):
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)


# why a stop was asked: a should_stop callback (the Stop button), the caller's own callbacks,
# a signal; a reason is never lowered
STOP, CALLBACK, INTERRUPT = "stop", "callback", "interrupt"
_REASONS = (None, STOP, CALLBACK, INTERRUPT)  # by the code in the shared byte


class StopFlag:
    """One byte shared with the child saying why it should stop (0: it should not), in a file no
    path reaches (a memfd where there is one): a forked child keeps it, a spawned one inherits
    ``fd`` and opens it with ``StopFlag(fd=fd)``."""

    def __init__(self, fd: int | None = None) -> None:
        self.fd: int | None = fd
        if fd is None:
            if platform.memfd():
                self.fd = os.memfd_create("hybridnb-stop", os.MFD_CLOEXEC)
            else:  # a file no path reaches, as a memfd
                self.fd, path = tempfile.mkstemp(prefix="hybridnb-stop-")
                os.unlink(path)
            os.ftruncate(self.fd, 1)
        self._map = mmap.mmap(self.fd, 1)

    def set(self, reason: str = STOP) -> None:
        if reason not in _REASONS[1:]:
            raise ValueError(f"reason={reason!r}: use one of {_REASONS[1:]}")
        self._map[0] = max(self._map[0], _REASONS.index(reason))

    def reason(self) -> str | None:
        return _REASONS[self._map[0]]

    def close(self) -> None:
        self._map.close()
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None


class TensorPickler(pickle.Pickler):
    """Plain strided tensors are left out (``tensors``), to follow as raw bytes."""

    def __init__(self, file) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors: list = []
        self._seen: dict[int, int] = {}

    def persistent_id(self, obj):
        if not hasattr(obj, "untyped_storage"):  # not a tensor: torch is not asked
            return None
        import torch

        if (type(obj) not in (torch.Tensor, torch.nn.Parameter) or obj.layout != torch.strided
                or obj.is_quantized or obj.device.type == "meta"):
            return None
        if id(obj) not in self._seen:
            self._seen[id(obj)] = len(self.tensors)
            self.tensors.append(obj)
        return self._seen[id(obj)]


def encode(kind: str, payload: Any) -> tuple[list[bytes | memoryview], int]:
    """The frame for one message, as buffers to write in order, and its total size (pickled
    before anything is written: a payload that cannot be pickled leaves the stream intact)."""
    buf = io.BytesIO()
    pickler = TensorPickler(buf)
    pickler.dump((kind, payload))
    body = buf.getbuffer()
    sent = [tensor_bytes(t) for t in pickler.tensors]
    specs = [spec for spec, _ in sent]
    raws = [raw for _, raw in sent if raw.nbytes]
    spec_bytes = pickle.dumps(specs, protocol=pickle.HIGHEST_PROTOCOL)
    head = HEADER.pack(MAGIC, len(body), len(spec_bytes))
    parts = [head, body, spec_bytes, *raws]
    return parts, sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)


def tensor_bytes(t: Any) -> tuple[tuple, memoryview]:
    """A tensor's spec (dtype, shape, bytes, a Parameter?, requires grad?) and its CPU bytes."""
    import torch

    flat = t.detach().cpu().resolve_conj().resolve_neg().contiguous()
    spec = (flat.dtype, tuple(flat.shape), flat.nbytes, isinstance(t, torch.nn.Parameter),
            t.requires_grad)
    return spec, memoryview(flat.reshape(-1).view(torch.uint8).numpy())


def as_sent(t: Any, is_param: bool, requires_grad: bool) -> Any:
    import torch

    if is_param:
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    return t.requires_grad_(True) if requires_grad else t


def write_all(fd: int, parts: list[bytes | memoryview]) -> None:
    """Write every buffer completely (a pipe may take part of one)."""
    for part in parts:
        view = memoryview(part).cast("B")
        while view:
            n = os.write(fd, view)
            view = view[n:]


class Channel:
    """The child's side: ``send(kind, payload)``, any picklable payload; every kind also goes
    to the parent's ``on_message``. Small messages are batched, at most ``FLUSH_INTERVAL_S``
    late (each write wakes the parent, whose kernel can take the worker's core for milliseconds);
    ``URGENT`` kinds go at once with everything before them; order is always kept."""

    def __init__(self, fd: int, stop: StopFlag) -> None:
        self._fd, self._stop = fd, stop
        self._lock = threading.Lock()
        self._pending = bytearray()
        self._last_write = time.monotonic()
        self._flusher: threading.Thread | None = None

    def send(self, kind: str, payload: Any = None) -> None:
        parts, n = encode(kind, payload)
        urgent = kind in URGENT
        with self._lock:
            now = time.monotonic()
            if n <= BATCH_BYTES and not urgent:
                for part in parts:
                    self._pending += part
                if now - self._last_write >= FLUSH_INTERVAL_S:
                    self._flush(now)
                elif self._flusher is None:
                    self._flusher = threading.Thread(target=self._flush_late, daemon=True,
                                                     name="hybridnb-channel-flush")
                    self._flusher.start()
            else:
                self._flush(now)
                write_all(self._fd, parts)

    def flush(self) -> None:
        with self._lock:
            self._flush(time.monotonic())

    def _flush_late(self) -> None:
        """Write what waited (the worker may be in a long step, or hung)."""
        while True:
            time.sleep(FLUSH_INTERVAL_S)
            with self._lock:
                now = time.monotonic()
                if self._pending and now - self._last_write >= FLUSH_INTERVAL_S:
                    try:
                        self._flush(now)
                    except OSError:  # the kernel is gone; the worker's next send says so
                        return

    def _flush(self, now: float) -> None:
        if self._pending:
            write_all(self._fd, [self._pending])
            self._pending = bytearray()
        self._last_write = now

    def step_done(self) -> None:
        """A step finished, timed here (batching would blur its time on the parent's side)."""
        self.send(STEP_DONE, {"at": time.monotonic()})

    def heartbeat(self, phase: str | None = None, grace: float | None = None) -> None:
        """Alive: restarts the parent's silence clock. ``phase`` holds until another is named;
        ``grace``: silence allowed until the next message, when longer than the limit."""
        self.send(HEARTBEAT, {"phase": phase, "grace": grace})

    def state(self, state: Any) -> None:
        self.send(STATE, state)

    def stop_reason(self) -> str | None:
        """Why the parent asked the run to stop (whatever it is: finish the step and return)."""
        return self._stop.reason()

    def send_error(self, exc: BaseException) -> None:
        """Report ``exc`` with its formatted traceback."""
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        with contextlib.suppress(Exception):  # broad: best effort, the pipe may be gone
            self.send(ERROR, {"type": type(exc).__name__, "message": str(exc),
                              "traceback": text})


class FrameReader:
    """The parent's side: ``read()``, the messages completed so far, never blocking.
    ``partial``: a frame has begun but not finished."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self.fd = fd
        self.eof = self.closed = self.partial = False
        self._done: list[Message] = []
        self._frames = self._parse()

    def close(self) -> None:
        if not self.closed:
            self.closed = self.eof = True
            with contextlib.suppress(OSError):
                os.close(self.fd)

    def read(self) -> list[Message]:
        if not self.eof:
            next(self._frames, None)  # parses until the pipe is empty (ended: after a raise)
        done, self._done = self._done, []
        return done

    def _parse(self) -> Generator[None, None, None]:
        while True:
            head = yield from self._fill(memoryview(bytearray(HEADER.size)))
            magic, body_len, spec_len = HEADER.unpack(head)
            if magic != MAGIC:
                raise RuntimeError(f"unexpected bytes {bytes(head)!r} on the worker's message "
                                   "pipe (something else wrote to it)")
            meta = yield from self._fill(memoryview(bytearray(body_len + spec_len)))
            if not spec_len:  # a body already pickled (``child.Requests.send_packed``)
                self._done.append(Message(PACKED, meta))
                self.partial = False
                continue
            tensors, raws = _allocate(pickle.loads(meta[body_len:]))
            for raw in raws:  # straight into the tensors
                yield from self._fill(raw)
            unpickler = pickle.Unpickler(io.BytesIO(meta[:body_len]))
            unpickler.persistent_load = tensors.__getitem__
            self._done.append(Message(*unpickler.load()))
            self.partial = False

    def _fill(self, view: memoryview) -> Generator[None, None, memoryview]:
        """``view`` filled from the pipe; yields while the pipe is empty (for good at EOF)."""
        pos = 0
        while pos < len(view):
            try:
                n = os.readv(self.fd, [view[pos:]])
            except BlockingIOError:  # (EINTR is retried by Python itself)
                yield
                continue
            if n == 0:
                self.eof = True
                while True:
                    yield
            pos += n
            self.partial = True
        return view


def _allocate(specs: list) -> tuple[list, list[memoryview]]:
    """Empty tensors for the specs, and the byte views to read their data into."""
    if not specs:  # no tensor: torch is not imported (a framed child reads its requests so)
        return [], []
    import torch

    tensors, raws = [], []
    for dtype, shape, nbytes, is_param, requires_grad in specs:
        t = torch.empty(shape, dtype=dtype)
        if nbytes:
            raws.append(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
        tensors.append(as_sent(t, is_param, requires_grad))
    return tensors, raws


class Inbox(FrameReader):
    """A child's side of its request pipe (``child.Requests``)."""

    def get(self) -> Message | None:
        """The next request (blocks); None once the parent closed its end."""
        while not self._done:
            if self.eof:
                return None
            select.select([self.fd], [], [])
            next(self._frames, None)
        return self._done.pop(0)
