"""``python -m hybridnb.hardware.probe --backend B --index N``: the probe child (see ``child``)."""

import sys

from hybridnb.hardware.probe.child import main

if __name__ == "__main__":
    sys.exit(main())
