"""Reaching a Kubernetes cluster: where it is (settings) and the one API client services use."""
