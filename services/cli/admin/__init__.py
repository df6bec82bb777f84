"""Tools of an operator: ``gc``, ``providers check``, ``crd``, ``clients``."""
