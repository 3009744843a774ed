"""``python -m hybridnb compare``: the command line of ``hn.compare()``.

Importing it imports no torch (``--help`` is instant). The model is an import spec
(``package.module:factory``) or a short name registered in the ``hybridnb.models`` entry-point
group (``eegnex``, ``shallow`` from ``hybridnb_tools.models``), so hybridnb knows no model zoo:
``python -m hybridnb compare --model eegnex --variants fp32 bf16``. Quick mode
(``HYBRIDNB_QUICK=1``): one fp32 step of batch 4 on the CPU.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """compare's options, for ``hybridnb.cli``."""
    parser.add_argument("--model", required=True, metavar="NAME|MODULE:FACTORY",
                        help="the model: a registered name (e.g. eegnex, shallow) or a function "
                             "(or class) building it, as an import spec, e.g. "
                             "hybridnb_tools.models:eegnex")
    parser.add_argument("--input-shape", type=_shape, default=None, metavar="C,T",
                        help="one sample's input shape (default: the factory's input_shape "
                             "attribute, if it has one)")
    parser.add_argument("--batch", type=int, nargs="+", default=None,
                        help="batch size(s); default 256 on a GPU, 32 on the CPU")
    parser.add_argument("--steps", type=int, default=None,
                        help="timed steps per window (default 20 on a GPU, 3 on the CPU)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="untimed steps per variant first (default 3; 1 in quick mode)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="interleaved windows per variant (default 3 on a GPU, 2 on the CPU)")
    parser.add_argument("--variants", nargs="+", default=None,
                        help="e.g. fp32 bf16 fp16 fp32+compile fp32+speedups bf16+channels_last "
                             "bf16+channels_last+rewrite+compile:max-autotune (comma or space "
                             "separated)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds a variant may go silent (warm-up or one window) before "
                             "its process is killed (default 600)")
    parser.add_argument("--csv", type=Path, default=None, help="also write the table here")


def run(args: argparse.Namespace) -> int:
    """Build random inputs of the model's shape, run compare(), print the table."""
    from hybridnb.comparison import compare as cmp
    from hybridnb.env import quick

    factory = load_factory(args.model)
    shape = args.input_shape or getattr(factory, "input_shape", None)
    if shape is None or len(shape) != 2:
        raise ValueError(f"--input-shape: {args.model} has no input_shape attribute; give one "
                         f"sample's shape as C,T (e.g. --input-shape 129,200)")
    dev = cmp.resolve_device(args.device)
    gpu = dev.type != "cpu"
    small = quick() and not gpu
    batch = args.batch or [4 if small else 256 if gpu else 32]
    steps = args.steps or (1 if small else 20 if gpu else 3)
    repeats = args.repeats or (1 if small else 3 if gpu else 2)
    warmup = args.warmup if args.warmup is not None else (1 if small else 3)
    default = ["fp32"] if small else [",".join(cmp.DEFAULT_VARIANTS)]
    variants = [v for item in (args.variants or default) for v in item.replace(",", " ").split()]
    print(f"compare: {args.model} on {dev}, batch {batch}, {warmup} warm-up + {repeats} × "
          f"{steps} timed steps per variant: {', '.join(variants)}", flush=True)
    x, y = cmp.random_windows(max(batch), *shape, seed=args.seed)
    df = cmp.compare(factory, (x, y), variants, steps=steps, warmup=warmup, repeats=repeats,
                     batch_sizes=batch, device=dev, lr=args.lr, seed=args.seed,
                     timeout=args.timeout)
    df.attrs["model"] = getattr(factory, "model_name", args.model)
    print(cmp.compare_table(df))
    if args.csv:
        df.to_csv(args.csv, index=False)
        print(f"compare: table written to {args.csv}")
    return 0


def load_factory(spec: str):
    """A short name the installed packages register (``hybridnb.models`` entry points) or
    ``"package.module:factory"`` -> the factory; a ValueError says what is wrong."""
    if ":" not in spec:
        from importlib.metadata import entry_points

        known = {ep.name: ep.value for ep in entry_points(group="hybridnb.models")}
        if spec not in known:
            names = ", ".join(sorted(known)) or "none registered"
            raise ValueError(f"--model {spec!r}: not a registered model name ({names}); give "
                             f"one of those, or the factory as package.module:factory "
                             f"(e.g. hybridnb_tools.models:eegnex)")
        spec = known[spec]
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--model {spec!r}: write it as package.module:factory "
                         f"(e.g. hybridnb_tools.models:eegnex)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"--model {spec!r}: cannot import {module_name!r} ({exc})") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"--model {spec!r}: {module_name} has no function or class {attr!r}")
    return factory


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(p) for p in text.replace("x", ",").split(",") if p.strip())
    except ValueError:
        shape = ()
    if len(shape) != 2 or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a shape C,T of two positive integers")
    return shape
