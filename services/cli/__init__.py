"""The egress-proxies command line."""
