"""``python -m hybridnb.hardware.probe WIRING --backend B --index N``: the probe child (see
``child``), started by the probe (this package's ``__init__``) through ``processes.framed``."""

from hybridnb.hardware.probe.child import main

if __name__ == "__main__":
    main()
