"""Arrays and tensors whose memory lies in a file mapping (an ``np.memmap``, a view of one,
``torch.from_numpy(memmap)``, ``torch.from_file(...)``) travel as a reference, not a copy: the
file is found from the pointer in ``/proc/self/maps`` and ``open_ref`` maps the same bytes in
the worker, shared, read-only or copy-on-write as here. No reference (the bytes are sent) for
anonymous memory, a file deleted or replaced since, a private mapping with written pages, or no
/proc.
"""

from __future__ import annotations

import collections
import contextlib
import os
import warnings
from dataclasses import dataclass
from typing import Any

from hybridnb import platform
from hybridnb.processes.channel import as_sent


class SentFileChanged(RuntimeError):
    """A file sent by reference vanished or changed before the worker opened it."""


# one file mapping of this process, as /proc/self/maps lists it, with the pieces the kernel split
# it into merged back (an array lies within one mmap); dev is (major, minor)
Mapping = collections.namedtuple("Mapping", "start end perms offset dev inode path")


@dataclass(frozen=True)
class FileRef:
    """Where an array's bytes lie in a file, and how to view them again."""

    path: str
    offset: int                # the byte range of the file the array spans
    nbytes: int
    first: int                 # the byte of element 0 within that range
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None  # in bytes (None: C order)
    dtype: Any                 # a numpy dtype or a torch dtype name
    kind: str                  # "ndarray", "memmap", "tensor" or "parameter"
    mode: str                  # the np.memmap mode to open it with
    stamp: tuple               # (device, inode, size, mtime_ns or None)
    requires_grad: bool = False
    written: bool = False      # a file written for the worker (payload): removed once mapped


def read_mappings() -> list[Mapping]:
    """This process's file mappings, sorted by address (empty where /proc is missing)."""
    maps = platform.proc_path("self", "maps")
    if maps is None:
        return []
    try:
        with open(maps) as f:
            lines = f.read().splitlines()
    except OSError:  # /proc mounted but closed to this process (a hardened sandbox): no refs
        return []
    out: list[Mapping] = []
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/") or parts[5].endswith(" (deleted)"):
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        major, minor = (int(x, 16) for x in parts[3].split(":"))
        m = Mapping(lo, hi, parts[1], int(parts[2], 16), (major, minor), int(parts[4]), parts[5])
        prev = out[-1] if out else None
        if (prev is not None and prev.end == m.start
                and prev.offset + (prev.end - prev.start) == m.offset
                and (prev.perms, prev.dev, prev.inode, prev.path) == (m.perms, m.dev, m.inode,
                                                                       m.path)):
            out[-1] = prev._replace(end=m.end)  # the kernel split one mapping: merge it back
        else:
            out.append(m)
    return out


def _written_private_pages(start: int, end: int) -> int:
    """kB of copied-on-write pages in the mappings within [start, end); -1 when unknown."""
    total, inside, found = 0, False, False
    try:
        with open("/proc/self/smaps") as f:  # there: a mapping was found in /proc/self/maps
            for line in f:
                head = line.split(None, 1)[0]
                if "-" in head and not head.endswith(":"):
                    lo, hi = (int(x, 16) for x in head.split("-"))
                    inside = lo < end and hi > start
                elif inside and head == "Anonymous:":
                    total += int(line.split()[1])
                    found = True
    except (OSError, ValueError):
        return -1
    return total if found else -1


