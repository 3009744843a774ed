"""Command line: ``python -m hybridnb detect|compare``.

Each subcommand lives with its module (``cli_args``/``cli`` pairs), so this file only dispatches.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, one-line help)
COMMANDS = {
    "detect": ("hybridnb.hardware.detect", "probe the hardware and print the recommended settings"),
    "compare": ("hybridnb.measure.compare", "compare precision / compile variants on a model"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hybridnb", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        p.set_defaults(_module=module_name)
        # Arguments are added lazily: only the chosen module is imported.
    args, rest = parser.parse_known_args(argv)
    module = importlib.import_module(args._module)
    sub_parser = argparse.ArgumentParser(prog=f"python -m hybridnb {args.command}")
    module.cli_args(sub_parser)
    return int(module.cli(sub_parser.parse_args(rest)) or 0)


if __name__ == "__main__":
    sys.exit(main())
