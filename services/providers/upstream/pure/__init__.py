"""The pure code of ``services.providers.upstream``: no I/O, no clock, no randomness, no
process-global state (docs/architecture.md, "Layers"; the import contract covers every
``services.**.pure``)."""
