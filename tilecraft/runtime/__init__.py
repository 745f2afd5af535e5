"""One module per device runtime (cpu.py, ...); devices are registered in tilecraft/device.py."""
