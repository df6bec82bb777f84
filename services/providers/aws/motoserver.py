"""moto's EC2 emulator in server mode, with public addresses the tests can reach.

``python -m services.providers.aws.motoserver --port N --public-ips 127.0.0.1`` serves the EC2
Query API on 127.0.0.1:N (``testing.MotoEc2`` starts it as a process of its own, as a real
endpoint would be one).

Why not ``moto_server`` itself: moto gives every instance a random public address in
54.214.0.0/16, which nothing on a test machine answers (and which a test must never send traffic
to). The end-to-end test's health probe has to reach a Squid standing in for the VM, on
loopback, through the address the provider reports. So before the server starts, moto's public
address generator (``moto.ec2.utils.random_public_ip``, and the name
``moto.ec2.models.elastic_network_interfaces`` imported from it) is replaced by one handing out
the given addresses in turn: distinct 127.0.1.x by default, so two instances have two URLs;
``127.0.0.1`` alone for the end-to-end test.

Two places where moto answers otherwise than EC2 are mended the same way, because the provider
relies on EC2's answer there:

- terminating an instance already terminated deletes its network interface a second time and
  answers ``InvalidNetworkInterfaceID.NotFound``; EC2 answers success (a terminate is
  idempotent). Such a terminate is answered with the instance's state and no side effect;
- a launch naming a security group that does not exist makes one with that id, untagged; EC2
  answers ``InvalidGroup.NotFound`` (which makes the provider forget the group it kept and make
  it again). Such a launch is refused that way.

moto's optional validations are on (``MOTO_ENABLE_AMI_VALIDATION``,
``MOTO_ENABLE_KEYPAIR_VALIDATION``, ``MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION``), so an unknown
image, key pair or instance type is refused the way EC2 refuses it rather than launched.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

DEFAULT_PUBLIC_IPS = tuple(f"127.0.1.{n}" for n in range(1, 255))
VALIDATIONS = (
    "MOTO_ENABLE_AMI_VALIDATION",
    "MOTO_ENABLE_KEYPAIR_VALIDATION",
    "MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION",
)


def address_source(addresses: Sequence[str]) -> Callable[[], str]:
    """A thread-safe ``random_public_ip`` stand-in cycling through ``addresses``."""
    cycle: Iterator[str] = itertools.cycle(addresses)
    lock = threading.Lock()

    def next_address() -> str:
        with lock:
            return next(cycle)

    return next_address


def idempotent_terminate(terminate: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """moto's ``Instance.terminate``, doing nothing for an instance already terminated."""

    def terminate_once(instance: Any) -> Any:
        if instance.state == "terminated":
            return copy.copy(instance.instance_state)
        return terminate(instance)

    return terminate_once


def known_groups_only(run_instances: Callable[..., Any], not_found: type[Exception]) -> Any:
    """moto's ``run_instances``, refusing security group ids it does not know, as EC2 does."""

    def run_checked(backend: Any, *args: Any, **kwargs: Any) -> Any:
        wanted = list(kwargs.get("security_group_ids") or [])
        for nic in kwargs.get("nics") or []:
            wanted += list(nic.get("Groups") or [])
        for group_id in wanted:
            if backend.get_security_group_from_id(group_id) is None:
                raise not_found(group_id)
        return run_instances(backend, *args, **kwargs)

    return run_checked


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--public-ips",
        default=",".join(DEFAULT_PUBLIC_IPS),
        help="comma-separated addresses handed out as instances' public IPs, in turn",
    )
    args = parser.parse_args(argv)
    addresses = [a.strip() for a in args.public_ips.split(",") if a.strip()]
    if not addresses:
        parser.error("--public-ips: give at least one address")

    for validation in VALIDATIONS:  # read when moto is imported
        os.environ.setdefault(validation, "true")
    # Imported here: the variable above must be set first, and only this process needs moto.
    import moto.ec2.models.elastic_network_interfaces as enis  # noqa: PLC0415
    import moto.ec2.utils as ec2_utils  # noqa: PLC0415
    from moto.ec2.exceptions import InvalidSecurityGroupNotFoundError  # noqa: PLC0415
    from moto.ec2.models.instances import Instance, InstanceBackend  # noqa: PLC0415
    from moto.moto_server.werkzeug_app import (  # noqa: PLC0415
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import run_simple  # noqa: PLC0415

    for module in (ec2_utils, enis):  # moved in a newer moto: stop, never hand out 54.214.x.x
        if not callable(getattr(module, "random_public_ip", None)):
            raise SystemExit(f"{module.__name__} has no random_public_ip: pin moto to 5.x")
    source = address_source(addresses)
    ec2_utils.random_public_ip = source
    enis.random_public_ip = source  # type: ignore[attr-defined]  # moto's own import of it
    Instance.terminate = idempotent_terminate(Instance.terminate)  # type: ignore[method-assign,assignment]
    InstanceBackend.run_instances = known_groups_only(  # type: ignore[method-assign]
        InstanceBackend.run_instances, InvalidSecurityGroupNotFoundError
    )
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(
        args.host,
        args.port,
        app,
        threaded=True,
        use_reloader=False,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    main()
