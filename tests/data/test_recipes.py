"""The challenges' deep recipes: one definition that the notebooks, the bench and the zip share."""

from __future__ import annotations

import pytest
import torch

from data_prep import recipes, submission


@pytest.mark.parametrize("challenge", [1, 2])
def test_a_recipe_builds_its_spec_and_the_zip_rebuilds_the_same_model(challenge):
    recipe = recipes.RECIPES[challenge]
    model = recipe.build(seed=3)
    again = recipe.build(seed=3)
    for (k, a), b in zip(model.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b), k          # the seed fixes the weights
    # the submission rebuilds the architecture from the spec as plain data
    spec = submission.ModelSpec.from_dict(recipe.spec.to_dict())
    assert spec == recipe.spec and spec.input_scale == recipes.SCALE
    spec.build().load_state_dict(model.state_dict())
    x = torch.randn(4, 129, 200)
    assert model.eval()(x).shape == (4, 1)


def test_challenge_1_reads_the_evoked_response_through_an_elu_in_fine_bins():
    model = recipes.C1.build()
    kinds = {type(m).__name__ for m in model.modules()}
    assert "ELU" in kinds and "Square" not in kinds and "SafeLog" not in kinds
    assert recipes.C1.spec.kwargs["pool_time_length"] * 0.01 <= 0.1   # seconds per bin


def test_challenge_2_starts_at_the_training_mean():
    """Its read-out starts at zero: on standardised targets it first predicts the mean."""
    model = recipes.C2.build(seed=1).eval()
    with torch.no_grad():
        out = model(torch.randn(8, 129, 200) * 20)
    assert torch.count_nonzero(out) == 0
    # a recipe without that choice starts elsewhere
    other = recipes.C2.but(zero_readout=False).build(seed=1).eval()
    with torch.no_grad():
        assert torch.count_nonzero(other(torch.randn(8, 129, 200) * 20)) == 8


def test_trainer_settings_and_a_changed_recipe():
    kw = recipes.C1.trainer_kwargs(epochs=3)
    assert kw == {"loss": recipes.C1.loss, "lr": recipes.C1.lr, "epochs": 3,
                  "batch_size": recipes.C1.batch_size, "ema": recipes.C1.ema}
    coarse = recipes.C1.but(loss="huber", spec_kwargs={"pool_time_length": 20,
                                                       "pool_time_stride": 20})
    assert coarse.loss == "huber" and coarse.spec.kwargs["pool_time_length"] == 20
    assert coarse.spec.kwargs["conv_nonlin"] == "torch.nn.ELU"       # the rest is kept
    assert recipes.C1.spec.kwargs["pool_time_length"] != 20           # the original unchanged
    other = recipes.C1.but(model="Deep4Net", spec_kwargs={"final_conv_length": "auto"})
    assert other.spec.name == "Deep4Net" and "conv_nonlin" not in other.spec.kwargs
    assert "Deep4Net(" in other.describe() and "MSE loss" in other.describe()


def test_the_recipes_are_among_the_candidates_the_selection_compares():
    """bench_scores --select compares candidates on a development release; the recipe used
    everywhere must be one of them (else nothing chose it)."""
    from bench.bench_scores import _candidates

    cands = _candidates()
    for c, recipe in recipes.RECIPES.items():
        assert any(r == recipe for _, r in cands[c]), c
        distinct = {repr(r.to_dict()) for _, r in cands[c]}
        assert len(distinct) == len(cands[c]) >= 3, c
