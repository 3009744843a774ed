"""The submission zip: what the organisers' harness loads, checked the way it loads it."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest
import torch

from data_prep import submission as S

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
    r1 = S.check_submission(path, X, y, challenge=1, batch_size=32)
    assert r1["output_shape"] == (50, 1)
    assert r1["batch_shapes"] == [(18, 1), (32, 1)]
    assert r1["leaked"] == []
    assert r1["nrmse"] == pytest.approx(_nrmse(m1, X, y), rel=1e-4)
    r2 = S.check_submission(path, X, y, challenge=2, batch_size=64)
    assert r2["nrmse"] == pytest.approx(_nrmse(m2, X * 1000.0, y), rel=1e-4)
    assert r1["nrmse"] != pytest.approx(r2["nrmse"], rel=1e-3)


@pytest.mark.slow
def test_a_submission_that_needs_this_project_fails_the_check(built, tmp_path):
    path, *_ = built
    bad = tmp_path / "bad.zip"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(bad, "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            if name == "submission.py":
                data = b"import hybridnb\n" + data
            dst.writestr(name, data)
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
    path = S.save_model(tmp_path / "c1.pt", spec, model)
    spec2, again = S.load_model(path)
    X, y = _data(6)
    assert spec2 == spec
    assert _nrmse(again.eval(), X, y) == pytest.approx(_nrmse(model, X, y), rel=1e-6)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match="c1.pt"):
        S.load_model(path)
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        S.load_model(tmp_path / "missing.pt")
