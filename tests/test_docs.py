"""The reference and the user's guide (mkdocs.yml, docs/): built with warnings as errors, so a
docstring griffe cannot read, a page left out of the nav or a broken link fails `make test`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_docs_build_strict_and_hold_the_reference(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (the dev extra has it)")
    pytest.importorskip("mkdocstrings_handlers.python",
                        reason="mkdocstrings[python] is not installed (the dev extra has it)")
    site = tmp_path / "site"
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                          str(ROOT / "mkdocs.yml"), "-d", str(site)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert not re.search(r"^WARNING", run.stderr, flags=re.M), run.stderr[-3000:]
    trainer = (site / "reference" / "trainer" / "index.html").read_text()
    for method in ("fit", "evaluate", "predict", "save"):   # rendered from the docstrings
        assert f'id="hybridnb.train.trainer.Trainer.{method}"' in trainer, method
    own = (site / "your-own-data" / "index.html").read_text()
    for topic in ("DataLoader", "MNE", "braindecode", "BIDS", "cross_entropy"):
        assert topic in own, topic


def test_every_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md"))
    assert [p for p in pages if p not in nav] == []
