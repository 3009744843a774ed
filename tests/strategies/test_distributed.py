"""DDP on the CPU: real 2-process runs (gloo on 127.0.0.1, started by hn.launch with fork).

What a user relies on: 2 ranks x batch B train exactly like 1 process x batch 2B; the ranks end
with identical weights; only rank 0 writes checkpoints; an OOM on one rank only is split on
every rank (no hang, same update); an unrecoverable error or a Ctrl-C on one rank stops all.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from hybridnb.strategies import ddp as distributed
from hybridnb.strategies.batches import global_batches, shard
from hybridnb.strategies.launch import LaunchError, launch
from hybridnb.train import checkpoint
from hybridnb.train.data import ResumableBatchSampler
from hybridnb.train.trainer import Trainer

CUDA_OOM = ("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 7.79 GiB total capacity; "
            "5.12 GiB already allocated; 1.01 GiB free; 5.50 GiB reserved in total by PyTorch)")
TRAIN_N, VAL_N, BATCH, ACCUM, EPOCHS = 96, 37, 8, 2, 3  # VAL_N odd: uneven shards, ordered gather


def data(n, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    return x, torch.sin(x @ torch.linspace(-1, 1, d)) + 0.05 * torch.randn(n, generator=g)


class Faulty(nn.Module):
    """A small MLP whose training forward calls ``effect(call)`` (raise, signal) on chosen
    call numbers, on rank 1 only."""

    def __init__(self, fail_on=(), effect=None):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
        rank1 = os.environ.get("RANK") == "1"
        self.fail_on, self.effect, self.calls = set(fail_on) if rank1 else set(), effect, 0

    def forward(self, x):
        if self.training and torch.is_grad_enabled():
            self.calls += 1
            if self.calls in self.fail_on and self.effect(self.calls) == "nan":
                return self.net(x) * float("nan")
        return self.net(x)


def oom(call):
    raise torch.OutOfMemoryError(CUDA_OOM)


def bad_batch(call):
    raise ValueError(f"bad batch at call {call}")


def sigint(call):
    os.kill(os.getpid(), signal.SIGINT)


def nan_loss(call):
    return "nan"


def weights(model):
    return [p.detach().clone() for p in model.parameters()]


def train_rank(ckpt_dir, fail_on=(), effect=None, resume=False, epochs=EPOCHS, model=None,
               strategy="auto", n=TRAIN_N):
    """One rank's run; returns every rank's outcome (gathered), so rank 0's result has all."""
    saves = []
    original = checkpoint.save

    def spy(state, path, keep_previous=False):  # this is a forked worker: no need to restore
        saves.append(Path(path).name)
        return original(state, path, keep_previous=keep_previous)

    checkpoint.save = spy
    tr = Trainer(model or Faulty(fail_on, effect), device="cpu", batch_size=BATCH, grad_accum=ACCUM,
                 epochs=epochs, lr=1e-2, seed=0, live=False, checkpoint_dir=ckpt_dir,
                 strategy=strategy)
    tr.fit(data(n), data(VAL_N, seed=1), resume=resume)
    mine = {"rank": tr.strategy.rank, "strategy": tr.strategy.name, "weights": weights(tr.model),
            "saves": saves, "events": [(e.kind, e.message, e.step) for e in tr.events],
            "micro": tr.state.micro, "global_step": tr.global_step, "history": tr.history,
            "stopped": tr.stopped,  # below: DeepSpeed built its inference-only shm op
            "shm_op": getattr(getattr(sys.modules.get("deepspeed.comm.comm"), "cdb", None),
                              "shm_comm_op", None) is not None,
            "pred": tr.predict(data(VAL_N, seed=1)[0]), "val": tr.evaluate(data(VAL_N, seed=1))}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return everyone


def train_single(n=TRAIN_N):
    """The same training in one process with twice the per-rank batch."""
    tr = Trainer(Faulty(), device="cpu", batch_size=2 * BATCH, grad_accum=ACCUM, epochs=EPOCHS,
                 lr=1e-2, seed=0, live=False, strategy="single")
    tr.fit(data(n), data(VAL_N, seed=1))
    return tr


def assert_close(a, b, atol=1e-6):
    for x, y in zip(a, b, strict=True):
        assert torch.allclose(x, y, rtol=1e-5, atol=atol), (x - y).abs().max()


