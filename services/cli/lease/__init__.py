"""``lease ...``: the discovery API from a shell, and where `up`'s API is found."""
