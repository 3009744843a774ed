"""The failures a notebook user meets, injected from outside, each in a fresh process.

Each case is a user's own model, Dataset or signal (never hybridnb's fault hooks), run through
the public API the way a notebook cell would, in its own interpreter
(``python -m bench.bench_failures --case NAME`` prints one JSON line). The table says what the
user is left with: steps, history, whether the weights moved, the error they read, what stayed
running, and how long it took. Issue 27's list of failures is the source of the cases.

    .venv/bin/python -m bench.bench_failures            # every case, table in bench/results
    .venv/bin/python -m bench.bench_failures --case lock
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHANS, TIMES = 8, 50


# ------------------------------------------------------------------------------ the user's code
def _torch():
    import torch
    from torch import nn
    from torch.utils.data import Dataset
    return torch, nn, Dataset


def tiny_model():
    torch, nn, _ = _torch()
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(CHANS * TIMES, 16), nn.ReLU(), nn.Linear(16, 1))


def windows(n: int, seed: int = 0):
    torch, _, _ = _torch()
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, CHANS, TIMES, generator=g), torch.randn(n, generator=g)


def make_dataset(kind: str, n: int, **kw):
    """The user's Datasets (classes defined here travel to the worker with cloudpickle)."""
    torch, _, Dataset = _torch()
    x, y = windows(n)

    class Raises(Dataset):
        def __len__(self):
            return n

        def __getitem__(self, i):
            if i == kw["at"]:
                raise ValueError(f"bad recording at item {i}")
            return x[i], y[i]

    class OtherShape(Dataset):
        def __len__(self):
            return n

        def __getitem__(self, i):
            return (torch.randn(CHANS, TIMES + 7) if i == kw["at"] else x[i]), y[i]

    class Slow(Dataset):
        def __len__(self):
            return n

        def __getitem__(self, i):
            if kw.get("marker") and not os.path.exists(kw["marker"]):
                Path(kw["marker"]).write_text(str(time.time()))
            time.sleep(kw["sleep"])
            return x[i], y[i]

    class FirstFetch(Dataset):
        """Writes the time of its first item (the first step's batch) once per process."""

        def __len__(self):
            return n

        def __getitem__(self, i):
            path = f"{kw['stamp']}.{os.getpid()}"
            if not os.path.exists(path):
                Path(path).write_text(repr(time.time()))
            return x[i], y[i]

    return {"raises": Raises, "other_shape": OtherShape, "slow": Slow,
            "first_fetch": FirstFetch}[kind]()


def trainer(model=None, **kw):
    import hybridnb as hn
    defaults = {"device": "cpu", "precision": "fp32", "batch_size": 16, "epochs": 1,
                "live": False, "verbose": False, "seed": 0, "lr": 1e-3}
    return hn.Trainer(model if model is not None else tiny_model(), **{**defaults, **kw})


def moved(model, init) -> bool:
    torch, _, _ = _torch()
    return any(not torch.equal(p, init[k]) for k, p in model.state_dict().items())


def first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}" if str(exc) else \
        type(exc).__name__


def children() -> list[int]:
    import psutil
    return [c.pid for c in psutil.Process().children(recursive=True) if c.is_running()
            and c.status() != psutil.STATUS_ZOMBIE]


# ------------------------------------------------------------------------------ the cases
def case_dataset_error() -> dict:
    """A Dataset raising ValueError at item 500 late in a run, no checkpoint_dir."""
    out = {}
    for isolate in (False, True):
        tr = trainer(isolate=isolate, epochs=1)
        init = {k: v.clone() for k, v in tr.model.state_dict().items()}
        try:
            tr.fit(make_dataset("raises", 640, at=500))
            err = "no error"
        except Exception as exc:
            err = first_line(exc)
        out["isolated" if isolate else "in process"] = {
            "global_step": tr.global_step, "step rows": len(tr.steps),
            "weights moved": moved(tr.model, init), "error": err}
    return out


