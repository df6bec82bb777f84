"""Orphan garbage collection: instances tagged as ours whose proxy is gone.

See docs/architecture.md, Orphan GC.
"""
