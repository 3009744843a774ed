"""What a spawned worker is given (hybridnb.processes.payload): memory-mapped data by reference,
not by value; an object that cannot be sent named by its attribute path; a DataLoader with live
workers rebuilt from its dataset and settings. Memory is measured relative to the run itself.
"""

from __future__ import annotations

import glob
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
import threading

import numpy as np
import psutil
import pytest
import torch

from hybridnb.processes import NotSendable, payload, start_spawn, supervise
from hybridnb.processes.payload import discard, pack, unpack
from hybridnb.processes.refs import SentFileChanged

pytestmark = pytest.mark.timeout(180)

ROWS, COLS = 200, 1 << 18          # float32: 200 MiB
SIZE = ROWS * COLS * 4


@pytest.fixture(autouse=True)
def nothing_left_running():
    yield
    children = psutil.Process().children(recursive=True)
    assert children == [], f"processes left behind: {children}"


@pytest.fixture
def big_file(tmp_path):
    """A 200 MiB float32 file (sparse: a few rows written, the rest reads as zeros)."""
    path = tmp_path / "windows.f32"
    with open(path, "wb") as f:
        f.truncate(SIZE)
    mm = np.memmap(path, np.float32, "r+", shape=(ROWS, COLS))
    for row in (0, 7, 100, 150, ROWS - 1):
        mm[row, :1000] = np.arange(1000, dtype=np.float32) + row
    mm.flush()
    del mm
    return path


class MemmapDataset(torch.utils.data.Dataset):
    """A user's Dataset over a memmap, scaled lazily (like data_prep's window store)."""

    def __init__(self, x: np.ndarray, scale: float = 1e6) -> None:
        self.x, self.scale = x, scale

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return torch.from_numpy(np.array(self.x[i])) * self.scale


def _uss() -> int:
    return psutil.Process().memory_full_info().uss


def _shm_bytes(paths: list[str]) -> int:
    return sum(os.path.getsize(p) for p in paths if os.path.exists(p))


def test_a_memmap_dataset_is_packed_by_reference_without_reading_it(big_file):
    views = {
        "dataset": MemmapDataset(np.memmap(big_file, np.float32, "r", shape=(ROWS, COLS))),
        "slice": np.memmap(big_file, np.float32, "r", shape=(ROWS, COLS))[100:160, ::2],
        "tensor": torch.from_numpy(np.memmap(big_file, np.float32, "c", shape=(ROWS, COLS))),
        "from_file": torch.from_file(str(big_file), shared=False, size=ROWS * COLS),
    }
    before = _uss()
    data, files = pack(views)
    grown = _uss() - before
    assert len(data) < SIZE // 1000 and _shm_bytes(files) == 0
    assert grown < SIZE // 10, f"packing grew this process by {grown >> 20} MiB"
    out = unpack(data)
    assert isinstance(out["dataset"].x, np.memmap) and not out["dataset"].x.flags.writeable
    assert float(out["dataset"][7][5]) == 12.0 * 1e6
    assert np.array_equal(out["slice"][:, :500], views["slice"][:, :500])
    assert out["tensor"][150, 999] == 1149 and out["from_file"][COLS * 100 + 3] == 103
    out["tensor"][0, 0] = -1.0  # copy-on-write there as here: the file keeps its values
    assert np.memmap(big_file, np.float32, "r", shape=(ROWS, COLS))[0, 0] == 0.0


def test_a_spawned_child_reads_the_memmap_the_parent_never_copied(big_file):
    ds = MemmapDataset(np.memmap(big_file, np.float32, "r", shape=(ROWS, COLS)))

    def work(channel, dataset):
        return {"sum": float(dataset.x[95:155, :1000].sum()),
                "mapped": isinstance(dataset.x, np.memmap)}

    mine = f"/dev/shm/hybridnb-{os.getpid()}-*"  # not files of other runs on this machine
    before, shm_before = _uss(), set(glob.glob(mine))
    child = start_spawn(work, ds)
    shm = set(glob.glob(mine)) - shm_before
    assert _shm_bytes(list(shm)) < SIZE // 100
    out = supervise(lambda: child, silence=60)
    grown = _uss() - before
    assert out.ok, out.reason
    assert out.result == {"sum": float(ds.x[95:155, :1000].sum()), "mapped": True}
    assert grown < SIZE // 10, f"sending grew this process by {grown >> 20} MiB"


