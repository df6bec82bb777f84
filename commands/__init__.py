"""The command layer: what people and services ask of an aggregate (declare, delete, scale a pool,
ask for a fresh instance), decided on its fold and appended with optimistic concurrency.

Above the folds (``projections``), below the services, which call it. Its only I/O goes through
the ``EventStore`` it is handed (``decide_and_append``): it imports no I/O module, so the purity
contract covers it, and it runs against the in-memory store as against JetStream
(docs/decisions/0151-a-command-layer-and-names-with-their-subject.md).
"""
