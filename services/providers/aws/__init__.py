"""The ``aws`` provider: one EC2 instance with a public IPv4 address per Proxy, behind one
security group per provider entry (docs/providers.md, "aws").

Split by concern so each part is small and the pure parts are testable without a server:
``config`` (the settings block), ``pure.mapping`` (tags, states, filters, instances),
``pure.network`` (subnet choice, the security group's rules), ``pure.classify`` (errors into the
taxonomy), ``client`` (the aiobotocore client and the translation of its exceptions),
``firewall`` (the security group), ``provider`` (the Provider calls). Its fake (moto's EC2
emulator as a process, and a fault-injecting front for it) is the test kit's
``services.testing.aws`` (D150).

Nothing here imports aiobotocore at package import time: a providers config naming only
``local`` must not need it.
"""
