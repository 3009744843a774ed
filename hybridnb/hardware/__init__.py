"""What hardware there is and what to trust.

``detect`` (the report and the choice) reads the inventory (``gpu_info``: NVML through ``nvml``,
the one NVML module, and AMD's sysfs; ``host``), validates each GPU in a child process
(``probe``: supervisor, child steps, on-disk verdict cache), and turns both into
settings with ``rules`` (native bf16, compile availability, recommendations: each decided once);
``views`` renders the report as text and HTML.
"""
