"""Nothing chosen silently (issue 28 item 2): what the Trainer chooses on the user's behalf
(detect()'s batch size and accumulation, device, precision, the default schedule, clipping and
weight decay) is named once in the run's first line; what the user gave is not; a batch size
given alone is never multiplied by detect()'s accumulation."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from hybridnb import failures
from hybridnb.hardware import detect as hardware_detect
from hybridnb.live.summary import header
from hybridnb.train.trainer import Trainer

torch.set_num_threads(1)


def fake_detect(batch_size=16, grad_accum=4):
    settings = SimpleNamespace(batch_size=batch_size, grad_accum=grad_accum, torch_threads=None)
    return SimpleNamespace(device=torch.device("cpu"), precision="fp32", settings=settings,
                           dataloader_kwargs=lambda: {"num_workers": 0})


@pytest.fixture(autouse=True)
def _advice(monkeypatch):
    monkeypatch.setattr(failures, "_LOST", set())
    monkeypatch.setattr(hardware_detect, "detect", fake_detect)


def data(n=128):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    return x, x.sum(1, keepdim=True)


def test_accumulation_from_detect_is_named_once_in_the_first_line(capsys):
    tr = Trainer(nn.Linear(8, 1), epochs=1, live=False, isolate=False, seed=0)
    assert (tr.batch_size, tr.grad_accum) == (16, 4)
    assert tr.plan(data()).total_steps == 2  # 8 batches of 16, 4 per optimizer step
    err = capsys.readouterr().err
    tr.fit(data())
    lines = capsys.readouterr().err.splitlines()
    assert not err and lines[0].startswith("hybridnb: Linear")  # the run's first line
    head = lines[0]
    chosen = head.split("chosen by the Trainer: ", 1)[1]
    for words in ("batch 16 × grad_accum 4 (detect())", "device cpu (detect())",
                  "precision fp32 (auto)", "schedule warmup_cosine", "clip_grad 1.0",
                  "weight_decay 0.01"):
        assert words in chosen
    assert sum("chosen by the Trainer" in ln for ln in lines) == 1
    assert len(tr.steps) == 2


def test_a_batch_size_given_alone_is_not_multiplied(capsys):
    tr = Trainer(nn.Linear(8, 1), epochs=1, batch_size=32, live=False, isolate=False)
    assert tr.grad_accum == 1
    tr.fit(data())
    head = capsys.readouterr().err.splitlines()[0]
    assert "grad_accum" not in head and "batch 32" in head
    assert "batch 32 (detect())" not in head and len(tr.steps) == 4


def test_what_the_user_gave_is_not_listed(capsys):
    tr = Trainer(nn.Linear(8, 1), epochs=1, batch_size=32, grad_accum=2, device="cpu",
                 precision="fp32", schedule=None, clip_grad=0.5, weight_decay=0.0,
                 speedups=False, live=False, isolate=False)
    tr.fit(data())
    head = capsys.readouterr().err.splitlines()[0]
    assert "batch 32 × grad_accum 2" in head and "chosen by the Trainer" not in head


def test_a_batch_size_set_after_construction_is_the_users():
    tr = Trainer(nn.Linear(8, 1), epochs=1, live=False, isolate=False)
    tr.batch_size = 8
    assert "batch_size" not in tr.settings.from_detect
    assert not any(c.startswith("batch") for c in tr.settings.chosen())


def test_the_header_lists_the_choices_for_every_view():
    run = {"model": "EEGNeX", "batch_size": 64, "grad_accum": 2, "epochs": 3,
           "steps_per_epoch": 10, "chosen": ["batch 64 × grad_accum 2 (detect())",
                                             "clip_grad 1.0"]}
    text = header(run)
    assert "batch 64 × grad_accum 2 ·" in text
    assert text.endswith("chosen by the Trainer: batch 64 × grad_accum 2 (detect()), "
                         "clip_grad 1.0")


def test_precision_left_to_detect_is_listed_as_taken_from_it():
    tr = Trainer(nn.Linear(8, 1), epochs=1, batch_size=8, live=False, isolate=False)
    assert "precision" in tr.settings.from_detect
    tr = Trainer(nn.Linear(8, 1), epochs=1, batch_size=8, precision="fp32", live=False,
                 isolate=False)
    assert "precision" not in tr.settings.from_detect
