"""``python -m hybridnb detect|compare``: see ``hybridnb.cli``."""

import sys

from hybridnb.cli import main

if __name__ == "__main__":
    sys.exit(main())
