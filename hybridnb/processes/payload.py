"""What a spawned child is given: a callable and its arguments, pickled with cloudpickle (a
notebook's functions travel by value), the big data kept out of the pickle stream: an array or
tensor in a file mapping travels as a reference (``refs``); any other CPU tensor or array of
``SHM_MIN_BYTES`` or more is written once into its own file under ``/dev/shm``, which the child
maps and unlinks at once (a snapshot: not ``share_memory_()``, which would let the child change
its parent's start state). Where ``/dev/shm`` has too little room (Docker's 64 MB) or fills up,
the files go to the temporary folder, and if that is full too into the pickle; each fallback is
said once. A part that cannot be pickled raises ``NotSendable``.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import pickle
import sys
import tempfile
import uuid
from typing import Any

from hybridnb import platform
from hybridnb.processes import refs
from hybridnb.processes.channel import tensor_bytes
from hybridnb.processes.unsendable import JobPickler, not_sendable

SHM_MIN_BYTES = 1 << 20
SHM_DIR = "/dev/shm"
SHM_RESERVE = 0.1  # the share of /dev/shm left free for others (DataLoader workers use it too)
_FULL = (errno.ENOSPC, errno.EDQUOT)


def _mb(n: float) -> str:
    return f"{n / 2**20:.0f} MiB"


class _Pickler(JobPickler):
    def __init__(self, file, folder: str, paths: list[str]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.folder: str | None = folder
        self.paths, self._seen = paths, {}
        self._locator = refs.Locator()

    def persistent_id(self, obj: Any):
        cls = type(obj)
        if cls.__module__ == "builtins":  # the common case, at once
            return None
        key = id(obj)
        if key in self._seen:
            return self._seen[key][1]
        torch = sys.modules.get("torch")  # no tensor can exist before torch is imported
        np = sys.modules.get("numpy")
        ref = None
        if (torch is not None and cls in (torch.Tensor, torch.nn.Parameter)
                and obj.device.type == "cpu" and obj.layout == torch.strided
                and not obj.is_quantized):
            # pickled by value, a view would take its whole storage along
            if max(obj.nbytes, obj.untyped_storage().nbytes()) >= SHM_MIN_BYTES:
                ref = refs.tensor_ref(obj, self._locator) or self._to_file(obj, torch)
        elif np is not None and cls in (np.ndarray, np.memmap) and not obj.dtype.hasobject:
            big = obj.nbytes >= SHM_MIN_BYTES
            if cls is np.memmap or big:
                ref = refs.ndarray_ref(obj, self._locator) or (self._to_file(obj, torch)
                                                               if big else None)
        if ref is not None:
            self._seen[key] = (obj, ref)  # obj kept alive: its id stays its own
        return ref

    def _leave_shm(self, why: str) -> None:
        self.folder = tempfile.gettempdir()
        platform.say_once(f"{SHM_DIR} {why}: the data for the worker process goes through files "
                          f"in {self.folder} instead (read from disk as the worker touches it). "
                          "In a Docker container give it more shared memory: "
                          "docker run --shm-size=8g ...", key="shm")

    def _write(self, data: memoryview) -> str | None:
        """``data`` in a new file; None when no folder has room (then it goes in the pickle)."""
        while self.folder is not None:
            if self.folder == SHM_DIR:
                usage = platform.shared_memory(SHM_DIR)  # there: pack saw it
                if usage.free - data.nbytes < SHM_RESERVE * usage.total:
                    self._leave_shm(f"has {_mb(usage.free)} free of {_mb(usage.total)}, too "
                                    f"little for {_mb(data.nbytes)}")
                    continue
            path = os.path.join(self.folder, f"hybridnb-{os.getpid()}-{uuid.uuid4().hex[:12]}")
            self.paths.append(path)  # first: an interrupted write is discarded too
            try:
                with open(path, "wb") as f:
                    f.write(data)
                return path
            except OSError as exc:
                if exc.errno not in _FULL:
                    raise
                discard([path])
                self.paths.remove(path)
                if self.folder == SHM_DIR:
                    self._leave_shm(f"is full ({exc.strerror})")
                else:
                    platform.say_once(f"{self.folder} is full too ({exc.strerror}): the data for "
                                      "the worker process goes through the pipe, in the pickle",
                                      key="pipe")
                    self.folder = None
        return None

    def _to_file(self, obj: Any, torch: Any) -> refs.FileRef | None:
        """A tensor's or array's bytes in a file of its own, sent as a reference to it (in C
        order; the worker removes the file once mapped); None: they go in the pickle."""
        if torch is not None and isinstance(obj, torch.Tensor):
            (dtype, shape, _, is_param, grad), raw = tensor_bytes(obj)
            dtype, mode = str(dtype).removeprefix("torch."), "r+"
            kind = "parameter" if is_param else "tensor"
        else:
            import numpy as np

            flat = np.ascontiguousarray(obj)
            raw, dtype, shape = memoryview(flat.reshape(-1).view(np.uint8)), flat.dtype, flat.shape
            kind, grad, mode = "ndarray", False, "r+" if obj.flags.writeable else "r"
        path = self._write(raw)
        if path is None:
            return None
        st = os.stat(path)
        return refs.FileRef(path, 0, raw.nbytes, 0, tuple(shape), None, dtype, kind, mode,
                            (st.st_dev, st.st_ino, st.st_size, None), grad, written=True)


def pack(obj: Any, files: list[str] | None = None) -> tuple[bytes, list[str]]:
    """The pickled ``obj`` and the files its big tensors and arrays went into, for ``discard``
    once the child is gone; ``files`` gets each as it is made (an interrupted caller knows what
    to discard). ``NotSendable`` names the part that cannot be pickled."""
    folder = platform.shared_memory(SHM_DIR).path or tempfile.gettempdir()
    buf = io.BytesIO()
    pickler = _Pickler(buf, folder, [] if files is None else files)
    try:
        pickler.dump(obj)
    except BaseException as exc:  # any failure: its files go; a part that cannot pickle is named
        discard(pickler.paths)
        if not isinstance(exc, Exception):
            raise
        found = not_sendable(obj)
        if found is None:
            raise
        raise found from None
    if pickler.live_loaders:
        platform.say("a DataLoader with live worker processes (persistent_workers, already "
                     "iterated) is sent as its dataset and settings; the worker process starts "
                     "its own loader workers, and this process keeps its own")
    return buf.getvalue(), pickler.paths


def unpack(data: bytes | memoryview) -> Any:
    """The child's side of ``pack`` (``refs.SentFileChanged``: a referenced file changed)."""
    unpickler = pickle.Unpickler(io.BytesIO(data))
    opened: dict[int, tuple] = {}  # a tensor sent twice (train and val) is one ref, opened once

    def load(ref):
        if id(ref) not in opened:  # the ref kept beside its object: its id stays its own
            opened[id(ref)] = (ref, refs.open_ref(ref))
        return opened[id(ref)][1]

    unpickler.persistent_load = load
    return unpickler.load()


def discard(paths: list[str]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path)