# ------------------------------------------------------------------------------- real DDP runs
@pytest.mark.slow
@pytest.mark.timeout(90)
def test_two_ranks_train_like_one_process_with_twice_the_batch(tmp_path, single):
    r0, r1 = launch(train_rank, tmp_path, num_processes=2)
    assert (r0["rank"], r1["rank"], r0["strategy"]) == (0, 1, "ddp")
    for a, b in zip(r0["weights"], r1["weights"], strict=True):
        assert torch.equal(a, b)  # identical across ranks, not merely close
    assert_close(r0["weights"], weights(single.model))
    h, hs = r0["history"], single.history
    assert h["step"].tolist() == hs["step"].tolist() == [3, 6, 9]
    for col in ("train_loss", "val_loss", "val_rmse", "val_r2"):
        assert torch.allclose(torch.tensor(h[col].values), torch.tensor(hs[col].values),
                              rtol=1e-5), col
    # predict/evaluate: every rank scores its shard, the gather restores the dataset's order
    assert r0["pred"].shape == (VAL_N,)
    assert torch.allclose(torch.tensor(r0["pred"]),
                          torch.tensor(single.predict(data(VAL_N, seed=1)[0])), atol=1e-6)
    assert r0["val"]["rmse"] == pytest.approx(single.evaluate(data(VAL_N, seed=1))["rmse"],
                                              rel=1e-5)
    assert r0["val"] == r1["val"]
    # checkpoints are written by rank 0 only, and hold the final weights
    assert r1["saves"] == []
    assert r0["saves"].count("last.pt") == EPOCHS and "best.pt" in r0["saves"]
    state = checkpoint.load(tmp_path / "last.pt")
    assert state["position"]["global_step"] == 9
    assert_close(list(state["model"].values()), r0["weights"], atol=0)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_oom_on_one_rank_is_split_on_every_rank_without_a_hang(tmp_path, single):
    # rank 1 only: call 3 = step 2's first micro-batch; 4 = its retry; 11 = a later micro-batch
    # after earlier ones' backward (partial gradients must be dropped)
    r0, r1 = launch(train_rank, tmp_path, (3, 4, 11), oom, num_processes=2)
    splits0 = [m for k, m, _ in r0["events"] if k == "oom_split"]
    splits1 = [m for k, m, _ in r1["events"] if k == "oom_split"]
    assert len(splits0) == len(splits1) == 3
    assert all("CUDA out of memory" in m for m in splits1)
    assert all("rank 1 failed (OutOfMemoryError: CUDA out of memory" in m for m in splits0)
    assert r0["micro"] == r1["micro"] == 1  # 8 -> 4 -> 2 -> 1, the same on both ranks
    for a, b in zip(r0["weights"], r1["weights"], strict=True):
        assert torch.equal(a, b)
    assert_close(r0["weights"], weights(single.model), atol=1e-5)  # the same updates
    assert r0["global_step"] == r1["global_step"] == 9
    assert r1["saves"] == []


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_nan_loss_on_one_rank_is_skipped_by_every_rank(tmp_path):
    r0, r1 = launch(train_rank, tmp_path, (5,), nan_loss, num_processes=2)  # step 3, rank 1
    bad0 = [(k, step) for k, _, step in r0["events"] if k == "nonfinite_loss"]
    bad1 = [(k, step) for k, _, step in r1["events"] if k == "nonfinite_loss"]
    assert bad0 == bad1 == [("nonfinite_loss", 2)]  # during step 3, after 2 done
    for a, b in zip(r0["weights"], r1["weights"], strict=True):
        assert torch.equal(a, b) and torch.isfinite(a).all()
    assert r0["history"]["lr"].tolist() == r1["history"]["lr"].tolist()  # the same LR cut


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_an_unrecoverable_error_on_one_rank_stops_every_rank(tmp_path):
    with pytest.raises(LaunchError) as info:
        launch(train_rank, tmp_path, (3,), bad_batch, num_processes=2)
    text = str(info.value)
    assert "ValueError: bad batch at call 3" in text and "rank" in text
    # rank 0 was told (PeerFailure) and wrote the last good state (the start: no epoch ended)
    state = checkpoint.load(tmp_path / "last.pt")
    assert state["position"]["global_step"] == 0


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_ctrl_c_on_one_rank_stops_every_rank_after_the_same_step_and_resumes(tmp_path, single):
    r0, r1 = launch(train_rank, tmp_path, (7,), sigint, num_processes=2)
    assert r0["global_step"] == r1["global_step"] == 4  # call 7 is in step 4 (2 micro-steps)
    assert ("interrupt" in [k for k, _, _ in r0["events"]]
            and "interrupt" in [k for k, _, _ in r1["events"]])
    assert checkpoint.load(tmp_path / "last.pt")["position"]["global_step"] == 4
    # both ranks continue from rank 0's checkpoint, mid-epoch, and end where a straight run ends
    r0, r1 = launch(train_rank, tmp_path, (), None, True, num_processes=2)
    assert r0["global_step"] == r1["global_step"] == 9
    for a, b in zip(r0["weights"], r1["weights"], strict=True):
        assert torch.equal(a, b)
    assert_close(r0["weights"], weights(single.model), atol=1e-5)


