"""The pool controller's pure code: the decider and what it reads of a member (no I/O)."""
