"""Target standardisation: trained on (y - mean) / std, folded back so the model predicts y."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from data_prep import submission
from data_prep.targets import TargetScaling

SMALL = {"n_chans": 8, "n_times": 200, "final_conv_length": "auto", "n_filters_time": 4,
         "n_filters_spat": 4}


def test_fit_apply_invert_round_trip():
    y = np.array([0.5, 0.9, 1.3, np.nan, 2.0])
    ts = TargetScaling.fit(y)
    assert ts.mean == pytest.approx(np.nanmean(y)) and ts.std == pytest.approx(np.nanstd(y))
    z = ts.apply(y[:3])
    np.testing.assert_allclose(ts.invert(z), y[:3])
    with pytest.raises(ValueError, match="std > 0"):
        TargetScaling.fit([1.0, 1.0, 1.0])


@pytest.mark.parametrize("name,kwargs", [("ShallowFBCSPNet", SMALL),
                                         ("EEGNeX", {"n_chans": 8, "n_times": 200})])
def test_fold_into_a_challenge_model_predicts_in_target_units(name, kwargs):
    spec = submission.challenge_spec(name, **kwargs)
    torch.manual_seed(0)
    model = spec.build().eval()
    x = torch.randn(5, 8, 200)
    with torch.no_grad():
        before = model(x)
    ts = TargetScaling(mean=0.9, std=0.4)
    ts.fold_into(model)
    with torch.no_grad():
        after = model(x)
    torch.testing.assert_close(after, before * 0.4 + 0.9, rtol=1e-4, atol=1e-5)
    # the folded weights load into a fresh build of the spec: the submission carries them
    spec.build().load_state_dict(model.state_dict())


def test_fold_into_refuses_a_non_affine_output_and_keeps_the_weights():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 1), torch.nn.Sigmoid())
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="not affine"):
        TargetScaling(0.9, 0.4).fold_into(model, n_chans=4, n_times=4)
    for k, v in model.state_dict().items():
        assert torch.equal(v, weights[k]), k
