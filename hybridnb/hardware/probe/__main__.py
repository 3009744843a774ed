"""``python -m hybridnb.hardware.probe WIRING --backend B --index N``: the probe child (see
``child``), started by the probe's supervisor through ``processes.framed``."""

import sys

from hybridnb.hardware.probe.child import main
from hybridnb.processes.framed import connect

if __name__ == "__main__":
    channel, _, rest = connect(sys.argv[1:])
    main(rest, channel)
