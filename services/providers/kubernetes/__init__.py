"""The ``kubernetes`` provider: one Squid pod per Proxy, in the Proxy's namespace.

Split by concern so the pure parts are testable without a cluster: ``config`` (the settings
block), ``mapping`` (pod manifest, labels, states, ids), ``classify`` (API errors into the
taxonomy), ``provider`` (the four calls through kubernetes_asyncio).
"""
