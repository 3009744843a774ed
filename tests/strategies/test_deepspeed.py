"""DeepSpeed ZeRO-2 on the CPU: real 2-process runs (gloo on 127.0.0.1, started by hn.launch).

What a user relies on: ``strategy="deepspeed"`` trains exactly like one process with the
global batch (ZeRO-2 only changes where the optimizer state and gradients live); both ranks end
with identical weights; rank 0 alone writes checkpoints, and they hold every rank's optimizer
partition; an OOM in one rank's forward is split on every rank; a NaN loss on one rank is
skipped by all without touching the weights; an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import functools
import os

import pytest
import torch
from test_distributed import (
    CUDA_OOM,
    EPOCHS,
    Faulty,
    assert_close,
    nan_loss,
    oom,
    sigint,
    train_rank,
    train_single,
    weights,
)

from hybridnb.strategies.launch import LaunchError, launch
from hybridnb.train import checkpoint

pytest.importorskip("deepspeed", reason="the optional deepspeed extra is not installed")

ds_rank = functools.partial(train_rank, strategy="deepspeed")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def same_on_both(r0, r1):
    for a, b in zip(r0["weights"], r1["weights"], strict=True):
        assert torch.equal(a, b) and torch.isfinite(a).all()


def test_zero2_trains_like_one_process_and_rank0_writes_every_partition(tmp_path, single):
    r0, r1 = launch(ds_rank, tmp_path, num_processes=2)
    assert (r0["strategy"], r1["strategy"]) == ("deepspeed", "deepspeed")
    assert not r0["shm_op"] and not r1["shm_op"]  # no 25-37 s C++ build for an unused op
    same_on_both(r0, r1)
    assert_close(r0["weights"], weights(single.model), atol=1e-5)
    h, hs = r0["history"], single.history
    assert h["step"].tolist() == hs["step"].tolist() == [3, 6, 9]
    assert torch.allclose(torch.tensor(h["val_loss"].values), torch.tensor(hs["val_loss"].values),
                          rtol=1e-5)
    assert r1["saves"] == [] and r0["saves"].count("last.pt") == EPOCHS
    state = checkpoint.load(tmp_path / "last.pt")
    parts = state["optimizer"]["ranks"]
    assert state["optimizer"]["world_size"] == 2 and [p["zero_rank"] for p in parts] == [0, 1]
    # each rank holds Adam moments for its half of the parameters only
    sizes = [sum(v["exp_avg"].numel() for v in p["base"]["state"].values()) for p in parts]
    n_params = sum(w.numel() for w in r0["weights"])
    assert sum(sizes) >= n_params and max(sizes) < n_params


def test_an_oom_in_one_ranks_forward_is_split_on_every_rank(tmp_path, single):
    # rank 1: call 3 = step 2's first micro-batch, 4 = its retry, 11 = a micro-batch after an
    # earlier one's backward was already reduced by ZeRO (those gradients must be dropped)
    r0, r1 = launch(ds_rank, tmp_path, (3, 4, 11), oom, num_processes=2)
    kinds0 = [k for k, _, _ in r0["events"] if k == "oom_split"]
    kinds1 = [k for k, _, _ in r1["events"] if k == "oom_split"]
    assert len(kinds0) == len(kinds1) == 3 and r0["micro"] == r1["micro"] == 1
    same_on_both(r0, r1)
    assert_close(r0["weights"], weights(single.model), atol=1e-5)  # no gradient counted twice
    assert r0["global_step"] == r1["global_step"] == 9


def test_a_nan_loss_on_one_rank_is_skipped_by_every_rank(tmp_path):
    r0, r1 = launch(ds_rank, tmp_path, (5,), nan_loss, num_processes=2)  # step 3, rank 1
    bad0 = [(k, step) for k, _, step in r0["events"] if k == "nonfinite_loss"]
    bad1 = [(k, step) for k, _, step in r1["events"] if k == "nonfinite_loss"]
    assert bad0 == bad1 == [("nonfinite_loss", 2)]
    same_on_both(r0, r1)
    assert r0["history"]["lr"].tolist() == r1["history"]["lr"].tolist()


def test_ctrl_c_on_one_rank_stops_both_and_resume_restores_every_partition(tmp_path, single):
    r0, r1 = launch(ds_rank, tmp_path, (7,), sigint, num_processes=2)
    assert r0["global_step"] == r1["global_step"] == 4
    assert checkpoint.load(tmp_path / "last.pt")["position"]["global_step"] == 4
    r0, r1 = launch(ds_rank, tmp_path, (), None, True, num_processes=2)
    assert r0["global_step"] == r1["global_step"] == 9
    same_on_both(r0, r1)
    assert_close(r0["weights"], weights(single.model), atol=1e-5)  # Adam moments came back


def test_ranks_with_uneven_shards_run_as_many_backward_passes(tmp_path):
    # 91 samples: each epoch's last global batch (11) is split 6 / 5; after the OOM splits
    # (micro-batch 1) rank 0 has one micro-batch more, and rank 1 pads with a zero-weight pass
    # (else ZeRO's gradient reduction would wait for ever)
    r0, r1 = launch(functools.partial(ds_rank, n=91), tmp_path, (3, 4, 11), oom,
                    num_processes=2)
    assert r0["micro"] == r1["micro"] == 1 and r0["global_step"] == r1["global_step"] == 9
    same_on_both(r0, r1)
    assert_close(r0["weights"], weights(train_single(n=91).model), atol=1e-5)


class OomInBackward(torch.autograd.Function):
    """Identity whose backward raises CUDA's OOM on rank 1's ``at``-th training call."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        raise torch.OutOfMemoryError(CUDA_OOM)


class FailsInBackward(Faulty):
    def forward(self, x):
        out = super().forward(x)
        if self.training and self.calls == 8 and os.environ.get("RANK") == "1":
            return OomInBackward.apply(out)
        return out


def test_an_oom_inside_backward_stops_the_job_and_keeps_the_last_checkpoint(tmp_path):
    # call 8 is step 4's second micro-batch (epoch 1): ZeRO-2 is reducing gradients inside
    # backward there, so the ranks cannot agree on a retry; the job must stop, not hang
    with pytest.raises(LaunchError) as info:
        launch(ds_rank, tmp_path, (), None, False, EPOCHS, FailsInBackward(), num_processes=2)
    assert "failed inside DeepSpeed's backward" in str(info.value)
    assert "resume with a smaller batch_size" in str(info.value)
    assert checkpoint.load(tmp_path / "last.pt")["position"]["global_step"] == 3  # epoch 0's
