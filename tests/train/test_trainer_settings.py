"""The Trainer's options are one list: the signature, ``Settings`` and the docstring agree, so
an option added in one place and forgotten in another fails here."""

from __future__ import annotations

import dataclasses
import inspect

from hybridnb.train.settings import Settings
from hybridnb.train.trainer import Trainer

RESOLVED = {"recommended_precision", "torch_threads", "resolved_", "from_detect"}  # filled in, not given
NOT_SETTINGS = {"self", "model", "callbacks", "unknown"}  # the user's objects (never sent to a
# worker), and the catch-all that names an unknown keyword's equivalent


def options() -> dict[str, inspect.Parameter]:
    params = inspect.signature(Trainer.__init__).parameters
    return {n: p for n, p in params.items() if n not in NOT_SETTINGS}


def test_the_signature_and_settings_list_the_same_options_with_the_same_defaults():
    fields = {f.name: f.default for f in dataclasses.fields(Settings) if f.name not in RESOLVED}
    sig = options()
    assert sorted(sig) == sorted(fields)
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in sig.values())
    differ = {n: (p.default, fields[n]) for n, p in sig.items() if p.default != fields[n]}
    assert differ == {}


def test_the_docstring_names_every_option():
    doc = Trainer.__doc__
    missing = [n for n in options() if f"``{n}``" not in doc and f"``{n}=" not in doc]
    assert missing == []
