"""The ``digitalocean`` provider: one Droplet with a public IPv4 address per Proxy, behind one
cloud firewall per provider entry (docs/providers.md, "Cloud VMs").

Split by concern so each part is small and the pure parts are testable without a server:
``config`` (the settings block and where the token comes from), ``pure.mapping`` (tags, states,
ids, the firewall's rules), ``pure.classify`` (DigitalOcean's answers into the taxonomy),
``client`` (the official ``pydo`` async client, one request per call), ``firewall`` (the entry's
cloud firewall), ``catalogue`` and ``pure.catalogue`` (the cached size catalogue a create and
the preflight check a size against, D142), ``preflight`` (the read-only checks of the entry),
``provider`` (the Provider and LeftoverCleaner calls). Its local HTTP fake of the DigitalOcean
API is the test kit's ``services.testing.digitalocean`` (D150).

Nothing here imports ``pydo`` at package import time: a providers config naming only ``local``
must not need it.
"""
