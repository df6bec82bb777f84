"""The event log on NATS JetStream: the store, the streams, and the readers that feed folds.

The domain (schemas, the store contract, the folds) lives in ``events`` and ``projections`` and
does no I/O; everything here is the adapter that does. See docs/architecture.md, The event log.
"""
