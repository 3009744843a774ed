"""compare(): the table people use to pick a precision / compile mode must be complete and honest.

Everything runs on the CPU with a tiny model. Variants that cannot run here, compile failures,
out-of-memory, aborts and hangs are injected, and the tests check what the table kept. Each
variant runs in its own process by default, so faults are injected through the model (which
travels there) rather than by patching this process.
"""

from __future__ import annotations

import importlib
import math
import os
import subprocess
import sys
import time
import warnings

import pandas as pd
import pytest
import torch
from torch import nn

from hybridnb.comparison import compare_view
from hybridnb.comparison.compare import (
    COLUMNS,
    compare,
    compare_figure,
    compare_table,
    first_step_diff,
)
from hybridnb.comparison.variants import DEFAULT_VARIANTS, parse_variant

cmp = importlib.import_module("hybridnb.comparison.compare")  # the module; hn.compare is the function

# in this process: a variant process costs seconds to start; the tests of isolation ask for it
FAST = dict(steps=2, warmup=1, repeats=2, device="cpu", progress=False, isolate=False)
ISOLATED = {**FAST, "isolate": True}


def tiny() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(4 * 16, 8), nn.ReLU(), nn.Linear(8, 1))


def batch(n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, 16, generator=g)
    return x, 3 * x.mean((1, 2))


def row(df: pd.DataFrame, variant: str, batch_size: int | None = None) -> dict:
    sel = df[df["variant"] == variant]
    if batch_size is not None:
        sel = sel[sel["batch_size"] == batch_size]
    assert len(sel) == 1, f"{variant}@{batch_size}: {len(sel)} rows"
    return sel.iloc[0].to_dict()


def test_table_has_every_variant_with_baseline_speedup_loss_agreement_and_skip_reason():
    df = compare(tiny, batch(), ("fp32", "bf16", "fp16"), **FAST)
    assert isinstance(df, pd.DataFrame)
    assert list(df.columns) == COLUMNS
    assert list(df["variant"]) == ["fp32", "bf16", "fp16"]  # nothing dropped

    fp32, bf16, fp16 = (row(df, v) for v in ("fp32", "bf16", "fp16"))
    assert fp32["status"] == "ok" and fp32["speedup"] == 1.0 and fp32["loss_rel_diff"] == 0.0
    assert fp32["samples_per_s_min"] <= fp32["samples_per_s"] <= fp32["samples_per_s_max"]
    assert fp32["step_ms"] > 0
    # weights + AdamW state (3 copies of 529 float32 parameters) + the batch, at least
    assert fp32["peak_mem_mb"] * 2**20 >= 3 * 529 * 4 + 8 * 64 * 4
    assert math.isnan(fp32["compile_s"])  # eager: no compile time to report

    assert bf16["status"] == "ok" and bf16["speedup"] > 0
    # bf16 really ran in bf16 (a different loss), and it agrees with fp32 loosely
    assert 0 < bf16["loss_rel_diff"] < 0.1 and bf16["loss_ok"] is True

    assert fp16["status"] == "skipped"
    assert "cpu" in fp16["note"] and "bf16" in fp16["note"]
    assert math.isnan(fp16["samples_per_s"]) and math.isnan(fp16["speedup"])


def test_same_variant_twice_is_an_aa_check_with_identical_loss():
    def with_dropout() -> nn.Module:  # each run must get its own random stream for its masks
        return nn.Sequential(nn.Flatten(), nn.Linear(4 * 16, 8), nn.Dropout(0.5), nn.Linear(8, 1))

    df = compare(with_dropout, batch(), ("fp32", "fp32"), **FAST)
    assert list(df["variant"]) == ["fp32", "fp32 #2"]
    again = row(df, "fp32 #2")
    assert again["status"] == "ok"
    assert again["loss_rel_diff"] == 0.0  # same seed, same steps, deterministic CPU
    assert again["final_loss"] == row(df, "fp32")["final_loss"]


def test_fp32_baseline_is_added_when_not_asked():
    df = compare(tiny, batch(), ("bf16",), **FAST)
    assert list(df["variant"]) == ["fp32", "bf16"]
    assert not math.isnan(row(df, "bf16")["speedup"])