class SignalInValidation(Faulty):
    """Rank 1 gets a Ctrl-C while it scores its second validation batch."""

    evals = 0

    def forward(self, x):
        if not self.training and os.environ.get("RANK") == "1":
            self.evals += 1
            if self.evals == 2:
                os.kill(os.getpid(), signal.SIGINT)
        return super().forward(x)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_ctrl_c_during_validation_on_one_rank_stops_every_rank_at_the_same_batch(tmp_path):
    r0, r1 = launch(train_rank, tmp_path, (), None, False, EPOCHS, SignalInValidation(),
                    num_processes=2)
    assert r0["stopped"] == r1["stopped"] == "interrupt"
    assert r0["global_step"] == r1["global_step"] == 3  # epoch 0 trained, its validation cut
    assert len(r0["history"]) == len(r1["history"]) == 0
    # what ran after fit (predict, evaluate) used matching collectives on both ranks
    assert r0["val"] == r1["val"] and r0["pred"].shape == (VAL_N,)


class Touch:
    def __init__(self, path):
        self.path = path

    def __call__(self, call):
        Path(self.path).touch()


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_interrupting_launch_stops_every_rank_after_an_agreed_step(tmp_path, capfd):
    """The notebook's stop button (SIGINT to the kernel) while launch() waits: the ranks finish
    the same step, rank 0 saves, and launch returns rank 0's result instead of raising."""
    started = tmp_path / "started"

    def interrupt_when_training():
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)  # launch() is still waiting: training runs 1000s

    threading.Thread(target=interrupt_when_training, daemon=True).start()
    r0, r1 = launch(train_rank, tmp_path, (3,), Touch(started), False, 10_000,
                    num_processes=2)
    assert r0["stopped"] == r1["stopped"] == "interrupt"
    assert 1 <= r0["global_step"] == r1["global_step"] < 30_000
    assert checkpoint.load(tmp_path / "last.pt")["position"]["global_step"] == r0["global_step"]
    assert "interrupt sent to every rank" in capfd.readouterr().err


# ------------------------------------------------------------------------------- launch()
def test_launch_refuses_when_cuda_is_initialised(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    called = []
    with pytest.raises(RuntimeError, match="CUDA is already initialised.*Restart the kernel"):
        launch(called.append, 1, num_processes=2)
    assert called == []


def test_launch_with_one_process_just_calls_fn(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    assert launch(lambda a, b: (a + b, os.environ.get("RANK")), 2, 3, num_processes=1) == (5, None)
    with pytest.raises(ValueError, match="num_processes=0"):
        launch(print, num_processes=0)


def fit_a_dataloader():
    tr = Trainer(nn.Linear(8, 1), device="cpu", batch_size=8, live=False)
    try:
        tr.fit(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*data(32))))
    except ValueError as exc:
        return str(exc)
    return "no error"


@pytest.mark.timeout(60)
def test_a_dataloader_is_refused_under_ddp_instead_of_training_every_rank_on_all_of_it():
    assert "pass the Dataset, not a DataLoader" in launch(fit_a_dataloader, num_processes=2)


def report_env(tag):
    print(f"{tag} from rank {os.environ['RANK']}", flush=True)
    return {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "HYBRIDNB_LAUNCHED")}


def test_launch_streams_rank0_output_and_returns_its_result(capfd):
    result = launch(report_env, "hello", num_processes=2)
    assert result == {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                      "HYBRIDNB_LAUNCHED": "1"}
    out = capfd.readouterr().out
    assert "hello from rank 0" in out and "hello from rank 1" not in out


# ------------------------------------------------------------------------------- the sampler
@pytest.mark.parametrize("n,batch,world", [(96, 8, 2), (37, 8, 2), (50, 4, 3), (33, 8, 2),
                                           (17, 8, 4), (5, 8, 5)])
