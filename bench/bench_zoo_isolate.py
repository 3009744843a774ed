"""braindecode's model zoo through the isolated worker: which models train there, to which bits.

Every model ``braindecode.models`` exports is built for the challenge's input (``bench/zoo.py``:
129 electrodes, 200 samples at 100 Hz, one output); each that builds trains two steps (4 windows,
batch 2, fp32, seed 0, no speed-ups) with ``hn.Trainer`` in this process and again with
``isolate=True`` (a spawned worker per model, as a user's fit), from the same seeded weights.
The table says whether each ran, whether the weights after the two steps are bit-identical, the
payload the kernel sent, and why a model is left out.

    .venv/bin/python -m bench.bench_zoo_isolate             # every model
    .venv/bin/python -m bench.bench_zoo_isolate EEGNeX TCN  # only these
"""

from __future__ import annotations

import sys
import time
import warnings

import torch

from bench.common import markdown_table, write_result
from bench.zoo import classes, entry

SETTINGS = {"device": "cpu", "epochs": 1, "batch_size": 2, "grad_accum": 1, "seed": 0,
            "live": False, "verbose": False, "logger": None, "precision": "fp32",
            "speedups": False}


def windows(n: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 129, 200, generator=g), torch.randn(n, 1, generator=g)


def payload_mb(model) -> float:
    """The bytes the kernel sends for the model: the pickle and its shared-memory files."""
    import os

    from hybridnb.processes.payload import discard, pack

    data, files = pack(model)
    try:
        return (len(data) + sum(os.path.getsize(f) for f in files)) / 1e6
    finally:
        discard(files)


def fit(build, isolate: bool) -> tuple[dict | None, str, float]:
    """(state dict, error, seconds) of a two-step fit."""
    from hybridnb.train.trainer import Trainer

    model = build()
    t0 = time.perf_counter()
    try:
        tr = Trainer(model, isolate=isolate, **SETTINGS)
        tr.fit(windows())
    except Exception as exc:  # noqa: BLE001 - the table says what failed
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:140]}", 0.0
    lost = [e.message for e in tr.events if e.kind in ("worker_lost", "outside_state")]
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return state, (lost[0][:140] if lost else ""), time.perf_counter() - t0


def row(name: str, cls: type) -> dict:
    e = entry(name, cls)
    if e.build is None:
        return {"model": name, "in process": "-", "isolated": "-", "identical": "-",
                "reason": f"left out: {e.reason}"}
    here, why_here, s_here = fit(e.build, False)
    there, why_there, s_there = fit(e.build, True)
    same = (here is not None and there is not None and here.keys() == there.keys()
            and all(torch.equal(here[k], there[k]) for k in here))
    return {"model": name, "params": e.params, "parametrized": e.parametrized,
            "payload MB": round(payload_mb(e.build()), 2),
            "in process": "ok" if here is not None else "FAILED",
            "isolated": "ok" if there is not None and not why_there else "FAILED",
            "identical": "yes" if same else "no",
            "s here": round(s_here, 1), "s isolated": round(s_there, 1),
            "reason": why_here or why_there}


def report(rows: list[dict], note: str = "") -> None:
    """Write the zoo table (``note``: a sentence on how the run went, when it was cut short)."""
    built = [r for r in rows if r["in process"] != "-"]
    body = (__doc__.split("\n\n    .venv")[0] + "\n\n" + (note + "\n\n" if note else "")
            + f"{len(rows)} models: {len(built)} build for the challenge's input and were "
            f"trained, {sum(r['reason'].startswith('left out') for r in rows)} are left out "
            "(the reason is in the table); of those trained, "
            f"{sum(r['isolated'] == 'ok' for r in built)} train isolated, "
            f"{sum(r['identical'] == 'yes' for r in built)} to the same bits as in process.\n\n"
            + markdown_table(rows, ["model", "params", "parametrized", "payload MB",
                                    "in process", "isolated", "identical", "s here",
                                    "s isolated", "reason"])
            + "\n`s here` / `s isolated`: wall seconds of each two-step fit (the isolated one "
              "includes starting the worker and importing braindecode there), on a shared "
              "machine.\n")
    write_result("zoo-isolate", "braindecode's models through the isolated worker", body,
                 [("every model that builds trains isolated",
                   all(r["isolated"] == "ok" for r in built)),
                  ("with the same weights as in process",
                   all(r["identical"] == "yes" for r in built))])


def main(only: list[str]) -> None:
    warnings.simplefilter("ignore")
    rows = []
    for name, cls in classes():
        if only and name not in only:
            continue
        r = row(name, cls)
        print(r, flush=True)
        rows.append(r)
    report(rows)


if __name__ == "__main__":
    main(sys.argv[1:])
