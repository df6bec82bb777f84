"""Proxies and pools from a shell: ``get``, ``describe``, ``apply``, ``delete``, ``scale``, and the
views they read.
"""
