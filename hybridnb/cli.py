"""Command line: ``python -m hybridnb detect|compare`` (also the ``hybridnb`` script).

The subcommands' arguments are built without torch (compare's in its own module), so ``--help``
is instant. Errors go to stderr with exit code 2; ``detect --json`` prints only JSON on stdout.
An interrupt ends a command with code 130 once its children are gone (``processes.supervise``).
"""

from __future__ import annotations

import argparse
import sys
import warnings

from hybridnb.comparison import compare_cli  # light modules: no torch
from hybridnb.hardware.probe import DEFAULT_TIMEOUT

PROG = "python -m hybridnb"


def detect_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Find the GPUs, validate each in a child process, and print the "
                          "recommended device, precision and training settings.")
    parser.add_argument("--json", action="store_true",
                        help="print the report as JSON (and nothing else) on stdout")
    parser.add_argument("--timeout", type=_positive, default=DEFAULT_TIMEOUT, metavar="S",
                        help=f"seconds the GPU probe may take (default {DEFAULT_TIMEOUT:g})")
    parser.add_argument("--refresh", action="store_true",
                        help="probe the GPUs again instead of trusting a cached verdict")


def run_detect(args: argparse.Namespace) -> int:
    import json

    from hybridnb.hardware.detect import HardwareWarning, detect

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HardwareWarning)  # they are in the report itself
        hw = detect(refresh=args.refresh, probe_timeout=args.timeout)
    print(json.dumps(hw.to_dict(), indent=2) if args.json else str(hw))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="hybridnb: what this machine's hardware can be trusted with, "
        "and how a model's training step runs on it.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, about, add_arguments, run in (
            ("detect", "probe the hardware and print the recommended settings",
             detect_arguments, run_detect),
            ("compare", "time a model's training steps on random inputs under precision / "
             "layout / compile variants, side by side, each variant in its own process",
             compare_cli.add_arguments, compare_cli.run)):
        command = sub.add_parser(name, help=about, description=about)
        add_arguments(command)
        command.set_defaults(run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; returns its exit code (2 for a usage or input error)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, already printed to stderr)
        return int(exc.code or 0)
    try:
        return int(args.run(args) or 0)
    except ValueError as exc:  # a bad argument or environment variable: named in the message
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # its children are already gone (processes.supervise.Watch)
        print(f"{PROG} {args.command}: interrupted", file=sys.stderr)
        return 130  # the shell's code for a command ended by SIGINT


def _positive(text: str) -> float:
    """argparse's type for --timeout: its error names the option, not detect()'s keyword."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value