@pytest.mark.skipif(not hasattr(mmap, "MADV_DONTFORK"), reason="needs Linux madvise flags")
def test_a_mapping_the_kernel_split_in_pieces_still_travels_by_reference(big_file):
    """madvise on part of a mapping (as a library or the kernel may do) lists it as two lines
    of /proc/self/maps; an array across both is still one file reference."""
    with open(big_file, "rb") as f:
        mm = mmap.mmap(f.fileno(), SIZE, prot=mmap.PROT_READ)
    mm.madvise(mmap.MADV_DONTFORK, 0, mmap.PAGESIZE)  # the first page's flags differ: a split
    arr = np.frombuffer(mm, np.float32).reshape(ROWS, COLS)
    data, files = pack({"x": arr})
    assert len(data) < SIZE // 100 and not files  # a reference, not 200 MiB of bytes
    assert unpack(data)["x"][7, 5] == 12.0
    del arr


def test_an_unreadable_proc_maps_sends_the_bytes_instead(monkeypatch, tmp_path):
    """A sandbox may mount /proc but refuse its maps: the array goes by value, the fit starts."""
    from hybridnb.processes import refs

    monkeypatch.setattr(refs.platform, "proc_path", lambda *_: str(tmp_path))  # open() fails
    path = tmp_path / "small.f32"
    np.arange(256, dtype=np.float32).tofile(path)
    data, files = pack({"x": np.memmap(path, np.float32, "r")})
    try:
        assert np.array_equal(unpack(data)["x"], np.arange(256, dtype=np.float32))
    finally:
        discard(files)


