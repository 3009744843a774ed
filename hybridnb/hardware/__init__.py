"""What hardware there is and what to trust: ``detect`` reads the inventory (``gpu_info``,
``nvml``, ``host``), validates each GPU in a child (``probe``), decides with ``rules`` and renders
the report with ``views``.
"""