def case_full_disk() -> dict:
    """A checkpoint write onto a 3 MB tmpfs, isolated fit (needs root to mount)."""
    torch, nn, _ = _torch()
    if os.geteuid() != 0:
        return {"skipped": "needs root to mount a tmpfs"}
    folder = tempfile.mkdtemp(prefix="hn-full-")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", folder], check=True)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Flatten(), nn.Linear(CHANS * TIMES, 400), nn.Linear(400, 1))
        tr = trainer(model, isolate=True, epochs=3, checkpoint_dir=folder)
        try:
            tr.fit(windows(160))
            err = "no error"
        except Exception as exc:
            err = first_line(exc)
        storage = [e.message[:160] for e in tr.events if e.kind == "storage"]
        return {"global_step": tr.global_step, "expected steps": 30, "error": err,
                "storage events": len(storage), "first": storage[:1]}
    finally:
        subprocess.run(["umount", folder], check=False)
        os.rmdir(folder)


def case_memmap() -> dict:
    """A Dataset over a 293 MB np.memmap, isolated: the kernel's peak memory growth."""
    import numpy as np
    import torch
    from torch.utils.data import Dataset

    n = 293 * 2**20 // (CHANS * TIMES * 4)
    path = Path(tempfile.mkdtemp(prefix="hn-mm-")) / "x.f32"
    mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, CHANS, TIMES))
    mm[:] = 0.5
    mm.flush()
    del mm
    data = np.load(path, mmap_mode="r")

    class Windows(Dataset):
        def __init__(self, arr):
            self.arr = arr

        def __len__(self):
            return len(self.arr)

        def __getitem__(self, i):
            return torch.from_numpy(np.array(self.arr[i])), torch.tensor(0.0)

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    tr = trainer(isolate=True, epochs=1, steps_per_epoch=3)
    tr.fit(Windows(data))
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    size = path.stat().st_size
    path.unlink()
    return {"data MB": round(size / 2**20),
            "kernel peak RSS growth MB": round(after - before), "global_step": tr.global_step}


def case_lock() -> dict:
    """A model holding a threading.Lock, isolated fit."""
    import traceback

    model = tiny_model()
    model[1]._lock = threading.Lock()
    tr = trainer(model, isolate=True)
    try:
        tr.fit(windows(64))
        return {"error": "no error", "global_step": tr.global_step}
    except Exception as exc:
        text = "".join(traceback.format_exception(exc))
        return {"error": first_line(exc), "names the attribute": "_lock" in str(exc),
                "traceback lines": len(text.splitlines()), "children left": len(children())}


def case_sigint_at_start() -> dict:
    """SIGINT at several moments while an isolated fit's worker starts (no warm spare, so
    every child counted is one the fit left behind)."""
    os.environ["HYBRIDNB_WARM_WORKER"] = "0"
    rows = []
    for delay in (0.01, 0.1, 0.3, 0.8, 1.5):
        timer = threading.Timer(delay, lambda: os.kill(os.getpid(), signal.SIGINT))
        tr = trainer(isolate=True, epochs=1)
        timer.start()
        try:
            tr.fit(windows(64))
            got = "returned"
        except KeyboardInterrupt:
            got = "KeyboardInterrupt"
        timer.cancel()
        time.sleep(1.0)
        said = [e.kind for e in tr.events if e.kind in ("interrupt", "stop_button")]
        rows.append({"delay s": delay, "fit": got, "steps": tr.global_step, "said": said,
                     "children left": len(children())})
    return {"runs": rows, "children left in all": sum(r["children left"] for r in rows)}


def case_sigint_in_validation() -> dict:
    """Ctrl-C 1 s into a validation that would take about 40 s, isolated fit."""
    marker = tempfile.mktemp(prefix="hn-val-")
    val = make_dataset("slow", 800, sleep=0.05, marker=marker)
    tr = trainer(isolate=True, epochs=2)

    def watch():
        while not os.path.exists(marker):
            time.sleep(0.05)
        time.sleep(1.0)
        watch.sent = time.monotonic()
        os.kill(os.getpid(), signal.SIGINT)

    watch.sent = None
    threading.Thread(target=watch, daemon=True).start()
    try:
        tr.fit(windows(64), val)
        got = "returned"
    except KeyboardInterrupt:
        got = "KeyboardInterrupt"
    back = time.monotonic() - watch.sent if watch.sent else None
    kinds = sorted({e.kind for e in tr.events})
    return {"fit": got, "seconds from Ctrl-C to return": None if back is None else round(back, 1),
            "global_step": tr.global_step, "event kinds": kinds,
            "says Stop clicked": any("Stop clicked" in e.message for e in tr.events)}