def test_shards_of_each_step_are_the_single_process_batch(n, batch, world):
    """Every rank has the same number of non-empty batches; the ranks' parts of step k are
    batch k of one process with batch x world (the tail below `world` joins the last batch)."""
    ranks = [list(ResumableBatchSampler(n, batch, True, torch.Generator().manual_seed(3), r, world))
             for r in range(world)]
    assert len({len(r) for r in ranks}) == 1 and all(b for r in ranks for b in r)
    one = list(ResumableBatchSampler(n, batch * world, True, torch.Generator().manual_seed(3)))
    joined = [sum((r[k] for r in ranks), []) for k in range(len(ranks[0]))]
    flat_one = sum(one, [])
    assert sum(joined, []) == flat_one and sorted(flat_one) == list(range(n))
    if n % (batch * world) == 0 or n % (batch * world) >= world:
        assert joined == one


def test_unshuffled_shards_concatenate_in_dataset_order_and_resume_mid_epoch():
    spans = global_batches(37, 8, 2)
    assert spans == [(0, 16), (16, 32), (32, 37)]
    assert [shard(32, 37, r, 2) for r in range(2)] == [(32, 35), (35, 37)]
    s = ResumableBatchSampler(37, 8, False, torch.Generator(), 1, 2)
    s.skip = 2
    assert list(s) == [[35, 36]] and len(list(s)) == 3
    with pytest.raises(ValueError, match="3 samples cannot be shared by 4 processes"):
        ResumableBatchSampler(3, 8, False, torch.Generator(), 0, 4)


