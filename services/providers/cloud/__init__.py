"""What the cloud VM providers (aws, digitalocean, hetzner) share: their common settings, the
user data that installs the egress Squid, zone spreading and the firewall's name
(docs/providers.md, "Cloud VMs")."""
