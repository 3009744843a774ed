"""The submission zip: what the organisers' harness loads, checked the way it loads it."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest
import torch

from data_prep import submission as S
from hybridnb_tools import model_files as M

# A ShallowFBCSPNet small enough to build and run in milliseconds.
SMALL = {"n_filters_time": 4, "n_filters_spat": 4, "final_conv_length": "auto"}


def _spec(**kw) -> S.ModelSpec:
    return S.challenge_spec("ShallowFBCSPNet", **{**SMALL, **kw})


def _model(spec: S.ModelSpec, seed: int):
    torch.manual_seed(seed)
    return spec.build().eval()


def _data(n: int = 50, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 129, 200)).astype(np.float32), rng.normal(1.0, 0.3, n)


def _nrmse(model, X, y) -> float:
    with torch.inference_mode():
        pred = model(torch.from_numpy(X)).numpy()[:, 0]
    return float(np.sqrt(np.mean((pred - y) ** 2)) / np.std(y))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Challenge 2's model learnt on inputs × 1000 (e.g. millivolts); the harness feeds volts."""
    spec = _spec()
    spec2 = S.challenge_spec("ShallowFBCSPNet", input_scale=1000.0, **SMALL)
    m1, m2 = _model(spec, 1), _model(spec2, 2)
    path = S.build_submission(tmp_path_factory.mktemp("sub") / "submission.zip",
                              (spec, m1), (spec2, m2))
    return path, spec, m1, m2


