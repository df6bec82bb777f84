"""The KVM/libvirt provider: proxy VMs on hypervisors reached over SSH (docs/kvm.md)."""
