"""The gateway: one proxy endpoint for the whole fleet (docs/gateway.md).

A crawler points any HTTP client at it with its name and token as the proxy login; the gateway
leases proxies through the discovery API on that client's behalf and relays each request through
one of them. It decides nothing about instances and keeps no state the log does not also have: a
session is a lease, found again by any replica.
"""
