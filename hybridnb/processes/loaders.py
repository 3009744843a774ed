"""A torch ``DataLoader`` travels as its dataset and settings and is built again in the worker:
its live worker processes (``persistent_workers=True``) cannot be pickled. A plain
``DataLoader`` is rebuilt through its constructor; a subclass from its attributes.
"""

from __future__ import annotations

import copyreg
import functools
import inspect
import sys
from typing import Any

SETTINGS = ("num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn",
            "multiprocessing_context", "generator", "prefetch_factor", "persistent_workers",
            "pin_memory_device", "in_order")


def is_loader(obj: Any) -> bool:
    data = sys.modules.get("torch.utils.data")
    return data is not None and isinstance(obj, data.DataLoader)


def has_live_workers(loader: Any) -> bool:
    """Whether the loader holds an iterator with worker processes (persistent workers)."""
    return type(loader.__dict__.get("_iterator")).__name__ == "_MultiProcessingDataLoaderIter"


def reduce_loader(loader: Any) -> tuple:
    """The pickle reduction of a DataLoader (see the module docstring): a plain one as the
    constructor arguments that build it again, without its live iterator."""
    from torch.utils.data import DataLoader, IterableDataset

    if type(loader) is not DataLoader:
        state = dict(loader.__dict__)
        state["_iterator"] = None
        return copyreg.__newobj__, (type(loader),), state  # set as it is (no __setattr__ checks)
    accepted = inspect.signature(DataLoader.__init__).parameters
    kw: dict[str, Any] = {k: getattr(loader, k) for k in SETTINGS
                          if k in accepted and hasattr(loader, k)}
    if kw.get("num_workers", 0) == 0:
        kw.pop("prefetch_factor", None)
        kw["persistent_workers"] = False
    if loader.batch_size is None and loader.batch_sampler is not None:
        kw["batch_sampler"] = loader.batch_sampler       # the user's own batch sampler
    else:
        kw["batch_size"] = loader.batch_size
        kw["drop_last"] = loader.drop_last
        if not isinstance(loader.dataset, IterableDataset):
            kw["sampler"] = loader.sampler                # RandomSampler: shuffled
    return functools.partial(DataLoader, **kw), (loader.dataset,)
