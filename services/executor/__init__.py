"""The provider-executor: runs the reconciler's commands against providers, records outcomes."""
