"""The one interface of a rewrite, ``Rewrite``: the rule (``applies``), ``apply`` (find, replace,
check on the first batch; nothing kept when the check fails), ``undo``, ``active``; and
``LayerRewrite``, one layer for one layer, checked layer by layer and on the model's output.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import Tensor, nn

from hybridnb.speedups import exact, replace


@dataclass
class RewriteReport:
    """What ``Rewrite.apply`` did: the modules rewritten (a chain's as "a>bn>b"), the worst
    relative difference, and why not when something found was not rewritten."""

    rewritten: list[str] = field(default_factory=list)
    max_rel_diff: float = 0.0
    note: str = ""

    def __bool__(self) -> bool:
        return bool(self.rewritten)


class Rewrite(ABC):
    """A rewrite of stock layers into replacement modules; see the module docstring."""

    name: ClassVar[str]  # the speedups knob: "rewrite", "rows", "chain"
    label: ClassVar[str]  # how messages name it
    kind: ClassVar[type[replace.Replacement]]  # the base class of its replacements
    differs_from: ClassVar[str] = "the stock layers"  # the note's wording
    rule: ClassVar[str] = ""  # what the CPU's rule applies, in a message
    none_found: ClassVar[str]  # why nothing was rewritten, when the rule took no layer
    trains: ClassVar[bool] = False  # the training path differs from eval's: check it too
    check_samples: ClassVar[int | None] = None  # find and check on this many samples (all)

    @abstractmethod
    def applies(self, module: nn.Module) -> bool:
        """The rule before any batch: ``module`` is a layer this rewrite can take."""

    def could_apply(self, model: nn.Module) -> bool:
        """Cheap, before any batch: whether ``model`` has layers the rule could take."""
        return any(self.applies(m) for m in model.modules())

    @abstractmethod
    def find(self, model: nn.Module, example: tuple) -> tuple[list, Any, float]:
        """The layers the rule takes on ``example`` (groups of module names), the stock eval output
        of that one forward (the check's reference) and the worst layer-level difference."""

    @abstractmethod
    def swap_in(self, model: nn.Module, group: tuple[str, ...]) -> None:
        """Put the replacement(s) for one found group in place."""

    def apply(self, model: nn.Module, *example) -> RewriteReport:
        """Rewrite, in place, every layer of ``model`` the rule takes on ``example`` (one batch's
        positional inputs, on the model's device) if the result passes ``check``; else none."""
        report = RewriteReport()
        if not self.could_apply(model):
            return report  # nothing to check: no forward
        if self.check_samples:
            example = exact.first_samples(example, self.check_samples)
        groups, reference, worst = self.find(model, example)
        if not groups:
            return report
        for group in groups:
            self.swap_in(model, group)
        checked, why = self.check(model, *example, reference=reference)
        report.max_rel_diff = max(worst, checked)
        why = why or (self._differed(worst) if worst > exact.RTOL else "")
        if why:
            self.undo(model)
            report.note = f"{self.label} not used: {why}; the model runs unchanged"
            return report
        report.rewritten = [">".join(g) for g in groups]
        return report

    def check(self, model: nn.Module, *example, reference: Any = None) -> tuple[float, str]:
        """Exactness on ``example`` of ``model`` against a copy with this rewrite undone: eval
        outputs (``reference``: the stock one, when known) and where ``trains`` one training
        forward and backward. Never raises: returns the largest relative difference and what
        differed or how the check failed ("" when exact)."""
        try:
            stock = copy.deepcopy(model) if reference is None or self.trains else None
            if stock is not None:
                self.undo(stock)
            if reference is None:
                reference = exact.eval_output(stock, example)
            ours, theirs = map(exact.tensors_of, (exact.eval_output(model, example), reference))
            worst = max(map(exact.rel_diff, ours, theirs), default=0.0) \
                if len(ours) == len(theirs) else float("inf")
            if self.trains:
                worst = max(worst, exact.training_diff(stock, copy.deepcopy(model), example))
        except Exception as exc:  # noqa: BLE001 — a form that fails its check is not used
            return float("inf"), (f"its check failed on the first batch "
                                  f"({type(exc).__name__}: {str(exc)[:100]})")
        return worst, self._differed(worst) if worst > exact.RTOL else ""

    def _differed(self, worst: float) -> str:
        return (f"it differed from {self.differs_from} by {worst:.2g} (relative) on the first "
                f"batch, more than {exact.RTOL:g}")

    def undo(self, model: nn.Module) -> int:
        """The original modules back in place of this rewrite's replacements; returns how many."""
        return replace.restore(model, self.kind)

    def active(self, model: nn.Module) -> list[str]:
        """Names of the modules of ``model`` that currently run this rewrite's form."""
        return list(replace.replaced(model, self.kind))


class LayerRewrite(Rewrite):
    """One layer for one layer: a ``replace.FormReplacement`` ``kind`` where the rule takes one."""

    kind: ClassVar[type[replace.FormReplacement]]
    differs_from = "the convolution"

    def swap_in(self, model: nn.Module, group: tuple[str, ...]) -> None:
        (name,) = group
        replace.put(model, name, self.kind(model.get_submodule(name)))

    def find(self, model: nn.Module, example: tuple) -> tuple[list, Any, float]:
        """Each candidate's form compared with the layer's output in one eval forward (hooks)."""
        worst: dict[str, float] = {}
        # the model itself (name "") has no parent to swap in
        names = {m: n for n, m in model.named_modules() if n and self.applies(m)}

        def hook(module, args, output):
            x = args[0] if args else None
            if isinstance(x, Tensor) and self.kind.fits(module, x):
                diff = exact.rel_diff(self.kind.compute(module, x), output)
                worst[names[module]] = max(worst.get(names[module], 0.0), diff)

        output = exact.eval_output(model, example, [m.register_forward_hook(hook) for m in names])
        return [(n,) for n in sorted(worst)], output, max(worst.values(), default=0.0)
