"""braindecode's models on a real CUDA GPU through the isolated worker (skipped without one; see
conftest.py).

- EEGNeX, the challenge's baseline (parametrized max-norm layers), fits isolated on CUDA with
  the defaults (``isolate="auto"`` isolates a CUDA fit): the kernel's own model holds the
  trained weights, its parametrizations intact, and the kernel never started CUDA.
- The zoo's first step on CUDA: every model of ``bench/zoo.py`` that builds for the challenge's
  input (up to ``MAX_PARAMS`` parameters) is sent to one worker, which trains each one step on
  CUDA with the Trainer; each must finish its step there (no device lost, a finite loss).
"""

from __future__ import annotations

import functools
import math
import sys
from pathlib import Path

import pytest
import torch
from torch.nn.utils import parametrize

from hybridnb import failures
from hybridnb.train.isolate import run_isolated
from hybridnb.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
CHANS, TIMES = 129, 200
MAX_PARAMS = 50_000_000

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]


@pytest.fixture(autouse=True)
def _fresh_lost_devices(monkeypatch):
    monkeypatch.setattr(failures, "_LOST", set())


def windows(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, CHANS, TIMES, generator=g), torch.randn(n, 1, generator=g)


def test_eegnex_fits_isolated_on_cuda_into_the_kernels_model():
    from braindecode.models import EEGNeX

    torch.manual_seed(0)
    model = EEGNeX(n_chans=CHANS, n_times=TIMES, sfreq=100, n_outputs=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tr = Trainer(model, device="cuda", batch_size=16, epochs=2, seed=0, live=False,
                 verbose=False)
    assert tr.isolated  # "auto" isolates a CUDA run
    tr.fit(windows(), val=windows(32))
    assert not any(e.kind in ("worker_lost", "device_lost", "outside_state")
                   for e in tr.events), [str(e) for e in tr.events]
    assert tr.isolated and tr.global_step == 8
    assert parametrize.is_parametrized(model.block_3[0])
    key = "block_3.0.parametrizations.weight.original"
    assert not torch.equal(model.state_dict()[key].cpu(), before[key])
    assert math.isfinite(tr.history["val_loss"].iloc[-1])
    assert not torch.cuda.is_initialized()  # the kernel never started CUDA


def _first_steps(channel, models: dict, data) -> dict:
    """In the worker: one CUDA step of each model with the Trainer; name -> problem or ''."""
    out = {}
    for name, model in models.items():
        channel.heartbeat(phase=name, grace=300)
        try:
            tr = Trainer(model, device="cuda", isolate=False, epochs=1, batch_size=2,
                         steps_per_epoch=1, seed=0, live=False, verbose=False, logger=None)
            tr.fit(data)
            loss = tr.steps["loss"].iloc[-1]
            bad = [e.kind for e in tr.events if e.kind in ("device_lost", "worker_lost")]
            out[name] = (f"{bad}" if bad else "" if math.isfinite(loss) else f"loss {loss}")
        except Exception as exc:  # noqa: BLE001 - the test lists every failure
            out[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
        del model
        torch.cuda.empty_cache()
    return out


def test_the_zoos_first_step_on_cuda():
    sys.path.insert(0, str(ROOT))  # bench.zoo
    from bench.zoo import zoo

    built = {e.name: e for e in zoo(MAX_PARAMS) if e.build is not None}
    assert {"EEGNeX", "EEGNet", "ShallowFBCSPNet", "BDTCN"} <= set(built)
    models = {name: e.build() for name, e in built.items()}
    out = run_isolated(functools.partial(_first_steps, models=models, data=windows(4)),
                       start="spawn", step_timeout=600)
    assert out.status == "done", out.reason
    failed = {name: why for name, why in out.result.items() if why}
    assert failed == {}
    assert not torch.cuda.is_initialized()