def test_zip_is_single_level_with_the_three_files_and_the_harness_api(built):
    path, spec, m1, _ = built
    with zipfile.ZipFile(path) as zf:
        assert sorted(zf.namelist()) == sorted(S.SUBMISSION_FILES)
        source = zf.read("submission.py").decode()
        with zf.open("weights_challenge_1.pt") as f:
            state = torch.load(f, weights_only=True)
    assert "class Submission" in source and "def __init__(self, SFREQ, DEVICE)" in source
    assert "def get_model_challenge_1" in source and "def get_model_challenge_2" in source
    assert "hybridnb" not in source.split('"""', 2)[2] and "data_prep" not in source.split(
        '"""', 2)[2], "submission.py must not import this project"
    fresh = spec.build()
    fresh.load_state_dict(state)
    for a, b in zip(fresh.state_dict().values(), m1.state_dict().values(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_fresh_process_returns_B_by_1_and_scores_each_challenge_with_its_own_weights(built):
    path, _, m1, m2 = built
    X, y = _data(50)
    both = S.check_submissions(path, {1: (X, y), 2: (X, y)}, batch_size=32)  # side by side
    r1, r2 = both[1], both[2]
    assert r1["output_shape"] == r2["output_shape"] == (50, 1)
    assert r1["batch_shapes"] == r2["batch_shapes"] == [(18, 1), (32, 1)]
    assert r1["leaked"] == r2["leaked"] == []
    assert r1["nrmse"] == pytest.approx(_nrmse(m1, X, y), rel=1e-4)
    assert r2["nrmse"] == pytest.approx(_nrmse(m2, X * 1000.0, y), rel=1e-4)
    assert r1["nrmse"] != pytest.approx(r2["nrmse"], rel=1e-3)


@pytest.mark.slow
def test_a_submission_that_needs_this_project_fails_the_check(built, tmp_path):
    path, *_ = built
    bad = _with_prefix(path, tmp_path / "bad.zip", b"import hybridnb\n")
    X, y = _data(4)
    with pytest.raises(S.SubmissionError, match="hybridnb is not available"):
        S.check_submission(bad, X, y)


@pytest.mark.slow
def test_a_model_with_the_wrong_output_shape_is_refused(tmp_path):
    spec = _spec(n_outputs=2)
    model = _model(spec, 0)
    path = S.build_submission(tmp_path / "two.zip", (spec, model), (spec, model))
    X, y = _data(8)
    with pytest.raises(S.SubmissionError, match=r"returned shape \(8, 2\)"):
        S.check_submission(path, X, y)


def test_a_zip_without_a_weight_file_is_named(built, tmp_path):
    path, *_ = built
    partial = tmp_path / "partial.zip"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(partial, "w") as dst:
        for name in src.namelist():
            if name != "weights_challenge_2.pt":
                dst.writestr(name, src.read(name))
    X, y = _data(4)
    with pytest.raises(S.SubmissionError, match="weights_challenge_2.pt"):
        S.check_submission(partial, X, y)


def test_weights_that_do_not_fit_the_spec_are_refused_before_writing(tmp_path):
    small, wide = _spec(), _spec(n_filters_spat=6)
    with pytest.raises(ValueError, match="challenge 2"):
        S.build_submission(tmp_path / "x.zip", (small, _model(small, 0)), (small, _model(wide, 0)))
    assert not (tmp_path / "x.zip").exists()


def test_bad_inputs_are_named(built):
    path, *_ = built
    X, y = _data(4)
    with pytest.raises(ValueError, match=r"\(N, 129, 200\).*\(4, 129, 100\)"):
        S.check_submission(path, X[:, :, :100], y)
    with pytest.raises(ValueError, match="4 windows but y has 3"):
        S.check_submission(path, X, y[:3])
    with pytest.raises(ValueError, match="challenge must be 1 or 2"):
        S.check_submission(path, X, y, challenge=3)
    with pytest.raises(ValueError, match="no model named 'NotAModel'"):
        S.ModelSpec("NotAModel").build()


def test_saved_model_round_trips_and_a_corrupt_file_is_named(tmp_path):
    spec = _spec()
    model = _model(spec, 3)
    spec = S.challenge_spec("ShallowFBCSPNet", input_scale=1e6, **SMALL)
    path = M.save_model(tmp_path / "c1.pt", spec, model)
    spec2, again = M.load_model(path)
    X, y = _data(6)
    assert spec2 == spec
    assert _nrmse(again.eval(), X, y) == pytest.approx(_nrmse(model, X, y), rel=1e-6)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match="c1.pt"):
        M.load_model(path)
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        M.load_model(tmp_path / "missing.pt")


def test_a_saved_challenge_model_is_a_hybridnb_model_file(tmp_path):
    import hybridnb as hn
    from hybridnb.saving import ModelFileError, read_metadata, save_model

    spec = S.challenge_spec("ShallowFBCSPNet", input_scale=1e6, **SMALL)
    model = _model(spec, 3)
    path = M.save_model(tmp_path / "c1.pt", spec, model)
    meta = read_metadata(path)
    assert meta["model_class"]["qualname"] == type(model).__qualname__
    assert meta["input_shape"] == [spec.kwargs["n_chans"], spec.kwargs["n_times"]]
    assert meta["extra"]["spec"]["name"] == "ShallowFBCSPNet"
    again = hn.load(path, spec.build())  # the same file, through hybridnb's own loader
    X, y = _data(6)
    assert _nrmse(again, X, y) == pytest.approx(_nrmse(model, X, y), rel=1e-6)
    plain = save_model(model, tmp_path / "plain.pt")  # weights without a spec: said so
    with pytest.raises(ModelFileError, match="no model spec"):
        M.load_model(plain)


# --------------------------------------------------------------------------------------------
# The template and the check script are real modules: imported and run here as code
# --------------------------------------------------------------------------------------------

def test_the_template_module_is_the_harness_api(tmp_path, monkeypatch):
    from data_prep import submission_template as T

    spec = _spec()
    model = _model(spec, 4)
    torch.save(model.state_dict(), tmp_path / "weights_challenge_1.pt")
    monkeypatch.chdir(tmp_path)  # the weights are found in the working folder too
    monkeypatch.setattr(T, "MODELS", {1: (spec.name, dict(spec.kwargs),
                                          "weights_challenge_1.pt", 1000.0, 1)})
    loaded = T.Submission(100, torch.device("cpu")).get_model_challenge_1()
    X, y = _data(5)
    assert not loaded.training
    assert _nrmse(loaded, X, y) == pytest.approx(_nrmse(model, X * 1000.0, y), rel=1e-6)
    with pytest.raises(KeyError, match="no model for challenge 2"):
        T.Submission(100, "cpu").get_model_challenge_2()
    with pytest.raises(ValueError, match="trained at 100 Hz, not SFREQ=250"):
        T.Submission(250, "cpu")


def test_submission_py_is_the_template_with_two_lines_filled_in():
    spec1, spec2 = _spec(), S.challenge_spec("EEGNeX", input_scale=1e6)
    source = S.submission_source(spec1, spec2, sfreq=100)
    template = S.TEMPLATE.read_text().splitlines()
    changed = [ln for ln in source.splitlines() if ln not in template]
    assert changed == ["MODELS = {", "    1: ('ShallowFBCSPNet', " + repr(dict(spec1.kwargs))
                       + ", 'weights_challenge_1.pt', 1.0, 1),",
                       "    2: ('EEGNeX', " + repr(dict(spec2.kwargs))
                       + ", 'weights_challenge_2.pt', 1000000.0, 1),", "}"]
    namespace: dict = {"__file__": "submission.py"}
    exec(compile(source, "submission.py", "exec"), namespace)
    assert namespace["TRAINED_SFREQ"] == 100
    assert namespace["MODELS"][2] == ("EEGNeX", dict(spec2.kwargs), "weights_challenge_2.pt", 1e6, 1)


def test_a_template_without_its_fill_in_line_is_named():
    with pytest.raises(RuntimeError, match=r"submission_template.py must hold the line "
                                           r"'MODELS = \{\}' exactly once \(found 0\)"):
        S._fill("TRAINED_SFREQ = 100\n", {"MODELS = {}": "MODELS = {1: 2}"})


def test_the_check_script_blocks_this_project_and_nothing_else():
    from data_prep import submission_check as C

    hook = C.BlockProject()
    for name in ("hybridnb", "hybridnb.train", "data_prep.scoring"):
        with pytest.raises(ImportError, match=f"{name} is not available"):
            hook.find_spec(name)
    assert hook.find_spec("numpy") is None and hook.find_spec("hybridnb_x") is None


@pytest.mark.slow
def test_non_finite_predictions_are_refused(tmp_path):
    spec = _spec()
    model = _model(spec, 0)
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
    path = S.build_submission(tmp_path / "nan.zip", (spec, model), (spec, model))
    X, y = _data(6)
    with pytest.raises(S.SubmissionError, match="returned 6 non-finite predictions"):
        S.check_submission(path, X, y)


@pytest.mark.slow
def test_an_ensemble_predicts_the_mean_of_its_members_in_the_fresh_process(tmp_path):
    """Challenge 2 as the mean of 3 independently trained models: the zip carries each
    member's weights and rebuilds the averaging module with torch + braindecode only."""
    spec = _spec()
    members = [_model(spec, seed) for seed in (3, 4, 5)]
    spec_k, ens = S.average(spec, members)
    assert spec_k.members == 3 and S.ModelSpec.from_dict(spec_k.to_dict()) == spec_k
    X, y = _data(40, seed=1)
    with torch.inference_mode():
        mean = torch.stack([m(torch.from_numpy(X)) for m in members]).mean(0).numpy()[:, 0]
    path = S.build_submission(tmp_path / "submission.zip", (spec, _model(spec, 1)),
                              (spec_k, ens))
    r = S.check_submission(path, X, y, challenge=2, batch_size=16)
    assert r["output_shape"] == (40, 1) and r["leaked"] == []
    assert r["rmse"] == pytest.approx(float(np.sqrt(np.mean((mean - y) ** 2))), rel=1e-4)
    # 3 members' weights under a spec of 2: named here, not on the organisers' machine
    with pytest.raises(ValueError, match=r"(?s)members=2.*members\.2\."):
        S.build_submission(tmp_path / "bad.zip", (spec, members[0]),
                           (spec_k.ensemble(2), ens))


def test_average_refuses_models_of_another_architecture_and_an_empty_list():
    spec = _spec()
    with pytest.raises(ValueError, match="not a ShallowFBCSPNet"):
        S.average(spec, [_model(spec, 0), torch.nn.Linear(2, 1)])
    with pytest.raises(ValueError, match="at least one"):
        S.average(spec, [])
    with pytest.raises(ValueError, match="whole number"):
        S.ModelSpec("ShallowFBCSPNet", members=0)


def test_importing_data_prep_never_imports_hybridnb():
    import subprocess
    import sys

    code = ("import pkgutil, importlib, sys, data_prep\n"
            "for m in pkgutil.walk_packages(data_prep.__path__, 'data_prep.'):\n"
            "    importlib.import_module(m.name)\n"
            "print(sorted(n for n in sys.modules if n.split('.')[0] == 'hybridnb'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()[-1]
    assert out == "[]"


@pytest.mark.slow
def test_a_spec_names_a_layer_type_and_the_fresh_process_builds_it(tmp_path):
    """``conv_nonlin="torch.nn.ELU"``: the spec stays plain data, the built model (here and in
    the zip) has the ELU, and the fresh process predicts what this one does."""
    spec = _spec(conv_nonlin="torch.nn.ELU", activation_pool_nonlin="torch.nn.Identity",
                 pool_time_length=10, pool_time_stride=10)
    assert S.ModelSpec.from_dict(spec.to_dict()) == spec
    model = _model(spec, 7)
    kinds = {type(m).__name__ for m in model.modules()}
    assert "ELU" in kinds and "SafeLog" not in kinds and "Square" not in kinds
    X, y = _data(30, seed=2)
    path = S.build_submission(tmp_path / "submission.zip", (spec, model), (_spec(), _model(_spec(), 1)))
    r = S.check_submission(path, X, y, challenge=1, batch_size=16)
    assert r["nrmse"] == pytest.approx(_nrmse(model, X, y), rel=1e-4)


def test_a_layer_name_outside_torch_nn_is_named():
    with pytest.raises(ValueError, match="conv_nonlin='torch.nn.NoSuchLayer'"):
        _spec(conv_nonlin="torch.nn.NoSuchLayer").build()


def test_a_model_that_never_answers_is_stopped_at_the_timeout_and_named(built, tmp_path):
    path, *_ = built
    slow = _with_prefix(path, tmp_path / "slow.zip", b"import time\ntime.sleep(120)\n")
    X, y = _data(4)
    with pytest.raises(S.SubmissionError, match="challenge 2's model did not finish within 2 s"
                       ) as err:
        S.check_submissions(slow, {2: (X, y)}, timeout=2)
    assert str(slow) in str(err.value)  # which zip, as every other SubmissionError says


def _with_prefix(path, out, code: bytes):
    """A copy of the zip whose submission.py starts with ``code``."""
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            dst.writestr(name, code + data if name == "submission.py" else data)
    return out


def test_a_check_that_ended_by_the_shared_deadline_is_read_not_timed_out(tmp_path):
    """Side-by-side checks share one deadline: challenge 2's check, finished while challenge 1's
    was read, is read even when no time is left (communicate(timeout=0) would raise)."""
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-c", "print('done')"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.wait()
    done, pred = S._finish_check(proc, tmp_path, time.monotonic() - 1.0, 600.0,
                                 tmp_path / "submission.zip")
    assert done.returncode == 0 and "done" in done.stdout and pred is None
