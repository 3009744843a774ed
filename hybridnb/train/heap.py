"""The Python heap held still while a Trainer is built.

Building a Trainer builds its optimizer, and torch's ``Optimizer.__init__`` imports
``torch._dynamo`` the first time (about 100k new Python objects). Such a burst makes CPython's
cyclic garbage collector run full collections that walk every object of the process: torch,
braindecode, mne, hybridnb and whatever the notebook holds, about 430k objects. Measured on this
project's 2-core AMD EPYC (``bench/bench_peers.py``'s work, fresh processes, 4 interleaved rounds):
two full passes, 0.39 s, where a hand-written loop, which imports less, paid one of 0.17 s; with
the heap frozen the Trainer's whole fit went from 1.88 s to 1.50 s (loop: 1.53 s).

``frozen_heap()`` moves the objects that existed before into CPython's permanent generation
(``gc.freeze``) for the block, so those passes walk only what the block created, and gives them
back to the collector (``gc.unfreeze``) when it ends, normally or not. Nothing is kept from the
collector beyond the block: garbage that existed before is collected as usual afterwards, and the
training steps run with the collector as the user left it. A process that froze its heap itself (a
forkserver, a server that froze before forking) or turned the collector off is left as it was.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def frozen_heap() -> Iterator[bool]:
    """Freeze the current heap for the block (yields whether it did); unfreeze after it."""
    mine = gc.isenabled() and gc.get_freeze_count() == 0
    if mine:
        gc.freeze()
    try:
        yield mine
    finally:
        if mine:
            gc.unfreeze()
