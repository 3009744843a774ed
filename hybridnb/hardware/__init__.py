"""What hardware there is and what to trust: inventory (NVML, sysfs, host), the probe in a child
process, the rules that turn both into recommended settings, and the views of the report."""
