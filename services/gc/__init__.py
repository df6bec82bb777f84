"""Orphan garbage collection: instances tagged as ours whose proxy is gone (DESIGN §4)."""
