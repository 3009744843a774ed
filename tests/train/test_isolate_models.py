"""Any model that trains in this process trains in the isolated worker, to the same bits.

- EEGNeX (the challenge's baseline; braindecode's max-norm layers are torch parametrizations,
  which torch refuses to pickle) trains isolated with the Trainer's default speed-ups and ends
  with the same weights as in process, in the kernel's own model object.
- One model holding EEGNet, braindecode's TCN, ShallowFBCSPNet and torch's weight norm (the
  parametrization and the old hook) and spectral norm, plus state outside ``state_dict()`` (an
  attribute annealed in ``forward``, a non-persistent buffer): the same weights, parametrizations'
  ``original``/``original0``/``original1`` included, and the same outside state after an
  isolated fit; an attribute that cannot travel back (a lock) is named once by its path.
- The zoo (``bench/zoo.py``), in this lane every parametrized model that trains in a few
  seconds and a few plain ones (``ZOO``): sent to one worker, which trains each two steps with
  the Trainer, and ends with the same weights as the same two steps here. (One worker for all:
  a worker per model would import braindecode each time. Every model of the zoo, each in its own
  isolated fit: ``bench/bench_zoo_isolate.py``, results/zoo-isolate-latest.md.)
"""

from __future__ import annotations

import functools
import threading

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrizations, parametrize
from torch.nn.utils import weight_norm as hook_weight_norm

from hybridnb import failures
from hybridnb.train.isolate import run_isolated
from hybridnb.train.trainer import Trainer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900),
              pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]

CHANS, TIMES = 129, 200
# six parametrized models (not FBMSNet, TIDNet, TCFormer, FBCNet, EEGTCNet: slower) and six plain
# ones; the bench has all
ZOO = ("ATCNet", "BDTCN", "EEGITNet", "EEGNeX", "EEGNet", "IFNet", "ShallowFBCSPNet", "SCCNet",
       "SyncNet", "SleepStagerChambon2018", "EEGMiner", "SincShallowNet")
TWO_STEPS = {"device": "cpu", "epochs": 1, "batch_size": 2, "grad_accum": 1, "seed": 0,
             "live": False, "verbose": False, "logger": None, "precision": "fp32"}


@pytest.fixture(autouse=True)
def _fresh_lost_devices(monkeypatch):
    monkeypatch.setattr(failures, "_LOST", set())


def windows(n: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, CHANS, TIMES, generator=g), torch.randn(n, 1, generator=g)


