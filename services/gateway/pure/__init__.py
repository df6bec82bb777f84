"""The gateway's decisions, without I/O: the user name's grammar, a response's outcome, the heads
it sends on."""