# ------------------------------------------------------------------------------- choosing
def test_strategy_choice_follows_the_launch_environment(monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert not distributed.wants_ddp("auto") and distributed.wants_ddp("ddp")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not distributed.wants_ddp("auto")
    for name, value in (("RANK", "1"), ("LOCAL_RANK", "1"), ("WORLD_SIZE", "4")):
        monkeypatch.setenv(name, value)
    assert distributed.launch_env() == (1, 1, 4)
    assert distributed.wants_ddp("auto") and not distributed.wants_ddp("single")


def test_a_ddp_strategy_object_made_without_a_device_picks_the_ranks(monkeypatch):
    """``Trainer(strategy=DDPStrategy())`` under torchrun: the object takes the rank's device
    (cuda:LOCAL_RANK, or the CPU with gloo where there is no GPU), as the name "ddp" does."""
    from hybridnb.strategies.launch import free_port

    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                        ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(free_port()))):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    try:
        s = distributed.DDPStrategy()
        assert s.device == torch.device("cpu") and s.backend == "gloo"
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_a_deepspeed_strategy_object_made_without_a_device_picks_the_ranks(monkeypatch):
    pytest.importorskip("deepspeed")
    from hybridnb.strategies.deepspeed import DeepSpeedStrategy
    from hybridnb.strategies.launch import free_port

    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                        ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(free_port()))):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    try:
        s = DeepSpeedStrategy()
        assert s.device == torch.device("cpu") and s.backend == "gloo"
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_asking_for_ddp_or_deepspeed_outside_a_job_says_what_to_do(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(RuntimeError, match="torchrun --nproc_per_node=N.*hn.launch"):
        Trainer(nn.Linear(2, 1), device="cpu", batch_size=2, live=False, strategy="ddp")
    with pytest.raises(ValueError, match="strategy='zero'"):
        Trainer(nn.Linear(2, 1), device="cpu", batch_size=2, live=False, strategy="zero")
    from hybridnb.strategies import deepspeed as deepspeed_strategy

    monkeypatch.setattr(deepspeed_strategy, "available", lambda: False)
    with pytest.raises(ImportError, match="pip install deepspeed"):
        Trainer(nn.Linear(2, 1), device="cpu", batch_size=2, live=False, strategy="deepspeed")
    monkeypatch.setattr(deepspeed_strategy, "available", lambda: True)
    with pytest.raises(RuntimeError, match="strategy='deepspeed' needs.*torchrun"):
        Trainer(nn.Linear(2, 1), device="cpu", batch_size=2, live=False, strategy="deepspeed")


# ------------------------------------------------------------------------------- from a notebook
NOTEBOOK_CELL = r"""
import os, torch, hybridnb as hn
from torch import nn

def fn(n):  # defined in the kernel's __main__, as in a notebook: only a forked worker has it
    from hybridnb.train.trainer import Trainer
    x = torch.randn(n, 8, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    tr = Trainer(nn.Linear(8, 1), device="cpu", batch_size=8, epochs=2, seed=0, live="auto")
    tr.fit((x, x.sum(1)))
    print(f"rank {os.environ['RANK']} done: {tr.strategy.name}", flush=True)
    from hybridnb.live import choose_renderer
    return {"rank": tr.strategy.rank, "world": tr.strategy.world_size, "steps": tr.global_step,
            "view": choose_renderer("auto")[0]}

print("RESULT", hn.launch(fn, 64, num_processes=2))
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_launch_from_a_notebook_kernel_trains_ddp_and_streams_rank0():
    """A real IPython kernel (posing as Colab): fn defined in a cell, hn.launch(fn,
    num_processes=2) trains DDP, the cell shows rank 0's progress as text (a worker must not
    draw widgets through the kernel's sockets) and gets rank 0's result."""
    jupyter_client = pytest.importorskip("jupyter_client")
    km, kc = jupyter_client.manager.start_new_kernel(
        kernel_name="python3", env={**os.environ, "COLAB_RELEASE_TAG": "simulated"})
    try:
        reply = kc.execute_interactive(NOTEBOOK_CELL, timeout=100, output_hook=(out := []).append)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    text = "".join(m["content"].get("text", "") for m in out if m["msg_type"] == "stream")
    errors = [m["content"] for m in out if m["msg_type"] == "error"]
    assert reply["content"]["status"] == "ok", errors
    assert "rank 0 done: ddp" in text and "rank 1 done" not in text
    assert "hybridnb · Linear" in text and "epoch 1/1" in text  # rank 0's live view, as text
    assert "RESULT {'rank': 0, 'world': 2, 'steps': 8, 'view': 'text'}" in text  # 64/(8x2) x 2


# ------------------------------------------------------------------------------- torchrun
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = [str(ROOT / "examples" / "train_ddp.py"), "--device", "cpu", "--epochs", "1",
           "--samples", "128"]


def torchrun(*args: str) -> subprocess.Popen:
    """``torchrun <args>`` from the repository root, outside any job, output merged."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env={**env, "OMP_NUM_THREADS": "1"}, start_new_session=True)


def finished(*procs: subprocess.Popen, timeout: float) -> list[str]:
    """Each run's output once all ended; on a timeout every run's process group is killed, so
    no rank outlives its test (a left-over rank failed every later test's no-child check)."""
    try:
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
    assert [p.returncode for p in procs] == [0] * len(procs), "\n".join(o[-3000:] for o in outs)
    return outs


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_example_script_runs_under_torchrun(tmp_path):
    [out] = finished(torchrun("--standalone", "--nproc_per_node=2", *EXAMPLE, "--out",
                              str(tmp_path)), timeout=110)
    assert out.count("done: strategy ddp, 2 process(es), backend gloo") == 1, out[-3000:]
    assert out.count("hybridnb · Sequential") == 1  # only rank 0 draws the live view
    assert checkpoint.load(tmp_path / "last.pt")["position"]["global_step"] == 2  # 128/(32x2)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_example_script_runs_as_two_nodes(tmp_path):
    """Two torchrun agents (--nnodes=2, one process each) on 127.0.0.1: what a 2-machine job
    does, with LOCAL_RANK 0 on both nodes and RANK 0/1."""
    port = free_port()
    outs = finished(*(torchrun("--nnodes=2", "--nproc_per_node=1", f"--node_rank={k}",
                               "--master_addr=127.0.0.1", f"--master_port={port}", *EXAMPLE,
                               "--out", str(tmp_path)) for k in (0, 1)), timeout=110)
    assert "done: strategy ddp, 2 process(es), backend gloo" in outs[0]
    assert "done:" not in outs[1] and "hybridnb · Sequential" not in outs[1]  # rank 1: quiet
    assert checkpoint.load(tmp_path / "last.pt")["position"]["global_step"] == 2  # 128/(32x2)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_example_script_runs_deepspeed_under_torchrun(tmp_path):
    pytest.importorskip("deepspeed", reason="the optional deepspeed extra is not installed")
    [out] = finished(torchrun("--standalone", "--nproc_per_node=2", *EXAMPLE, "--out",
                              str(tmp_path), "--strategy", "deepspeed"), timeout=170)
    assert out.count("done: strategy deepspeed, 2 process(es), backend gloo") == 1, out[-3000:]
    state = checkpoint.load(tmp_path / "last.pt")
    assert state["position"]["global_step"] == 2 and len(state["optimizer"]["ranks"]) == 2