def assert_same_bits(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"not bit-identical: {different[:5]}"


def eegnex() -> nn.Module:
    from braindecode.models import EEGNeX

    torch.manual_seed(0)
    return EEGNeX(n_chans=CHANS, n_times=TIMES, sfreq=100, n_outputs=1)


def test_eegnex_trains_isolated_to_the_same_bits_in_the_kernels_model():
    states = {}
    for isolate in (False, True):
        model = eegnex()
        tr = Trainer(model, isolate=isolate, **{**TWO_STEPS, "speedups": "auto"})
        tr.fit(windows())
        assert tr.isolated is isolate
        assert not any(e.kind in ("worker_lost", "outside_state") for e in tr.events)
        assert tr.global_step == 2
        states[isolate] = {k: v.clone() for k, v in model.state_dict().items()}
    assert any(k.endswith("parametrizations.weight.original") for k in states[True])
    assert_same_bits(states[False], states[True])
    assert not torch.equal(states[True]["block_3.0.parametrizations.weight.original"],
                           eegnex().state_dict()["block_3.0.parametrizations.weight.original"])


class Bundle(nn.Module):
    """Parametrized layers of every kind, and state outside the state dict."""

    def __init__(self, lock: bool = False) -> None:
        super().__init__()
        from braindecode.models import TCN, EEGNet, ShallowFBCSPNet

        torch.manual_seed(0)
        self.eegnet = EEGNet(n_chans=CHANS, n_times=TIMES, sfreq=100, n_outputs=1)
        self.tcn = TCN(n_chans=CHANS, n_outputs=1, n_blocks=2, n_filters=8, kernel_size=3)
        self.shallow = ShallowFBCSPNet(n_chans=CHANS, n_times=TIMES, n_outputs=1,
                                       n_filters_time=8, n_filters_spat=8)
        self.weight_norm = parametrizations.weight_norm(nn.Linear(CHANS, 1))
        self.spectral_norm = parametrizations.spectral_norm(nn.Linear(CHANS, 1))
        self.hook_norm = hook_weight_norm(nn.Linear(CHANS, 1))
        self.temperature = 1.0           # annealed in forward: a plain attribute
        self.register_buffer("seen", torch.zeros(1), persistent=False)
        self.lock = lock

    def forward(self, x):
        if self.training:
            self.temperature *= 0.9
            self.seen += x.shape[0]
            if self.lock:
                self.held = threading.Lock()  # cannot travel back
        tcn = self.tcn(x)
        tcn = tcn.mean(dim=-1) if tcn.dim() == 3 else tcn
        mean = x.mean(dim=-1)
        return (self.eegnet(x) + tcn + self.shallow(x) + self.weight_norm(mean)
                + self.spectral_norm(mean) + self.hook_norm(mean)) * self.temperature


def test_every_kind_of_parametrization_and_the_state_outside_the_state_dict_come_back():
    runs = {}
    for isolate in (False, True):
        model = Bundle(lock=True)
        tr = Trainer(model, isolate=isolate, speedups=False, **TWO_STEPS)
        tr.fit(windows())
        assert not any(e.kind == "worker_lost" for e in tr.events)
        runs[isolate] = model, [e.message for e in tr.events if e.kind == "outside_state"]
    (here, said_here), (there, said) = runs[False], runs[True]
    names = set(there.state_dict())
    for key in ("weight_norm.parametrizations.weight.original0",
                "weight_norm.parametrizations.weight.original1",
                "spectral_norm.parametrizations.weight.original",
                "spectral_norm.parametrizations.weight.0._u", "hook_norm.weight_g",
                "eegnet.conv_spatial.parametrizations.weight.original",
                "tcn.temporal_blocks.temporal_block_0.conv1.parametrizations.weight.original1"):
        assert key in names, key
    assert parametrize.is_parametrized(there.weight_norm)
    assert_same_bits(here.state_dict(), there.state_dict())
    assert there.temperature == here.temperature == pytest.approx(0.9 ** 2)
    assert torch.equal(there.seen, here.seen) and there.seen.item() == 4
    assert there.training == here.training
    x = windows(2)[0]
    assert torch.equal(here.eval()(x), there.eval()(x))
    # the lock made in forward cannot travel back: named once, by its path
    assert said_here == [] and hasattr(here, "held") and not hasattr(there, "held")
    assert len(said) == 1 and "held (lock: cannot pickle" in said[0], said
    assert "isolate=False" in said[0]


def _train_each(channel, models: dict, data, settings: dict, threads: int) -> dict:
    """In the worker: each model trained by a Trainer there (with the kernel's torch threads, as
    an isolated fit has them: a sum split over other threads rounds otherwise); state dicts."""
    torch.set_num_threads(threads)
    out = {}
    for name, model in models.items():
        channel.heartbeat(phase=name)
        Trainer(model, isolate=False, **settings).fit(data)
        out[name] = model.state_dict()
    return out


def test_the_zoo_trains_in_a_worker_to_the_same_bits_as_here():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: bench.zoo
    from bench.zoo import classes, entry

    built = {name: entry(name, cls) for name, cls in classes() if name in ZOO}
    assert [n for n in ZOO if built.get(n) is None or built[n].build is None] == []
    assert sum(e.parametrized > 0 for e in built.values()) == 6  # EEGNeX, EEGNet, ATCNet, ...
    settings = {**TWO_STEPS, "speedups": False}
    sent = {name: e.build() for name, e in built.items()}  # seeded: twice the same weights
    data = windows()
    out = run_isolated(functools.partial(_train_each, models=sent, data=data,
                                         settings=settings, threads=torch.get_num_threads()),
                       start="spawn")
    models = {name: e.build() for name, e in built.items()}
    assert out.status == "done", out.reason
    differ = []
    for name, model in models.items():
        Trainer(model, isolate=False, **settings).fit(data)
        theirs, ours = out.result[name], model.state_dict()
        if ours.keys() != theirs.keys() or not all(torch.equal(ours[k], theirs[k]) for k in ours):
            differ.append(name)
    assert differ == []
