"""How a setting is declared once (type, default, bounds, help) and read from a flag or the
environment: the settings every service shares, the egress policy's, the error a bad one raises;
the CLI turns them into options.
"""
