"""The ``hetzner`` provider: one Hetzner Cloud server with a public IPv4 per Proxy.

Split by concern so each part is small and the pure parts are testable without a server:
``config`` (the settings block), ``pure.mapping`` (labels, states, ids, firewall rules),
``pure.classify`` (errors into the taxonomy and the server's delay), ``pure.catalogue`` and
``catalogue`` (which types a location offers, the walk over locations, the cache), ``client``
(the real ``hcloud`` client, its token and its errors), ``firewall`` (the entry's one firewall),
``servers`` (the server calls), ``provider`` (when to call them), ``preflight`` and
``pure.preflight`` (the read-only check). Its local HTTP fake of the Hetzner Cloud API is the
test kit's ``services.testing.hetzner`` (D150).

Nothing here imports ``hcloud`` at package import time: a providers config naming only ``local``
must not need it (docs/providers.md, "Cloud VMs").
"""
