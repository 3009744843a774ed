"""Speedups: exact rewrites of a model's layers (``rewrite.Rewrite``; their modules share the
originals' state, ``replace.Replacement``) and which knobs a run gets (``decide.apply_speedups``).
"""

from hybridnb.speedups.applied import Applied
from hybridnb.speedups.chain import CHAIN, find_chains
from hybridnb.speedups.decide import KNOBS, MODES, apply_speedups, cpu_candidate, wanted
from hybridnb.speedups.depthwise import DEPTHWISE
from hybridnb.speedups.replace import Replacement
from hybridnb.speedups.rewrite import Rewrite, RewriteReport
from hybridnb.speedups.rows import ROWS
from hybridnb.speedups.span import SPAN

REWRITES: tuple[Rewrite, ...] = (DEPTHWISE, SPAN, CHAIN, ROWS)


def undo_rewrites(model) -> int:
    """Every rewrite of ``model`` undone (the original modules back); returns how many."""
    return sum(r.undo(model) for r in REWRITES)


__all__ = ["CHAIN", "DEPTHWISE", "KNOBS", "MODES", "REWRITES", "ROWS", "Applied", "Replacement",
           "Rewrite", "RewriteReport", "SPAN", "apply_speedups", "cpu_candidate",
           "find_chains", "undo_rewrites", "wanted"]
