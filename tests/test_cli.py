"""The command line (issue 12 and issue 15 item 18): real --help per subcommand, errors on
stderr with exit code 2, and ``detect --json`` printing JSON and nothing else on stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybridnb import cli
from hybridnb.env import CACHE_DIR_ENV, DEVICE_ENV
from hybridnb_tools.gpu_sim import fake_gpu

ROOT = Path(__file__).resolve().parents[1]


def hybridnb(*args: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """``python -m hybridnb ARGS`` in a fresh process; no real GPU is probed (CPU forced unless
    the caller sets HYBRIDNB_DEVICE) and the probe cache is the test's own."""
    environ = {k: v for k, v in os.environ.items() if k != fake_gpu.SIM_ENV}
    environ.update({DEVICE_ENV: "cpu", CACHE_DIR_ENV: str(tmp_path)}, **env)
    return subprocess.run([sys.executable, "-m", "hybridnb", *args], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=180)


def test_main_module_is_the_cli():
    from hybridnb.__main__ import main

    assert main is cli.main


def test_top_level_help_lists_the_subcommands_without_importing_torch():
    code = ("import sys, contextlib, io\nfrom hybridnb.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n    rc = main(['--help'])\n"
            "print(rc, 'torch' in sys.modules)\nprint(out.getvalue())")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    first, _, help_text = run.stdout.partition("\n")
    assert first == "0 False", run.stderr
    assert "detect" in help_text and "compare" in help_text
    assert "demo" not in help_text   # moved to python -m hybridnb_tools.demo


def test_detect_help_lists_its_options(tmp_path):
    run = hybridnb("detect", "--help", tmp_path=tmp_path)
    assert run.returncode == 0 and run.stderr == ""
    for option in ("--json", "--timeout", "--refresh"):
        assert option in run.stdout


def test_compare_help_lists_its_options(capsys):
    assert cli.main(["compare", "--help"]) == 0
    out = capsys.readouterr().out
    options = {word.strip("[],") for word in out.split() if word.startswith(("--", "[--"))}
    assert "--variants" in options and "--device" in options
    assert len(options - {"--help"}) >= 4, out


@pytest.mark.parametrize("argv", [[], ["demo"], ["nonsense"], ["detect", "--bogus"],
                                  ["detect", "--timeout", "-1"], ["detect", "--timeout", "x"]])
def test_usage_errors_go_to_stderr_with_exit_code_2(capsys, argv):
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and "error:" in err
    if "--timeout" in argv:
        assert "argument --timeout" in err and "probe_timeout" not in err


def test_detect_json_is_pure_json(tmp_path):
    run = hybridnb("detect", "--json", "--timeout", "5", tmp_path=tmp_path)
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)          # the whole of stdout
    assert data["device"] == "cpu" and data["probe_timeout"] == 5.0


def test_detect_json_with_a_bad_device_variable_keeps_stdout_clean(tmp_path):
    run = hybridnb("detect", "--json", tmp_path=tmp_path, **{DEVICE_ENV: "gpu"})
    assert run.returncode == 2
    assert run.stdout == ""
    assert "HYBRIDNB_DEVICE='gpu'" in run.stderr and "cpu, cuda, cuda:N" in run.stderr
    assert "Traceback" not in run.stderr


def test_a_value_error_from_a_subcommand_is_a_message_not_a_traceback(monkeypatch, capsys):
    def bad(args):
        raise ValueError("variants: 'fp64' is not a precision (use fp32, bf16, fp16)")

    monkeypatch.setattr(cli.compare_cli, "run", bad)
    assert cli.main(["compare", "--model", "eegnex"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("python -m hybridnb compare: error: variants: 'fp64'")


def test_compare_knows_the_registered_model_names():
    from hybridnb.comparison import compare_cli

    assert compare_cli.load_factory("eegnex").model_name == "EEGNeX"
    assert compare_cli.load_factory("shallow").input_shape == (129, 200)


def test_compare_with_an_unknown_model_name_lists_the_known_ones(capsys):
    assert cli.main(["compare", "--model", "eegnet"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "--model 'eegnet'" in err and "eegnex" in err and "shallow" in err


def test_detect_lists_simulated_gpus_and_falls_back_from_a_wrong_one(tmp_path):
    """Two simulated GPUs (hybridnb_tools/gpu_sim: NVML and torch.cuda faked in every process)."""
    sim = {"gpus": 2, "gpu": {"name": "A100"}, "by_index": {"1": {"wrong_at": "matmul"}}}
    run = hybridnb("detect", "--json", "--timeout", "60", "--refresh", tmp_path=tmp_path,
                   **{DEVICE_ENV: "", **fake_gpu.environ(sim, {})})
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert [g["name"] for g in data["gpus"]] == ["A100 (simulated)"] * 2
    assert [g["probe"]["verdict"] for g in data["gpus"]] == ["passed", "wrong result"]
    assert data["device"] == "cuda:0"     # the healthy one; the wrong one is not trusted
