"""The reconciler: folds each proxy aggregate and decides commands and phase changes."""