def test_the_window_store_dataset_travels_by_reference(big_file):
    """data_prep's Windows.dataset(scale=...) over its float32 memmap store."""
    import pandas as pd

    from data_prep.windows import Windows

    X = np.memmap(big_file, np.float32, "r", shape=(ROWS, 1, COLS))
    meta = pd.DataFrame({"subject": [f"s{i % 4}" for i in range(ROWS)],
                         "target": np.arange(ROWS, dtype=np.float32),
                         "recording": np.arange(ROWS) // 10})
    w = Windows(X, meta, pd.DataFrame({"level": []}))
    ds = w.subset(np.arange(50, 160)).dataset(scale=1e6)
    before = _uss()
    data, files = pack(ds)
    assert len(data) < SIZE // 1000 and not files and _uss() - before < SIZE // 10
    X2, y2 = unpack(data)[[50, 51]]  # positions 50, 51 of the subset: rows 100 and 101
    assert float(X2[0, 0, 4]) == 104.0 * 1e6 and y2.tolist() == [100.0, 101.0]


@pytest.mark.parametrize("change", ["vanished", "truncated"])
def test_a_file_that_changed_before_the_worker_opened_it_is_named(big_file, change):
    data, _ = pack(np.memmap(big_file, np.float32, "r", shape=(ROWS, COLS)))
    if change == "vanished":
        os.unlink(big_file)
    else:
        with open(big_file, "r+b") as f:
            f.truncate(SIZE // 2)
    with pytest.raises(SentFileChanged, match=str(big_file)) as err:
        unpack(data)
    assert ("gone" if change == "vanished" else "size") in str(err.value)


def test_anonymous_tensors_and_arrays_still_go_through_shared_memory():
    arr, t = np.arange(1 << 18, dtype=np.float64), torch.ones(1 << 19)
    data, files = pack((arr, t, t[:0]))  # the empty view goes without its storage
    assert len(files) == 3 and len(data) < 10_000
    a2, t2, empty = unpack(data)
    discard(files)
    assert np.array_equal(a2, arr) and torch.equal(t2, t) and a2.flags.writeable
    assert empty.shape == (0,) and empty.dtype == t.dtype
    assert not [p for p in files if os.path.exists(p)]


def test_one_big_tensor_or_array_sent_twice_arrives_twice_and_stays_one():
    """The same X as train and val, or tied weights: one file, opened once, one object."""
    arr, t = np.arange(1 << 18, dtype=np.float64), torch.ones(1 << 19)
    data, files = pack({"train": (arr, t), "val": (arr, t)})
    out = unpack(data)
    discard(files)
    assert len(files) == 2
    assert out["train"][0] is out["val"][0] and out["train"][1] is out["val"][1]
    assert np.array_equal(out["val"][0], arr) and torch.equal(out["val"][1], t)


# ------------------------------------------------------------------ a small or full /dev/shm

# Run under ``unshare -Urm`` (a user and mount namespace: no root needed) with a 4 MB tmpfs on
# /dev/shm, as a Docker container's. The parent sends 12 MB of tensors (4 and 8 MB) to a spawned child,
# which sums them. ``reserve``: payload.SHM_RESERVE; -10 lets the pre-check pass so the write
# itself meets the full tmpfs (ENOSPC as the kernel raises it).
SMALL_SHM = """
import sys, torch
from hybridnb.processes import payload, start_spawn, supervise
payload.SHM_RESERVE = float(sys.argv[1])
def work(channel, a, b):
    return float(a.sum() + b.sum())
a, b = torch.ones(1 << 20), torch.full((2 << 20,), 2.0)
out = supervise(lambda: start_spawn(work, a, b), name="child")
print("RESULT", out.status, out.result)
"""


def _small_shm(reserve: float):
    if not shutil.which("unshare") or subprocess.run(
            ["unshare", "-Urm", "mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", "/dev/shm"],
            capture_output=True).returncode != 0:
        pytest.skip("no unprivileged mount namespace here (unshare -Urm) for a small /dev/shm")
    return subprocess.run(
        ["unshare", "-Urm", "sh", "-c", 'mount -t tmpfs -o size=4m tmpfs /dev/shm && exec "$@"',
         "sh", sys.executable, "-c", SMALL_SHM, str(reserve)],
        capture_output=True, text=True, timeout=150)


@pytest.mark.parametrize("reserve, why", [(0.1, "has 4 MiB free of 4 MiB, too little for 4 MiB"),
                                          (-10.0, "is full (No space left on device)")])
def test_a_small_or_full_dev_shm_sends_through_the_temporary_folder(reserve, why):
    run = _small_shm(reserve)
    assert "RESULT done 5242880.0" in run.stdout, run.stdout + run.stderr
    said = [line for line in run.stderr.splitlines() if "/dev/shm" in line]
    assert len(said) == 1 and why in said[0] and "--shm-size" in said[0], run.stderr
    assert tempfile.gettempdir() in said[0]


def test_a_full_dev_shm_said_once_and_the_data_arrives(monkeypatch, capfd):
    monkeypatch.setattr(payload.platform, "_said", set())
    full = payload.platform.SharedMemory("/dev/shm", 64 << 20, 1 << 20)  # Docker's default, full
    monkeypatch.setattr(payload.platform, "shared_memory", lambda path: full)
    t, arr = torch.arange(1 << 19, dtype=torch.float32), np.ones(1 << 18)
    for _ in range(2):
        data, files = pack((t, arr))
        assert len(files) == 2 and all(p.startswith(tempfile.gettempdir()) for p in files)
        t2, a2 = unpack(data)
        discard(files)
        assert torch.equal(t2, t) and np.array_equal(a2, arr)
    said = [line for line in capfd.readouterr().err.splitlines() if "/dev/shm" in line]
    assert len(said) == 1 and "has 1 MiB free of 64 MiB" in said[0] and "--shm-size" in said[0]


# ------------------------------------------------------------------ parametrized modules

class TwoNorms(torch.nn.Module):
    """weight norm and spectral norm (torch's parametrizations), one module held twice."""

    def __init__(self) -> None:
        super().__init__()
        from torch.nn.utils import parametrizations

        torch.manual_seed(0)
        self.a = parametrizations.weight_norm(torch.nn.Linear(600, 600))  # 1.4 MB: a file
        self.b = parametrizations.spectral_norm(torch.nn.Linear(8, 4))
        self.again = [self.b]


def test_a_parametrized_module_arrives_parametrized_bit_for_bit():
    from torch.nn.utils import parametrize

    model = TwoNorms()
    model.b(torch.randn(2, 8))  # a power iteration: u and v are not their initial values
    data, files = pack(model)
    copy = unpack(data)
    discard(files)
    assert files, "the large original went through shared memory"
    assert parametrize.is_parametrized(copy.a, "weight") and parametrize.is_parametrized(copy.b)
    assert type(copy.a).__name__ == "ParametrizedLinear" and type(copy.a) is not type(model.a)
    assert copy.again[0] is copy.b
    ours, theirs = model.state_dict(), copy.state_dict()
    assert list(ours) == list(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
    x = torch.randn(3, 600)
    assert torch.equal(model.a(x), copy.a(x)) and torch.equal(model.a.weight, copy.a.weight)
    with parametrize.cached():  # the module's own cache key, not the sender's
        assert torch.equal(copy.b.weight, model.b.weight)


# ------------------------------------------------------------------ what cannot be sent

class Encoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(2, 2, 3)
        self._lock = threading.Lock()


class Job:
    def __init__(self, model) -> None:
        self.model, self.epochs = model, 3


def test_an_object_that_cannot_be_sent_is_named_by_its_attribute_path(tmp_path):
    import functools

    def work(job, channel):
        return job.epochs

    model = torch.nn.Sequential()
    model.add_module("encoder", Encoder())
    with pytest.raises(NotSendable) as err:
        pack((functools.partial(work, Job(model)), (), {}))
    assert isinstance(err.value, TypeError)
    assert err.value.path == "job.model.encoder._lock" and err.value.kind == "_thread.lock"
    assert "__getstate__" in str(err.value) and "isolate=False" in str(err.value)
    assert err.value.__cause__ is None and not glob.glob(f"/dev/shm/hybridnb-{os.getpid()}-*")

    with open(tmp_path / "log.txt", "w") as log:
        with pytest.raises(NotSendable) as err:
            start_spawn(lambda channel, data, *, logger: 0, torch.ones(1 << 19),
                        logger={"file": log})
    assert err.value.path == "logger['file']" and "TextIOWrapper" in err.value.kind


# ------------------------------------------------------------------ loaders

class Squares(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 12

    def __getitem__(self, i):
        return torch.tensor([float(i * i)])


def test_a_peeked_persistent_loader_is_rebuilt_in_a_spawned_child(capfd):
    loader = torch.utils.data.DataLoader(Squares(), batch_size=4, num_workers=1,
                                         persistent_workers=True, drop_last=True)
    next(iter(loader))  # live workers now
    data, files = pack(loader)
    assert "hybridnb:" in capfd.readouterr().err
    rebuilt = unpack(data)
    assert (rebuilt.batch_size, rebuilt.num_workers, rebuilt.persistent_workers,
            rebuilt.drop_last) == (4, 1, True, True)
    del rebuilt

    def work(channel, dl):
        return [b.flatten().tolist() for b in dl]

    out = supervise(lambda: start_spawn(work, loader), silence=60)
    assert out.ok, out.reason
    assert out.result == [[0.0, 1.0, 4.0, 9.0], [16.0, 25.0, 36.0, 49.0],
                          [64.0, 81.0, 100.0, 121.0]]
    loader._iterator._shutdown_workers()  # this process's own loader workers


def test_a_shuffled_loader_keeps_its_sampler_and_generator():
    g = torch.Generator().manual_seed(3)
    loader = torch.utils.data.DataLoader(Squares(), batch_size=5, shuffle=True, generator=g)
    rebuilt = unpack(pack(loader)[0])
    assert type(rebuilt.sampler).__name__ == "RandomSampler"
    assert [b.flatten().tolist() for b in rebuilt] == [b.flatten().tolist() for b in loader]


def test_structured_arrays_keep_their_fields_by_reference_and_through_shared_memory(tmp_path):
    dtype = np.dtype([("t", "<f8"), ("label", "<i4")])
    anon = np.zeros(1 << 17, dtype)
    anon["label"] = 7
    path = tmp_path / "records.bin"
    anon.tofile(path)
    mapped = np.memmap(path, dtype, "r")
    data, files = pack((anon, mapped))
    a2, m2 = unpack(data)
    discard(files)
    assert a2.dtype == dtype and m2.dtype == dtype and isinstance(m2, np.memmap)
    assert int(a2["label"][5]) == 7 and int(m2["label"][-1]) == 7 and len(files) == 1
