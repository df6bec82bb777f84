"""Providers: where proxy instances run (local processes, Kubernetes pods, GCE VMs, KVM VMs)."""
