"""Other libraries' names and habits met with hybridnb's (Lightning, fastai, skorch, Hugging
Face): keywords, precision names, Lightning hooks."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

import torch

# keyword -> (what to write instead, whose habit it is); near spellings are left to difflib
ALIASES: dict[str, tuple[str, str]] = {
    "max_epochs": ("epochs=", "Lightning"),
    "num_train_epochs": ("epochs=", "Hugging Face"),
    "accumulate_grad_batches": ("grad_accum=", "Lightning"),
    "gradient_accumulation_steps": ("grad_accum=", "Hugging Face"),
    "gradient_clip_val": ("clip_grad= (a gradient-norm limit)", "Lightning"),
    "max_grad_norm": ("clip_grad=", "Hugging Face"),
    "accelerator": ("device= ('auto', 'cpu', 'cuda', 'cuda:N', 'mps')", "Lightning"),
    "devices": ("device= (one device; several: strategy='ddp' with hn.launch)", "Lightning"),
    "gpus": ("device='cuda'", "Lightning"),
    "learning_rate": ("lr=", ""), "max_lr": ("lr= (the schedule's peak)", "fastai"),
    "bs": ("batch_size=", "fastai"), "wd": ("weight_decay=", "fastai"),
    "opt_func": ("optimizer=", "fastai"), "loss_func": ("loss=", "fastai"),
    "criterion": ("loss=", "skorch"), "cbs": ("callbacks=", "fastai"),
    "metrics": ("- not an option; the metrics follow the loss (regression: rmse, nrmse, mae, r2; "
                "loss='cross_entropy': accuracy, balanced_accuracy) in trainer.history and "
                "evaluate(), and monitor= picks the one early stopping watches", ""),
    "patience": ("early_stopping= (a patience in validations)", ""),
    "early_stopping_patience": ("early_stopping=", "Hugging Face"),
    "default_root_dir": ("checkpoint_dir=", "Lightning"), "dirpath": ("checkpoint_dir=", ""),
    "output_dir": ("checkpoint_dir=", "Hugging Face"), "save_dir": ("log_dir=", ""),
    "resume_from_checkpoint": ("fit(train, val, resume=path)", ""),
    "ckpt_path": ("fit(train, val, resume=path)", "Lightning"),
    "limit_train_batches": ("steps_per_epoch=", "Lightning"),
    "max_steps": ("epochs= with steps_per_epoch= (epochs x steps_per_epoch optimizer steps)",
                  "Lightning"),
    "val_check_interval": ("val_every= (optimizer steps)", "Lightning"),
    "check_val_every_n_epoch": ("val_every= (optimizer steps; validation also runs at every "
                                "epoch's end)", "Lightning"),
    "enable_progress_bar": ("live=False", "Lightning"),
    "enable_checkpointing": ("checkpoint_dir= (None: no files)", "Lightning"),
    "num_workers": ("loader_kwargs={'num_workers': N}", ""),
    "pin_memory": ("loader_kwargs={'pin_memory': True}", ""),
    "amp": ("precision= ('bf16', 'fp16', 'fp32', 'auto')", ""),
    "use_amp": ("precision=", ""),
    "class_weight": ("class_weights=", "scikit-learn"), "weight": ("class_weights=", ""),
    "random_state": ("seed=", "scikit-learn"), "deterministic": ("seed=", "Lightning"),
    "train_split": ("fit(train, val): the validation data is given to fit", "skorch"),
    "gradient_checkpointing": ("grad_checkpointing=", "Hugging Face"),
}


def unknown_keywords(unknown: Iterable[str], known: Iterable[str]) -> str:
    """The message for keywords ``Trainer()`` does not take: each with the option to use."""
    known = sorted(known)
    parts = []
    for name in sorted(unknown):
        if name in ALIASES:
            use, whose = ALIASES[name]
            said = use[2:] if use.startswith("- ") else f"use {use}"
            parts.append(f"{name!r}: {said}" + (f" ({whose}'s {name})" if whose else ""))
            continue
        near = difflib.get_close_matches(name, known, n=2, cutoff=0.6)
        parts.append(f"{name!r}: " + (f"did you mean {' or '.join(n + '=' for n in near)}"
                                     if near else "no such option"))
    plural = "s" if len(parts) > 1 else ""
    return (f"Trainer() got unexpected keyword argument{plural}: " + "; ".join(parts)
            + ". Every option is listed in help(hn.Trainer)")


# Lightning's names (and torch dtypes, as str() names them without "torch.") for the precisions
# hybridnb runs: fp32 weights, the forward under autocast in the named dtype
PRECISION_ALIASES = {
    "16-mixed": "fp16", "16": "fp16", "fp16-mixed": "fp16", "float16": "fp16", "half": "fp16",
    "bf16-mixed": "bf16", "bfloat16": "bf16",
    "32-true": "fp32", "32": "fp32", "float32": "fp32", "float": "fp32",
}
_PURE = {"16-true": "fp16", "bf16-true": "bf16", "transformer-engine": "bf16",
         "64-true": None, "64": None, "float64": None, "double": None}


def precision_name(precision):
    """``precision=`` as hybridnb names it ("16-mixed" -> "fp16", ...); a precision hybridnb
    does not run (weights in half precision, float64) is a ValueError saying what to use."""
    key = str(precision).removeprefix("torch.")  # 16 -> "16", torch.bfloat16 -> "bfloat16"
    if key in ("auto", "bf16", "fp16", "fp32") or key in PRECISION_ALIASES:
        return PRECISION_ALIASES.get(key, key)
    if key in _PURE:
        mixed = _PURE[key]
        raise ValueError(
            f"precision={precision!r} (weights held in that precision) is not supported: "
            "hybridnb keeps fp32 weights and runs the forward under autocast"
            + (f"; use precision={mixed!r} (Lightning's '{mixed.replace('fp', '')}-mixed')"
               if mixed else "; use precision='fp32'"))
    raise ValueError(f"precision={precision!r} is not one of 'auto', 'bf16', 'fp16', 'fp32' "
                     "(Lightning's '16-mixed', 'bf16-mixed', '32-true' are also understood)")


def refuse_lightning_hooks(model: torch.nn.Module) -> None:
    """A model whose training lives in Lightning hooks would train without them: refused (a
    LightningModule's defaults do not count: only what the user wrote would be ignored)."""
    hooks = []
    for hook in ("training_step", "configure_optimizers"):
        owner = next((cls for cls in type(model).__mro__ if hook in vars(cls)), None)
        if owner is not None and owner.__module__.split(".")[0] not in ("lightning",
                                                                        "pytorch_lightning"):
            hooks.append(hook)
    if hooks:
        name = type(model).__name__
        raise TypeError(
            f"{name} defines Lightning hooks ({', '.join(hooks)}) that hn.Trainer never calls "
            "(it trains forward() with its own loss= and optimizer=): pass the network they "
            "wrap (e.g. model.net) with loss= and optimizer= matching your hooks, wrap the "
            "model to train its forward() alone (hn.Trainer(torch.nn.Sequential(model), ...)), "
            "or train it with lightning.Trainer")
