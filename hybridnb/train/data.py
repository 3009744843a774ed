"""DataLoaders for the Trainer: built from a Dataset with a resumable batch order
(``strategies.batches.ResumableBatchSampler``, importable from here), so a run resumed mid-epoch
sees exactly the batches a straight run would have seen next.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from hybridnb.strategies.batches import ResumableBatchSampler
from hybridnb.train.seeding import set_rng_state


def as_dataset(data, bus, what: str = "data") -> Dataset | DataLoader:
    """``data`` as a Dataset (or the DataLoader given); what cannot be one is a TypeError naming
    ``what`` and the call to make."""
    if isinstance(data, (Dataset, DataLoader)):
        return data
    arrays = data if isinstance(data, (tuple, list)) else (data,)
    if arrays and all(isinstance(a, (np.ndarray, torch.Tensor)) for a in arrays):
        sizes = [len(a) if a.ndim else 0 for a in arrays]
        if len(set(sizes)) > 1:
            raise ValueError(f"{what}: the arrays have {' vs '.join(map(str, sizes))} samples "
                             "(first dimension): X and y must have one row per sample each")
        return TensorDataset(*(torch.as_tensor(a) for a in arrays))
    if callable(getattr(data, "to_dataset", None)):
        return made_dataset(data, bus, what)
    kind = type(data).__name__
    if callable(getattr(data, "dataset", None)):
        raise TypeError(f"{what}: a {kind} is not a torch Dataset; it makes one with "
                        f".dataset(...): pass {what}.dataset(...) with the options your data "
                        "needs (its scale, crop, ...), e.g. trainer.fit(train.dataset(...), "
                        "val.dataset(...))")
    if hasattr(data, "__getitem__") and hasattr(data, "__len__") and not isinstance(
            data, (str, bytes, dict)):
        return data
    raise TypeError(f"{what}: data of type {kind} is not a Dataset, a DataLoader or (X, y) "
                    "arrays; pass (X, y) as one tuple, e.g. trainer.fit((X, y), (X_val, y_val))")


def made_dataset(data, bus, what: str = "data"):
    """``data.to_dataset()`` for an object that makes its own Dataset (a data library's windows),
    said once; anything else as it is (resolved before data travels to an isolated worker)."""
    if isinstance(data, (Dataset, DataLoader)) or not callable(getattr(data, "to_dataset", None)):
        return data
    kind = type(data).__name__
    made = data.to_dataset()
    if not isinstance(made, (Dataset, DataLoader)):
        raise TypeError(f"{what}: {kind}.to_dataset() returned a {type(made).__name__}, not a "
                        "torch Dataset or DataLoader")
    scale = getattr(made, "scale", None)
    scaled = f" (inputs x {scale:g})" if isinstance(scale, (int, float)) and scale != 1 else ""
    bus.note("data", f"{what}: a {kind} was given; using its to_dataset(), a "
             f"{type(made).__name__}{scaled} (pass {what}.dataset(...) yourself for other "
             "options)")
    return made


class IndexedBatches:
    """A TensorDataset's (and ``(X, y)`` arrays') batches by indexing, in a
    ``ResumableBatchSampler``'s order: what a DataLoader would collate, without loader workers
    or per-item collate (on the H100 host, collating 256 (129, 200) items held ShallowFBCSPNet
    to 14-18k samples/s against ~53k for the GPU)."""

    def __init__(self, tensors: tuple[torch.Tensor, ...], batch_sampler: ResumableBatchSampler,
                 generator: torch.Generator) -> None:
        self.tensors, self.batch_sampler, self.generator = tensors, batch_sampler, generator
        self.source = tensors  # where they came from (placing on a device keeps this copy)
        self.device = tensors[0].device

    def place(self, device: torch.device, bus) -> None:
        """The tensors on ``device`` when it is CUDA and they fit in half of its free memory
        (moved once, said once with the memory taken); else they stay where they are."""
        if device.type != "cuda" or self.device == device:
            return
        size = sum(t.numel() * t.element_size() for t in self.source)
        free, _ = torch.cuda.mem_get_info(device)
        if size > 0.5 * free:
            bus.note("data_streamed", f"the data ({size / 2**20:.0f} MiB) does not fit in half "
                     f"of {device}'s free memory ({free / 2**20:.0f} MiB): batches are copied "
                     "per step")
            return
        self.tensors = tuple(t.to(device) for t in self.source)
        self.device = device
        bus.note("data_on_device", f"the data was moved to {device} once "
                 f"({size / 2**20:.0f} MiB); batches are made there by indexing")

    def to_cpu(self) -> None:
        """Batches from the CPU copy from now on (after the device was lost: its copy is never
        read again)."""
        if self.source[0].device.type != "cpu":
            raise RuntimeError("the data was given as tensors on the lost device; nothing in "
                               "this process can read them again: pass CPU tensors (or arrays) "
                               "to continue on the CPU after a device failure")
        self.tensors, self.device = self.source, torch.device("cpu")

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        # a DataLoader draws its workers' base seed from the generator first: so do we, so the
        # batch order is the same as through a DataLoader with this generator
        torch.empty((), dtype=torch.int64).random_(generator=self.generator)
        for idx in self.batch_sampler:
            index = torch.as_tensor(idx, dtype=torch.long, device=self.device)
            yield tuple(t.index_select(0, index) for t in self.tensors)


def make_loader(data, *, batch_size: int, shuffle: bool, what: str, seed: int | None, strategy,
                loader_kwargs: dict, bus):
    """Batches for ``data`` in the resumable order (this rank's shard) of a seeded generator:
    in-memory tensors as ``IndexedBatches``, other Datasets through a DataLoader; a DataLoader
    given as it is; a stream in its own order, by one loader worker (more would each read all)."""
    data = as_dataset(data, bus, what)
    if isinstance(data, DataLoader):
        shards = getattr(data.batch_sampler, "world_size", 1)  # 1: every rank sees all of it
        if shards != strategy.world_size:
            raise ValueError(f"{what}: pass the Dataset, not a DataLoader, when training with "
                             f"{strategy.world_size} processes: the Trainer gives each "
                             "process its shard of every batch")
        return data
    gen = torch.Generator()  # the loader's (saved in checkpoints); without a seed, a random one
    gen.manual_seed(seed) if seed is not None else gen.seed()
    kwargs = dict(loader_kwargs)
    if isinstance(data, IterableDataset):
        if strategy.world_size > 1:
            raise ValueError(f"{what}: an IterableDataset ({type(data).__name__}) with "
                             f"{strategy.world_size} processes: each would read all of it. Shard "
                             "it by rank inside the dataset and pass a DataLoader, or use a "
                             "map-style Dataset (the Trainer shards those itself)")
        if shuffle:
            bus.note("data", f"the {what} data is an IterableDataset ({type(data).__name__}): "
                     "read in its own order, which the Trainer cannot shuffle (shuffle inside "
                     "the stream)")
        if kwargs.get("num_workers", 0) > 1:
            bus.note("loader", f"the {what} data is an IterableDataset: read by one loader "
                     f"worker (not {kwargs['num_workers']}: each would yield all of it)")
            kwargs["num_workers"] = 1
        kwargs["batch_size"] = batch_size
    else:
        if len(data) == 0:
            raise ValueError(f"{what} dataset is empty")
        sampler = strategy.batch_sampler(len(data), batch_size, shuffle, gen)
        if type(data) is TensorDataset:
            return IndexedBatches(tuple(data.tensors), sampler, gen)
        if kwargs.get("num_workers") or kwargs.get("pin_memory"):
            try:  # items on an accelerator: a forked worker cannot touch CUDA tensors
                item = data[0]
            except Exception:  # noqa: BLE001 - any dataset's error: the loader meets it, says it
                item = None
            items = item if isinstance(item, (tuple, list)) else (item,)
            if any(isinstance(t, torch.Tensor) and t.device.type != "cpu" for t in items):
                bus.note("loader", f"the {what} dataset yields tensors already on the device: "
                         "no loader workers and no pinned memory for it")
                kwargs.update(num_workers=0, pin_memory=False)
        kwargs["batch_sampler"] = sampler
    if kwargs.get("num_workers", 0) == 0:  # options that need worker processes
        kwargs.pop("persistent_workers", None)
        kwargs.pop("prefetch_factor", None)
    # torch seeds each worker's random, numpy and torch from gen: reproducible when it is seeded
    return DataLoader(data, generator=gen, **kwargs)


def epoch_batches(loader, state, bus) -> Iterator:
    """The epoch's batches from ``state.batches_done`` on, with the RNG states a straight run
    would have at that point (a resumed run continues bit for bit), shapes checked."""
    gen, start = getattr(loader, "generator", None), state.batches_done
    if start == 0:
        if state.pending_rng is not None:
            set_rng_state(state.pending_rng)
            if gen is not None and state.pending_rng.get("loader") is not None:
                gen.set_state(state.pending_rng["loader"])
            state.pending_rng = None
        state.epoch_start = {"torch": torch.get_rng_state(),
                             "loader": gen.get_state() if gen is not None else None}
        return same_sample_shape(iter(loader), 0, state.epoch)
    torch.set_rng_state(state.epoch_start["torch"])
    if gen is not None and state.epoch_start["loader"] is not None:
        gen.set_state(state.epoch_start["loader"])
    sampler = getattr(loader, "batch_sampler", None)
    skips = isinstance(sampler, ResumableBatchSampler)
    if skips:
        sampler.skip = start
    else:
        bus.say("resume_skip", f"reading and skipping {start} batches of this epoch to reach "
                "the saved position (pass a Dataset to skip without reading)")
    it = iter(loader)
    for _ in range(0 if skips else start):
        next(it)
    if state.pending_rng is not None:
        set_rng_state(state.pending_rng)
        state.pending_rng = None
    return same_sample_shape(it, start, state.epoch)


def same_sample_shape(batches: Iterator, start: int, epoch: int) -> Iterator:
    """``batches`` (numbered from ``start``) checked to hold samples of one shape, also within a
    batch (torch would say only ``mat1 and mat2 shapes cannot be multiplied``, later)."""
    first, index = None, start
    try:  # around the loader's next(): its collate fails on samples of different shapes
        for batch in batches:
            x = batch[0] if isinstance(batch, (tuple, list)) and batch else None
            if isinstance(x, torch.Tensor) and x.dim() > 0:
                shape = tuple(x.shape[1:])
                if first is None:
                    first = (index, shape)
                elif shape != first[1]:
                    raise ValueError(f"training batch {index} of epoch {epoch} holds samples of "
                                     f"shape {shape}, but batch {first[0]}'s are {first[1]}: "
                                     "every sample must have the same shape (look at that "
                                     "batch's items in the Dataset; crop or pad them)")
            yield batch
            index += 1
    except RuntimeError as exc:
        if "stack expects each tensor to be equal size" not in str(exc):
            raise
        raise ValueError(f"training batch {index} of epoch {epoch}: its samples have "
                         f"different shapes ({str(exc).strip().splitlines()[0]}): every "
                         "sample must have the same shape (crop or pad them in the "
                         "Dataset)") from None


class BatchCheck:
    """Turns a loader's batch into ``(x, y)`` and checks it: the structure, and float64 inputs
    (numpy's default) cast to the model's floating dtype, said once for training and
    evaluation together. ``first(x, y)`` sees the first training batch (the input shape for
    ``Trainer.save``, the targets' scale)."""

    def __init__(self, dtype: torch.dtype, bus, first=None) -> None:
        self.dtype, self.bus, self.first, self._noted = dtype, bus, first, False

    def __call__(self, batch) -> tuple:
        if not isinstance(batch, (tuple, list)) or len(batch) < 2:
            raise ValueError("training batches must be (x, y) or (x, y, *extras); got "
                             f"{type(batch).__name__}" + (f" of length {len(batch)}" if
                                                          isinstance(batch, (tuple, list)) else ""))
        x, y = self.cast(batch[0]), batch[1]
        if isinstance(y, torch.Tensor) and y.dtype == torch.float64 != self.dtype:
            y = y.to(self.dtype)
        if self.first is not None:
            first, self.first = self.first, None
            first(x, y)
        return x, y

    def cast(self, x):
        if isinstance(x, torch.Tensor) and x.dtype == torch.float64 != self.dtype:
            x = x.to(self.dtype)
            if not self._noted:
                self._noted = True
                dtype = str(self.dtype).replace("torch.", "")
                self.bus.note("dtype", f"the inputs are float64 (numpy's default); casting "
                              f"each batch to the model's {dtype} (cast the arrays once "
                              "beforehand to skip this)")
        return x
