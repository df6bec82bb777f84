"""``backup`` and ``restore``: the log copied out at one instant and handed back, with the files
and their checks.
"""
