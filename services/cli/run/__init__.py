"""Running the system: ``up`` and ``run NAME``, the services they know, the local proxies of a data
dir.
"""
