"""The project's test kit, public like ``kopf.testing``: fakes of what the product talks to, for
this project's tests and for anyone testing code built on it (D150).

What it offers, one module per thing it stands in for:

- ``provider``: the in-memory provider (``FakeProvider``, a product provider re-exported from
  ``services.providers.fake``) and the variants only tests use;
- ``eventlog``: the in-memory event store, held to the JetStream store's contract;
- ``cloud_http``: the HTTP plumbing every cloud API fake shares (a server on a free loopback
  port, faults and stalls per call kind, JSON replies);
- ``<type>`` for a cloud provider type: the fake of its API that tests start (``aws``: moto's
  EC2 emulator and a fault-injecting front; ``gcp``, ``hetzner``, ``digitalocean``: HTTP fakes);
  its parts are ``<type>_<part>`` (``_api``: what the account holds and answers; ``_catalogue``:
  the world it lists; ``_moto``: the emulator's process);
- ``upstream``: a residential/ISP proxy service of the kind the ``upstream`` provider type leases
  sessions from, a real HTTP proxy in a process of its own, and its parts: ``_server`` (the
  process), ``_logins`` (the services' user name grammars), ``_exits`` (sessions, exits by
  country, faults, traffic), ``_heads`` (what it writes to clients and sites), ``_control`` (the
  API that makes it misbehave and reads its counts), ``_wire`` (its stream loops: reading a
  head, lingering on a refusal, streaming an answer).

The naming rule, held by tests/unit/test_testing_package.py: a module is named after what it
stands in for, a cloud's or a proxy service's fake after the provider type it serves, a part of
one after that type and the part, and what the cloud fakes share with ``cloud_``.

Product code never imports this package: an import contract in pyproject.toml forbids it to
events, projections, the client and every other package of ``services``, so nothing here runs
in a deployment.
"""
