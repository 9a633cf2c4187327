"""Byte units: memory is counted in bytes everywhere; these name the binary multiples."""

MiB = 1 << 20
GiB = 1 << 30