def test_variants_take_turns_in_every_round(tmp_path):
    log = tmp_path / "calls"

    def tagged() -> nn.Module:  # tags forward calls 0 (fp32) / 1 (bf16) in one shared file
        model = tiny()

        def hook(*_):
            with open(log, "a") as f:
                f.write(f"{int(torch.is_autocast_enabled('cpu'))}\n")
        model.register_forward_hook(hook)
        return model

    df = compare(tagged, batch(), ("fp32", "bf16"), steps=2, warmup=2, repeats=3,
                 device="cpu", progress=False)
    calls = [int(t) for t in log.read_text().split()]
    warm = [0, 0, 0, 1, 1, 1]  # each: 2 warm-up steps + 1 memory step
    rounds = [0, 0, 1, 1] * 3  # A A B B, A A B B, ... (2 steps per window)
    assert calls == warm + rounds
    assert df.attrs["order"] == [(v, 8, r) for r in range(3) for v in ("fp32", "bf16")]


def test_compile_without_a_compiler_is_skipped_with_the_reason(monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.delenv("CXX", raising=False)

    def no_compile(*a, **k):
        raise AssertionError("torch.compile must not be attempted without a compiler")

    monkeypatch.setattr(torch, "compile", no_compile)
    df = compare(tiny, batch(), ("fp32", "fp32+compile", "bf16+compile:max-autotune"), **FAST)
    skipped = row(df, "fp32+compile")
    assert skipped["status"] == "skipped" and "C++ compiler" in skipped["note"]
    assert row(df, "bf16+compile:max-autotune")["status"] == "skipped"
    assert row(df, "fp32")["status"] == "ok"


@pytest.mark.slow
def test_compile_failure_is_a_row_and_the_other_variants_keep_their_numbers(monkeypatch):
    def broken_compile(model, mode=None):
        def run(x):
            raise RuntimeError("backend='inductor' raised:\nCalledProcessError: Command "
                               "'['g++', 'kernel.cpp']' returned non-zero exit status 1.")
        return run

    monkeypatch.setattr(torch, "compile", broken_compile)
    df = compare(tiny, batch(), ("fp32", "fp32+compile", "bf16"), **FAST)
    failed = row(df, "fp32+compile")
    assert failed["status"] == "failed"
    assert "warm-up" in failed["note"] and "inductor" in failed["note"]
    assert math.isnan(failed["samples_per_s"])
    for v in ("fp32", "bf16"):
        assert row(df, v)["status"] == "ok" and row(df, v)["samples_per_s"] > 0


class OomAbove(nn.Module):
    """Raises torch's real CUDA OOM error for batches larger than ``limit``."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.net, self.limit = tiny(), limit

    def forward(self, x):
        if x.shape[0] > self.limit:
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                "15.77 GiB of which 1.05 GiB is free.")
        return self.net(x)


def test_oom_at_one_batch_size_is_reported_and_the_other_size_is_kept():
    df = compare(lambda: OomAbove(8), batch(8), ("fp32", "bf16"), batch_sizes=(8, 16), **FAST)
    assert len(df) == 4
    for v in ("fp32", "bf16"):
        big = row(df, v, 16)
        assert big["status"] == "oom" and "out of memory" in big["note"]
        assert "batch 16" in big["note"] and math.isnan(big["samples_per_s"])
        small = row(df, v, 8)
        assert small["status"] == "ok" and small["samples_per_s"] > 0
    assert row(df, "fp32", 8)["speedup"] == 1.0


def test_oom_in_a_timed_window_keeps_the_rest():
    def second_model_ooms_later() -> nn.Module:
        model = tiny()
        calls = []

        def hook(*_):  # the bf16 variant: fine for warm-up, out of memory when timed
            if torch.is_autocast_enabled("cpu"):
                calls.append(1)
                if len(calls) > 3:
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20 MiB")
        model.register_forward_pre_hook(hook)
        return model

    df = compare(second_model_ooms_later, batch(), ("fp32", "bf16", "fp32"), **FAST)
    oom = row(df, "bf16")
    assert oom["status"] == "oom" and "timed window" in oom["note"]
    assert row(df, "fp32")["status"] == "ok" and row(df, "fp32 #2")["status"] == "ok"
    assert row(df, "fp32 #2")["speedup"] > 0


def test_non_finite_loss_under_bf16_is_flagged():
    def nan_in_bf16() -> nn.Module:
        model = tiny()
        model.register_forward_hook(
            lambda m, i, out: out * float("nan") if out.dtype == torch.bfloat16 else out)
        return model

    df = compare(nan_in_bf16, batch(), ("fp32", "bf16"), **FAST)
    bad = row(df, "bf16")
    assert bad["loss_ok"] is False and "non-finite" in bad["note"]
    assert row(df, "fp32")["loss_ok"] is True


def test_a_broken_model_raises_instead_of_an_empty_table():
    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(32, 8)

        def forward(self, x):
            raise ValueError("mat1 and mat2 shapes cannot be multiplied (8x64 and 32x8)")

    with pytest.raises(RuntimeError, match="fp32 eager baseline.*shapes cannot be multiplied"):
        compare(Broken, batch(), ("fp32", "bf16"), **FAST)


@pytest.mark.parametrize("kwargs, words", [
    (dict(variants=("fp8",)), "'fp8'"),
    (dict(variants=("bf16+jit",)), "'bf16+jit'"),
    (dict(variants=("bf16+compile:fastest",)), "'fastest'"),
    (dict(steps=0), "steps=0"),
    (dict(batch_sizes=(0,)), "batch_sizes"),
    (dict(loss="rmsle"), "rmsle"),
])
def test_bad_arguments_name_the_argument_and_value(kwargs, words):
    args = {**FAST, **kwargs}
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace("+", r"\+")):
        compare(tiny, batch(), **args)


def test_dataset_input_repeats_samples_up_to_each_batch_size():
    x, y = batch(5)
    ds = torch.utils.data.TensorDataset(x, y)
    df = compare(tiny, ds, ("fp32",), batch_sizes=(4, 12), **FAST)
    assert list(df["batch_size"]) == [4, 12]
    assert (df["status"] == "ok").all() and (df["speedup"] == 1.0).all()


def test_notebook_display_shows_table_and_chart(monkeypatch):
    df = compare(tiny, batch(), ("fp32", "bf16", "fp16"), **FAST)
    shown = []
    import IPython.display
    monkeypatch.setattr(IPython.display, "display", lambda obj: shown.append(obj))

    monkeypatch.setattr(compare_view, "frontend", lambda: "jupyter")
    df._ipython_display_()
    table, fig = shown
    assert list(table["variant"]) == ["fp32", "bf16", "fp16"]
    assert list(fig.data[0].x) == ["fp32", "bf16", "fp16"]
    assert fig.data[0].text[0] == "1.00×" and fig.data[0].text[2] == "skipped"
    image = fig._draw().axes[0]  # its saved-notebook image, drawn from the table
    assert [t.get_text() for t in image.get_xticklabels()] == ["fp32", "bf16", "fp16"]
    assert [t.get_text() for t in image.texts][2] == "skipped"

    shown.clear()
    monkeypatch.setattr(compare_view, "frontend", lambda: "ci")
    df._ipython_display_()
    assert len(shown) == 1  # headless notebooks get the table, not a plotly payload


def test_text_table_lists_skip_reasons_as_notes():
    df = compare(tiny, batch(), ("fp32", "fp16"), **FAST)
    text = compare_table(df)
    assert "fp32" in text and "skipped" in text and "[2] fp16:" in text
    assert "1.00×" in text
    fig = compare_figure(df)
    assert fig.data[0].y[1] == 0  # a skipped variant has no bar, only its status


@pytest.mark.slow
def test_cli_prints_the_table(capsys):
    from hybridnb.__main__ import main

    code = main(["compare", "--model", "hybridnb_tools.models:shallow", "--batch", "4", "--steps", "1", "--warmup", "1",
                 "--repeats", "1", "--variants", "fp32,fp16", "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == 0
    assert "ShallowFBCSPNet on cpu" in out
    lines = [ln for ln in out.splitlines() if ln.strip().startswith(("fp32", "fp16"))]
    assert lines[0].split()[:2] == ["fp32", "ok"] and lines[1].split()[:2] == ["fp16", "skipped"]


def test_hn_compare_is_callable_whatever_was_imported_first():
    import hybridnb as hn  # this file imported hybridnb.compare (the module) before

    df = hn.compare(tiny, batch(), ("fp32",), **FAST)
    assert list(df["variant"]) == ["fp32"] and df["speedup"].iloc[0] == 1.0


# ------------------------------------------------------------------ each variant in its own process

def aborts_under_bf16() -> nn.Module:
    """A model whose process aborts (SIGABRT, as a C++ thread's std::terminate does) under bf16."""
    model = tiny()

    def hook(*_):
        if torch.is_autocast_enabled("cpu"):
            sys.stderr.write("terminate called after throwing an instance of 'c10::Error'\n")
            sys.stderr.flush()
            os.abort()
    model.register_forward_pre_hook(hook)
    return model


def test_a_variant_whose_process_aborts_is_a_row_and_the_caller_lives():
    df = compare(aborts_under_bf16, batch(), ("fp32", "bf16", "fp32"), **ISOLATED)
    crashed = row(df, "bf16")
    assert crashed["status"] == "crashed" and math.isnan(crashed["samples_per_s"])
    assert "SIGABRT" in crashed["note"] and "warm-up" in crashed["note"]
    assert "terminate called" in crashed["note"]  # the last line it wrote, as a clue
    for v in ("fp32", "fp32 #2"):  # the others kept their numbers
        assert row(df, v)["status"] == "ok" and row(df, v)["samples_per_s"] > 0
    assert row(df, "fp32 #2")["loss_rel_diff"] == 0.0
    assert df.attrs["isolated"] is True
    assert "crashed" in compare_table(df)


def test_a_variant_that_hangs_is_killed_after_the_timeout_with_nothing_left_behind():
    def hangs_when_timed() -> nn.Module:
        model = tiny()
        calls = []

        def hook(*_):
            if torch.is_autocast_enabled("cpu"):
                calls.append(1)
                if len(calls) > 2:  # warm-up and memory step pass; the first window hangs
                    time.sleep(3600)
        model.register_forward_pre_hook(hook)
        return model

    t0 = time.perf_counter()
    df = compare(hangs_when_timed, batch(), ("fp32", "bf16"), **ISOLATED, timeout=20)
    assert time.perf_counter() - t0 < 20 + 40  # start-up of two interpreters + the timeout
    hung = row(df, "bf16")
    assert hung["status"] == "timeout" and "20 s" in hung["note"]
    assert "timed window 1" in hung["note"]
    assert row(df, "fp32")["status"] == "ok"
    leftovers = subprocess.run(["pgrep", "-f", "hybridnb.comparison.worker", "-P", str(os.getpid())],
                               capture_output=True, text=True).stdout.split()
    assert leftovers == []


def test_the_new_variants_are_listed_and_skipped_with_reasons_where_they_change_nothing():
    assert {"bf16+channels_last", "bf16+channels_last+rewrite",
            "bf16+channels_last+rewrite+compile"} <= set(DEFAULT_VARIANTS)
    v = parse_variant("bf16+compile:max-autotune+rewrite+channels_last")
    assert (v.precision, v.compile, v.rewrite, v.channels_last) == (
        "bf16", "max-autotune", True, True)
    df = compare(tiny, batch(), ("fp32", "bf16+channels_last", "bf16+channels_last+rewrite"),
                 **FAST)
    assert list(df["variant"]) == ["fp32", "bf16+channels_last", "bf16+channels_last+rewrite"]
    assert row(df, "bf16+channels_last")["status"] == "skipped"
    assert "no 2-D convolution" in row(df, "bf16+channels_last")["note"]
    assert "depthwise" in row(df, "bf16+channels_last+rewrite")["note"]


class HeightSpanningDepthwise(nn.Module):
    """(B, C, T) windows -> a depthwise conv whose kernel spans all C rows (the rewrite's rule)."""

    def __init__(self, chans: int = 4, times: int = 16) -> None:
        super().__init__()
        self.first = nn.Conv2d(1, 2, (1, 3), padding=(0, 1))
        self.spatial = nn.Conv2d(2, 4, (chans, 1), groups=2)
        self.head = nn.Linear(4 * times, 1)

    def forward(self, x):
        return self.head(self.spatial(self.first(x.unsqueeze(1))).flatten(1))


def test_layout_and_rewrite_variants_run_on_a_model_they_apply_to():
    df = compare(HeightSpanningDepthwise, batch(), ("fp32", "fp32+channels_last",
                                                     "fp32+rewrite"), **FAST)
    for v in ("fp32+channels_last", "fp32+rewrite"):
        r = row(df, v)
        assert r["status"] == "ok" and r["samples_per_s"] > 0, r["note"]
        assert r["loss_rel_diff"] < 1e-4 and r["loss_ok"] is True  # exact changes


class TemporalChain(nn.Module):
    """(B, C, T) windows -> conv (1, 8) -> BatchNorm -> conv (1, 8): the chain rewrite's rule."""

    def __init__(self, times: int = 16) -> None:
        super().__init__()
        self.first = nn.Conv2d(1, 8, (1, 8), padding="same", bias=False)
        self.norm = nn.BatchNorm2d(8)
        self.second = nn.Conv2d(8, 16, (1, 8), padding="same", bias=False)
        self.head = nn.Linear(16 * 4 * times, 1)

    def forward(self, x):
        return self.head(self.second(self.norm(self.first(x.unsqueeze(1)))).flatten(1))


def test_the_speedups_variant_applies_the_trainers_own_decision_and_names_it():
    v = parse_variant("fp32+speedups+compile")
    assert (v.speedups, v.compile, v.is_baseline) == (True, "default", False)
    with pytest.raises(ValueError, match="'speedups' decides the layout"):
        parse_variant("fp32+speedups+rewrite")
    df = compare(TemporalChain, batch(), ("fp32", "fp32+speedups"), **FAST)
    r = row(df, "fp32+speedups")
    assert r["status"] == "ok" and r["samples_per_s"] > 0, r["note"]
    assert "first>norm>second" in r["note"]  # the chain it fused, by module name
    assert r["loss_rel_diff"] < 1e-4 and r["loss_ok"] is True  # an exact rewrite
    nothing = compare(tiny, batch(), ("fp32", "fp32+speedups"), **FAST)
    assert row(nothing, "fp32+speedups")["status"] == "skipped"
    assert "changes nothing" in row(nothing, "fp32+speedups")["note"]


class DropsUnderChannelsLast(HeightSpanningDepthwise):
    """The depthwise model with dropout after its convolutions."""

    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.head(self.drop(self.spatial(self.first(x.unsqueeze(1)))).flatten(1))


def test_dropout_under_channels_last_is_not_called_a_loss_disagreement():
    df = compare(DropsUnderChannelsLast, batch(), ("fp32", "fp32+channels_last", "fp32+rewrite"),
                 **FAST, loss_tol=1e-9)
    nhwc = row(df, "fp32+channels_last")
    assert nhwc["status"] == "ok" and nhwc["loss_ok"] is None
    assert math.isnan(nhwc["loss_rel_diff"])  # no number that reads as a difference
    assert "dropout" in nhwc["note"] and "first_step_diff" in nhwc["note"]
    # the same seed and layout draw the same masks: an exact rewrite is still compared
    assert row(df, "fp32+rewrite")["loss_rel_diff"] < 1e-4


def test_first_step_diff_calls_exact_changes_exact_and_bf16_not():
    """The first step's outputs and gradients: channels_last (other dropout masks in training)
    and the rewrite are exact; bf16 autocast differs beyond rounding; compile is listed."""
    with warnings.catch_warnings(record=True) as caught:  # a notebook shows each as noise
        warnings.simplefilter("always")
        df = first_step_diff(DropsUnderChannelsLast, batch(),
                             ["fp32+channels_last", "fp32+rewrite", "bf16", "fp32+compile"])
    assert not [w for w in caught if "TF32" in str(w.message)]
    by = {r["variant"]: r for r in df.to_dict("records")}
    for exact in ("fp32+channels_last", "fp32+rewrite"):
        assert by[exact]["exact"] is True
        assert by[exact]["out_rel_diff"] <= 1e-4 and by[exact]["grad_rel_diff"] <= 1e-4
    assert by["bf16"]["exact"] is False and by["bf16"]["grad_rel_diff"] > 1e-4
    assert by["fp32+compile"]["exact"] is None and "not run" in by["fp32+compile"]["note"]


class _SmallOutput(nn.Module):
    """A freshly initialised head whose outputs and gradients are far below 1."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv1d(4, 16, 5)
        self.head = nn.Linear(64, 1)
        with torch.no_grad():
            self.head.weight.mul_(1e-4)
            self.head.bias.zero_()

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).mean(-1).repeat(1, 4))


def test_first_step_diff_sees_bf16_on_a_model_with_small_outputs():
    """bf16's rounding is relative: a model whose outputs and gradients are tiny must not be
    called exact under it (no absolute tolerance hides the difference)."""
    x = torch.randn(8, 4, 64, generator=torch.Generator().manual_seed(0))
    by = {r["variant"]: r for r in first_step_diff(_SmallOutput, (x, torch.zeros(8)),
                                                   ["bf16"]).to_dict("records")}
    assert by["bf16"]["exact"] is False and by["bf16"]["out_rel_diff"] > 1e-4


def test_in_process_runs_give_the_same_table():
    df = compare(tiny, batch(), ("fp32", "bf16", "fp16"), **FAST)
    assert list(df["variant"]) == ["fp32", "bf16", "fp16"] and df.attrs["isolated"] is False
    assert list(df["status"]) == ["ok", "ok", "skipped"]
    assert row(df, "bf16")["final_loss"] == compare(
        tiny, batch(), ("bf16",), **ISOLATED)["final_loss"].iloc[1]  # same numbers either way


def test_an_unpicklable_model_function_runs_here_and_says_so(capsys):
    import threading

    lock = threading.Lock()  # cannot be pickled: the function cannot travel

    def holds_a_lock() -> nn.Module:
        with lock:
            return tiny()

    df = compare(holds_a_lock, batch(), ("fp32",), steps=1, warmup=1, repeats=1, device="cpu")
    assert row(df, "fp32")["status"] == "ok" and df.attrs["isolated"] is False
    assert "run in this process" in capsys.readouterr().out
    assert any("run in this process" in n for n in df.attrs["notes"])


def test_cpu_bf16_runs_with_onednn_off():
    seen = []

    def records_onednn() -> nn.Module:
        model = tiny()
        model.register_forward_pre_hook(
            lambda *_: seen.append(torch.backends.mkldnn.enabled) if torch.is_autocast_enabled(
                "cpu") else None)
        return model

    df = compare(records_onednn, batch(), ("fp32", "bf16"), **FAST)
    assert seen and not any(seen) and torch.backends.mkldnn.enabled  # scoped, then restored
    assert any("oneDNN off" in n for n in df.attrs["notes"])


def test_the_command_line_module_is_light_and_names_bad_model_specs():
    code = ("import sys, hybridnb.comparison.compare_cli as c, argparse; "
            "assert 'torch' not in sys.modules, 'compare_cli imported torch'; "
            "p = argparse.ArgumentParser(); c.add_arguments(p); print(p.format_help())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    for option in ("--model", "--input-shape", "--variants", "--timeout", "--batch"):
        assert option in out.stdout
    from hybridnb.comparison.compare_cli import load_factory

    assert load_factory("eegnex").input_shape == (129, 200)  # a registered short name
    for spec, words in (("no_such_model", "package.module:factory"),
                        ("no_such_mod:f", "cannot import"),
                        ("hybridnb_tools.models:nope", "no function or class 'nope'")):
        with pytest.raises(ValueError, match=words):
            load_factory(spec)
    assert load_factory("hybridnb_tools.models:eegnex").input_shape == (129, 200)


def test_a_window_timed_at_zero_has_no_rate_not_an_infinite_one(monkeypatch):
    session = importlib.import_module("hybridnb.comparison.session")

    class StoppedClock(session.Stopwatch):  # a coarse clock that did not advance
        def stop(self) -> float:
            super().stop()
            return 0.0

    monkeypatch.setattr(session, "Stopwatch", StoppedClock)
    df = compare(tiny, batch(), ("fp32", "fp32"), **FAST)
    for name in ("fp32", "fp32 #2"):
        r = row(df, name)
        assert r["status"] == "ok" and not any(
            math.isinf(r[c]) for c in ("samples_per_s", "samples_per_s_max", "speedup"))
        assert math.isnan(r["samples_per_s"]) and math.isnan(r["speedup"])
