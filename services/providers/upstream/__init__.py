"""The ``upstream`` provider: sticky sessions of a proxy service (residential, ISP, mobile
gateways), each served through a Squid of ours chained to the service
(docs/decisions/0160-upstream-proxy-services.md).

Split by concern: ``pure/templates`` (the services' user-name grammars), ``pure/refusals`` (the
service's answers onto the error taxonomy), ``config`` (the settings block and the password),
``provider`` (the local provider's machinery with a parent).
"""
