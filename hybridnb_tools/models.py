"""The EEG models the notebooks and the command line compare and train: factories that build a
fresh braindecode model for Challenge-1-shaped windows (129 channels × 200 samples at 100 Hz).

Each factory carries ``input_shape`` and ``model_name``, so
``python -m hybridnb compare --model hybridnb_tools.models:eegnex`` needs nothing else.
"""

from __future__ import annotations

from braindecode.models import EEGNeX, ShallowFBCSPNet
from torch import nn

N_CHANS, N_TIMES, SFREQ = 129, 200, 100


def eegnex() -> nn.Module:
    """braindecode's EEGNeX, the challenge's usual baseline, with one regression output."""
    return EEGNeX(n_chans=N_CHANS, n_outputs=1, n_times=N_TIMES, sfreq=SFREQ)


def shallow() -> nn.Module:
    """braindecode's ShallowFBCSPNet with one regression output."""
    return ShallowFBCSPNet(n_chans=N_CHANS, n_outputs=1, n_times=N_TIMES,
                           final_conv_length="auto")


for _factory, _name in ((eegnex, "EEGNeX"), (shallow, "ShallowFBCSPNet")):
    _factory.input_shape = (N_CHANS, N_TIMES)
    _factory.model_name = _name
MODELS = {"eegnex": eegnex, "shallow": shallow}