def case_peeked_loader() -> dict:
    """A DataLoader with persistent workers that was peeked, isolated fit."""
    from torch.utils.data import DataLoader, TensorDataset

    dl = DataLoader(TensorDataset(*windows(64)), batch_size=16, num_workers=1,
                    persistent_workers=True)
    next(iter(dl))
    tr = trainer(isolate=True)
    try:
        tr.fit(dl)
        return {"error": "no error", "global_step": tr.global_step}
    except Exception as exc:
        return {"error": first_line(exc), "global_step": tr.global_step}


def case_other_shape() -> dict:
    """A batch whose samples have another length (item 40), in process."""
    tr = trainer(isolate=False, batch_size=1)
    try:
        tr.fit(make_dataset("other_shape", 64, at=40))
        return {"error": "no error"}
    except Exception as exc:
        return {"error": first_line(exc), "global_step": tr.global_step}


def case_code_file() -> dict:
    """hn.load on a file written with torch.save(model) (pickled code)."""
    import torch

    import hybridnb as hn

    path = Path(tempfile.mkdtemp(prefix="hn-code-")) / "model.pt"
    torch.save(tiny_model(), path)
    try:
        hn.load(path, tiny_model())
        return {"error": "no error"}
    except Exception as exc:
        return {"error": first_line(exc)}


def case_second_fit() -> dict:
    """Two isolated fits in one process: seconds from fit() to the first batch read in the
    worker (the first step's data), warm worker on."""
    stamp = tempfile.mktemp(prefix="hn-first-")
    out = []
    for _ in range(3):
        data = make_dataset("first_fetch", 64, stamp=stamp)
        tr = trainer(isolate=True)
        before = {p.name for p in Path(stamp).parent.glob(Path(stamp).name + ".*")}
        t0 = time.time()
        tr.fit(data)
        new = [p for p in Path(stamp).parent.glob(Path(stamp).name + ".*")
               if p.name not in before]
        first = min(float(p.read_text()) for p in new) if new else None
        out.append(None if first is None else round(first - t0, 2))
        time.sleep(6)  # the next spare's imports finish, as between two notebook cells
    return {"seconds to first batch, fits 1..3": out}


def case_hang_first_step() -> dict:
    """A model whose forward hangs in the worker's first step, step_timeout=5, CPU."""
    _, nn, _ = _torch()

    class Hangs(nn.Module):
        def __init__(self):
            super().__init__()
            self.net, self.home = tiny_model(), os.getpid()

        def forward(self, x):
            if os.getpid() != self.home:
                time.sleep(3600)
            return self.net(x)

    tr = trainer(Hangs(), isolate=True, step_timeout=5)
    t0 = time.monotonic()
    tr.fit(windows(64))
    lost = [e.message[:160] for e in tr.events if e.kind == "worker_lost"]
    return {"seconds until the hang was found and the run went on": round(
        time.monotonic() - t0, 1), "global_step": tr.global_step, "worker_lost": lost[:1]}


CASES = {name[len("case_"):]: fn for name, fn in sorted(globals().items())
         if name.startswith("case_")}


def run_case(name: str, timeout: float = 300) -> dict:
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "bench.bench_failures", "--case", name],
                              cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"case": name, "result": f"still running after {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    result = json.loads(lines[-1]) if lines else {
        "exit": proc.returncode, "stderr": proc.stderr.strip().splitlines()[-3:]}
    return {"case": name, "result": result, "wall s": round(time.monotonic() - t0, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=sorted(CASES))
    args = parser.parse_args()
    if args.case:
        os.environ.setdefault("HYBRIDNB_WARM_WORKER", "1")
        print(json.dumps(CASES[args.case](), default=str))
        return
    from bench.common import write_result

    rows = []
    for name in CASES:
        row = run_case(name)
        print(json.dumps(row, default=str), flush=True)
        rows.append(row)
    body = ("Each case in a fresh interpreter, the fault from outside (the user's own model, "
            "Dataset or a signal), CPU. `result` is what the user is left with.\n\n"
            "| case | what it is | result | wall s |\n|---|---|---|---|\n" + "".join(
                f"| {r['case']} | {CASES[r['case']].__doc__.splitlines()[0]} | "
                f"`{json.dumps(r['result'], default=str)}` | {r.get('wall s', '')} |\n"
                for r in rows))
    write_result("failures", "Failures a notebook user meets, injected from outside", body)


if __name__ == "__main__":
    main()
