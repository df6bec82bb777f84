"""The ``gcp`` provider: one Compute Engine VM with an ephemeral external IP per Proxy.

Split by concern so each part is small and the pure parts are testable without a server:
``config`` (the settings block), ``mapping`` (labels, states, ids), ``classify`` (errors into the
taxonomy), ``wirelog`` (what the debug wire log may show), ``client`` (the real Compute client),
``provider`` (the four calls). Its local HTTP fake of the Compute REST API is the test kit's
``services.testing.gcp`` (D150).

Nothing here imports the Google SDK at package import time: a providers config naming only
``local`` must not need it.
"""
