"""Pure parts of the hetzner provider: no I/O, no clock, no randomness."""