class Locator:
    """Finds the file mapping an address range lies in (reads /proc/self/maps once)."""

    def __init__(self) -> None:
        self._maps: list[Mapping] | None = None

    def ref(self, ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int,
            dtype: Any, kind: str, requires_grad: bool = False) -> FileRef | None:
        """A ``FileRef`` for the array at ``ptr`` if a file still holds its bytes, else None."""
        if any(n == 0 for n in shape):
            return None
        lo, hi = ptr, ptr + itemsize  # the lowest and one-past-the-highest byte it touches
        for n, s in zip(shape, strides, strict=True):
            if s < 0:
                lo += (n - 1) * s
            else:
                hi += (n - 1) * s
        if self._maps is None:
            self._maps = read_mappings()
        m = next((m for m in self._maps if m.start <= lo and hi <= m.end), None)
        if m is None:
            return None
        shared, writable = m.perms[3] == "s", m.perms[1] == "w"
        if not shared and writable and _written_private_pages(m.start, m.end) != 0:
            return None  # copy-on-write pages written: the file no longer holds these values
        try:
            st = os.stat(m.path)
        except OSError:
            return None
        if st.st_ino != m.inode or (os.major(st.st_dev), os.minor(st.st_dev)) != m.dev:
            return None  # the path now names another file
        mode = ("r+" if writable else "r") if shared else ("c" if writable else "r")
        # a writable shared mapping's own writes move the mtime: only its size and identity
        mtime = None if mode == "r+" else st.st_mtime_ns
        return FileRef(m.path, m.offset + (lo - m.start), hi - lo, ptr - lo, tuple(shape),
                       tuple(strides), dtype, kind, mode,
                       (st.st_dev, st.st_ino, st.st_size, mtime), requires_grad)


def ndarray_ref(arr: Any, locator: Locator) -> FileRef | None:
    """A reference for a numpy array (of no Python objects) in a file mapping, or None."""
    kind = "memmap" if type(arr).__name__ == "memmap" else "ndarray"
    return locator.ref(arr.__array_interface__["data"][0], arr.shape,
                       arr.strides, arr.itemsize, arr.dtype, kind)


def tensor_ref(t: Any, locator: Locator) -> FileRef | None:
    """A reference for a CPU tensor whose storage lies in a file mapping, or None."""
    import torch

    size = t.element_size()
    kind = "parameter" if isinstance(t, torch.nn.Parameter) else "tensor"
    return locator.ref(t.data_ptr(), tuple(t.shape), tuple(s * size for s in t.stride()), size,
                       str(t.dtype).removeprefix("torch."), kind, bool(t.requires_grad))


def _check(ref: FileRef) -> None:
    dev, ino, size, mtime = ref.stamp
    try:
        st = os.stat(ref.path)
    except OSError as exc:
        changes = [f"gone: {exc.strerror}"]
    else:
        changes = [what for what, changed in (
            ("replaced by another file", (st.st_dev, st.st_ino) != (dev, ino)),
            (f"size {size} -> {st.st_size} bytes", st.st_size != size),
            ("modified", mtime is not None and st.st_mtime_ns != mtime)) if changed]
    if changes:
        raise SentFileChanged(
            f"{ref.path}: the file behind an array sent by reference changed before the worker "
            f"opened it ({', '.join(changes)}); keep it in place and unchanged until the worker "
            "has started, or send a copy (np.array(x))")


def open_ref(ref: FileRef) -> Any:
    """The worker's side: the same bytes mapped again, as the same kind of object
    (``SentFileChanged`` when the file vanished or changed since)."""
    import numpy as np

    _check(ref)
    mm = (np.memmap(ref.path, np.uint8, ref.mode, offset=ref.offset, shape=(ref.nbytes,))
          if ref.nbytes else np.empty(1, np.uint8)[:0])  # empty, a memmap's strides
    if ref.written:  # mapped, it goes at once: its pages live as long as the array
        with contextlib.suppress(OSError):
            os.unlink(ref.path)
    if ref.kind in ("ndarray", "memmap"):
        cls = np.memmap if ref.kind == "memmap" else np.ndarray
        return np.ndarray.__new__(cls, ref.shape, np.dtype(ref.dtype), buffer=mm,
                                  offset=ref.first, strides=ref.strides)
    import torch

    dtype = getattr(torch, ref.dtype)
    with warnings.catch_warnings():  # a read-only mapping: writes fail there as they did here
        warnings.filterwarnings("ignore", message=".*not writable.*")
        raw = torch.from_numpy(mm)
    flat = raw.view(dtype)
    size = flat.element_size()
    t = flat.view(ref.shape) if ref.strides is None else flat.as_strided(
        ref.shape, [s // size for s in ref.strides], ref.first // size)
    return as_sent(t, ref.kind == "parameter", ref.requires_grad)
