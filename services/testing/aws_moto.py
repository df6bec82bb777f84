"""moto's EC2 emulator in server mode, with public addresses the tests can reach.

``python -m services.testing.aws_moto --port N --public-ips 127.0.0.1`` serves the EC2
Query API on 127.0.0.1:N (``aws.MotoEc2`` starts it as a process of its own, as a real
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
  it again). Such a launch is refused that way;
- a launch into a subnet checks the instance type against the region's offerings only; EC2
  checks the subnet's zone and answers ``Unsupported`` naming the zones that offer it (a type
  offered nowhere in the region: ``Unsupported`` too; a type that does not exist:
  ``InvalidParameterValue``). Such a launch is refused that way.

moto's catalogue (``DescribeInstanceTypeOfferings``) is a snapshot of EC2's, with most current
types in every zone. ``POST /egress-proxies/offerings`` with ``{"region", "instanceType",
"zones"}`` makes that type offered in exactly those zones of the region (none: not in the region
at all), in what DescribeInstanceTypeOfferings answers and what a launch checks, so a test can
take a type away from a zone; ``/moto-api/reset`` brings the snapshot back. A dry run is
answered ``DryRunOperation`` before any of these checks, as EC2's reference says it checks
permissions only.

moto's optional validations are on (``MOTO_ENABLE_AMI_VALIDATION``,
``MOTO_ENABLE_KEYPAIR_VALIDATION``, ``MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION``), so an unknown
image, key pair or instance type is refused the way EC2 refuses it rather than launched.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
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


class Offerings:
    """The override of moto's catalogue: every change made, so a reset undoes it."""

    def __init__(self, table: dict[str, dict[str, list[dict[str, Any]]]]) -> None:
        self.table = table  # moto's INSTANCE_TYPE_OFFERINGS, changed in place
        self.saved: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self.lock = threading.Lock()

    def offer(self, region: str, instance_type: str, zones: Sequence[str]) -> None:
        """``instance_type`` offered in exactly ``zones`` of ``region``."""
        wanted = {"availability-zone": list(zones), "region": [region] if zones else []}
        with self.lock:
            for kind, locations in wanted.items():
                rows = self.table[kind].setdefault(region, [])
                self.saved.setdefault((kind, region), list(rows))
                rows[:] = [r for r in rows if r.get("InstanceType") != instance_type]
                rows += [
                    {"InstanceType": instance_type, "Location": loc, "LocationType": kind}
                    for loc in locations
                ]

    def restore(self) -> None:
        with self.lock:
            for (kind, region), rows in self.saved.items():
                self.table[kind][region][:] = rows
            self.saved.clear()

    def zones(self, region: str, instance_type: str) -> list[str]:
        with self.lock:
            rows = self.table["availability-zone"].get(region, [])
            return sorted(r["Location"] for r in rows if r.get("InstanceType") == instance_type)


def launch_problem(
    offerings: Offerings, known_types: Any, region: str, zone: str, instance_type: str
) -> tuple[str, str] | None:
    """EC2's refusal (code, message) of ``instance_type`` launched in ``zone``, or None."""
    if instance_type not in known_types:
        return "InvalidParameterValue", f"Invalid value '{instance_type}' for InstanceType."
    offered = offerings.zones(region, instance_type)
    if not offered:
        return "Unsupported", (
            "The requested configuration is currently not supported. "
            "Please check the documentation for supported configurations."
        )
    if zone and zone not in offered:
        return "Unsupported", (
            f"Your requested instance type ({instance_type}) is not supported in your "
            f"requested Availability Zone ({zone}). Please retry your request by not "
            f"specifying an Availability Zone or choosing {', '.join(offered)}."
        )
    return None


def checked_launch(
    run_instances: Callable[..., Any],
    not_found: type[Exception],
    refused: Callable[[str, str], Exception],
    problem: Callable[[str, str, str], tuple[str, str] | None],
) -> Any:
    """moto's ``run_instances``, refusing security group ids it does not know and an instance
    type its zone does not offer, as EC2 does."""

    def run_checked(backend: Any, *args: Any, **kwargs: Any) -> Any:
        wanted = list(kwargs.get("security_group_ids") or [])
        subnet_ids = [kwargs.get("subnet_id")]
        for nic in kwargs.get("nics") or []:
            wanted += list(nic.get("Groups") or [])
            subnet_ids.append(nic.get("SubnetId"))
        zone = str(kwargs.get("placement") or "")
        for subnet_id in filter(None, subnet_ids):
            # A subnet moto does not know: its own lookup answers InvalidSubnetID.NotFound.
            found = [z[subnet_id] for z in backend.subnets.values() if subnet_id in z]
            zone = zone or (found[0].availability_zone if found else "")
        refusal = (
            None
            if kwargs.get("is_instance_type_default")
            else problem(backend.region_name, zone, str(kwargs.get("instance_type") or ""))
        )
        if refusal is not None:
            raise refused(*refusal)
        for group_id in wanted:
            if backend.get_security_group_from_id(group_id) is None:
                raise not_found(group_id)
        return run_instances(backend, *args, **kwargs)

    return run_checked


def with_controls(app: Any, offerings: Offerings) -> Any:
    """The WSGI app, with the catalogue override's route and a reset that undoes it."""

    def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        path = environ.get("PATH_INFO", "")
        if path == "/egress-proxies/offerings" and environ.get("REQUEST_METHOD") == "POST":
            size = int(environ.get("CONTENT_LENGTH") or 0)
            body = json.loads(environ["wsgi.input"].read(size) or b"{}")
            offerings.offer(body["region"], body["instanceType"], body["zones"])
            start_response("204 No Content", [])
            return [b""]
        if path == "/moto-api/reset":
            offerings.restore()
        return app(environ, start_response)

    return serve


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
    from moto.ec2.exceptions import (  # noqa: PLC0415
        EC2ClientError,
        InvalidSecurityGroupNotFoundError,
    )
    from moto.ec2.models.instance_types import (  # noqa: PLC0415
        INSTANCE_TYPE_OFFERINGS,
        INSTANCE_TYPES,
    )
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
    offerings = Offerings(INSTANCE_TYPE_OFFERINGS)
    InstanceBackend.run_instances = checked_launch(  # type: ignore[method-assign]
        InstanceBackend.run_instances,
        InvalidSecurityGroupNotFoundError,
        EC2ClientError,
        lambda region, zone, kind: launch_problem(offerings, INSTANCE_TYPES, region, zone, kind),
    )
    app = with_controls(DomainDispatcherApplication(create_backend_app), offerings)
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
