"""Where a proxy lets its holder go, without a server: ``allowedTargets`` validation in every
provider's block, the rules each provider's Squid configuration carries, the VM guard's firewall
rules and the lease key's owner and mode, and the health message for a refused check URL
(docs/decisions/0134-where-a-proxy-lets-its-holder-go.md)."""

from __future__ import annotations

import email.parser
import email.policy
from pathlib import Path
from typing import Any

import msgspec
import pytest

from services.health.pure.refused import refused_by_proxy, refused_message
from services.providers.cloud.pure.guard import (
    DROP_IN_PATH,
    GUARD_PATH,
    OWN_ADDRESSES,
    SNIPPET_PATH,
    guard_program,
    guard_script,
    vm_snippet,
    with_guard,
)
from services.providers.cloud.pure.settings import CloudSettings, check_cloud_settings
from services.providers.cloud.pure.userdata import squid_script
from services.providers.gcp.config import GcpConfig
from services.providers.kubernetes.config import KubernetesConfig
from services.providers.kubernetes.pure import mapping
from services.providers.local import LocalConfig
from services.providers.local_process import squid_config as local_squid_config
from services.providers.pure.targets import AllowedTarget, target_lines, targets_problem
from services.providers.squidauth.pure.cloudinit import KEY_PATH, lease_script

BAD_TARGETS = [
    ({"cidr": "10.0.0.1/8", "ports": [80]}, "allowedTargets[0].cidr: '10.0.0.1/8' is not a CIDR"),
    ({"cidr": "intranet", "ports": [80]}, "e.g. 10.20.0.0/16"),
    ({"cidr": "169.254.0.0/24", "ports": [80]}, "overlaps 169.254.0.0/16"),
    ({"cidr": "0.0.0.0/0", "ports": [443]}, "overlaps 169.254.0.0/16"),
    ({"cidr": "fd00:ec2::/64", "ports": [80]}, "overlaps fd00:ec2::254/128"),
    ({"cidr": "fe80::/64", "ports": [80]}, "overlaps fe80::/10"),
    ({"cidr": "::ffff:10.0.0.0/104", "ports": [80]}, "write the IPv4 range itself"),
    ({"cidr": "10.0.0.0/8", "ports": []}, "allowedTargets[0].ports is empty"),
    ({"cidr": "10.0.0.0/8", "ports": [0]}, "allowedTargets[0].ports: 0 is not a port"),
    ({"cidr": "10.0.0.0/8", "ports": [65536]}, "65536 is not a port"),
    ({"cidr": "10.0.0.0/8", "ports": ["90-80"]}, "(low first)"),
    ({"cidr": "10.0.0.0/8", "ports": ["http"]}, "'http' is not a port or a port range"),
]


def targets(*raw: dict[str, Any]) -> tuple[AllowedTarget, ...]:
    return msgspec.convert(list(raw), tuple[AllowedTarget, ...])


@pytest.mark.parametrize(("raw", "problem"), BAD_TARGETS)
def test_each_bad_target_is_named_with_its_fix(raw: dict[str, Any], problem: str) -> None:
    assert problem in targets_problem(targets(raw))


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"cidr": "10.0.0.0/8", "ports": [True]}, "ports"),
        ({"cidr": "10.0.0.0/8", "ports": [80.0]}, "ports"),
        ({"cidr": "10.0.0.0/8", "port": [80]}, "port"),
        ({"cidr": 10, "ports": [80]}, "cidr"),
        ({"ports": [80]}, "cidr"),
    ],
)
def test_wrong_types_are_refused_by_field_without_coercion(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=field):
        targets(raw)


BLOCKS: list[tuple[type[msgspec.Struct], dict[str, Any]]] = [
    (LocalConfig, {}),
    (KubernetesConfig, {}),
    (CloudSettings, {"allowedClients": ["203.0.113.0/24"]}),
    (GcpConfig, {"project": "my-project"}),
]


@pytest.mark.parametrize(("block", "base"), BLOCKS)
def test_every_provider_block_refuses_a_bad_target_by_name(
    block: type[msgspec.Struct], base: dict[str, Any]
) -> None:
    bad = {**base, "allowedTargets": [{"cidr": "169.254.169.254/32", "ports": [80]}]}
    if block is CloudSettings:
        settings = msgspec.convert(bad, CloudSettings)
        assert "allowedTargets[0].cidr" in check_cloud_settings(settings)
    else:
        with pytest.raises(msgspec.ValidationError, match=r"allowedTargets\[0\]\.cidr"):
            msgspec.convert(bad, block)
    good = {**base, "allowedTargets": [{"cidr": "10.20.0.0/16", "ports": [80, "8000-8099"]}]}
    assert msgspec.convert(good, block)


def rules(config: str) -> list[str]:
    return [line for line in config.splitlines() if line.startswith(("acl egress_", "http_access"))]


def test_every_provider_config_refuses_before_it_allows() -> None:
    local = local_squid_config(Path("/x"), 20001, "px", None)
    kube = mapping.squid_config(KubernetesConfig(), "px")
    cloud = squid_script(msgspec.convert({"allowedClients": ["0.0.0.0/0"]}, CloudSettings), "px")
    snippet = vm_snippet(())
    for config in (local, kube, cloud, snippet):
        lines = rules(config)
        for deny in (
            "http_access deny egress_to_metadata_name",
            "http_access deny egress_to_link_local",
            "http_access deny egress_to_metadata",
            "http_access deny egress_connect !egress_connect_ports",
        ):
            assert deny in lines, (deny, config)
        allows = [i for i, line in enumerate(lines) if line.startswith("http_access allow")]
        denies = [i for i, line in enumerate(lines) if "deny egress_" in line]
        assert not allows or max(denies) < min(allows)
        assert "request_header_access Cache-Control deny !egress_client_cache_control" in config
        assert "via off" in config.splitlines()
        assert "forwarded_for delete" in config.splitlines()
    # Only the local provider lets plain HTTP reach loopback; every VM refuses its own host.
    assert "http_access deny egress_to_inside !egress_to_loopback" in rules(local)
    for config in (kube, cloud, snippet):
        assert "http_access deny egress_to_inside" in rules(config)
    for config in (cloud, snippet):
        assert f'acl egress_to_own_host dst "{OWN_ADDRESSES}"' in config
    assert "cache deny all" in snippet.splitlines()  # Debian's squid.conf caches otherwise


def test_listed_targets_become_one_acl_each_and_lift_only_the_inside_and_port_rules() -> None:
    lines = target_lines(targets({"cidr": "10.20.0.0/16", "ports": [80, "8000-8099"]}))
    assert "acl egress_target_1_net dst 10.20.0.0/16" in lines
    assert "acl egress_target_1_ports port 80 8000-8099" in lines
    assert "acl egress_target_1 all-of egress_target_1_net egress_target_1_ports" in lines
    assert "http_access deny egress_to_inside !egress_listed" in lines
    assert "http_access deny egress_connect !egress_connect_ports !egress_listed" in lines
    assert "http_access deny egress_to_link_local" in lines  # never lifted


def test_the_guard_refuses_link_local_to_squids_user_except_dns_and_runs_at_every_start() -> None:
    program = guard_program()
    assert "meta skuid $uid ip daddr $r udp dport 53 accept" in program
    assert "meta skuid $uid ip daddr $r tcp dport 53 accept" in program
    assert "meta skuid $uid ip daddr 169.254.0.0/16 reject" in program
    assert "meta skuid $uid ip6 daddr { fe80::/10, fd00:ec2::254 } reject" in program
    assert program.index("dport 53 accept") < program.index("169.254.0.0/16 reject")
    assert '-m owner --uid-owner "$uid" -j EGRESS_PROXIES' in program
    assert 'iptables -w -A EGRESS_PROXIES -d "$r" -p udp --dport 53 -j ACCEPT' in program
    assert "iptables -w -A EGRESS_PROXIES -d 169.254.0.0/16 -j REJECT" in program
    assert "ip6tables -w -A EGRESS_PROXIES -d fd00:ec2::254 -j REJECT" in program
    assert "Squid stays stopped" in program
    assert "exit 1" in program
    script = guard_script((), snippet=False)
    assert f"ExecStartPre=/bin/sh {GUARD_PATH}" in script
    assert DROP_IN_PATH in script
    assert SNIPPET_PATH not in script
    assert SNIPPET_PATH in guard_script((), snippet=True)


def test_gcp_and_kvm_user_data_gets_the_guard_part_with_the_rules() -> None:
    own = "#cloud-config\npackages: [squid]\n"
    message = email.parser.Parser(policy=email.policy.default).parsestr(
        with_guard(own, targets({"cidr": "10.20.0.0/16", "ports": [80]}), snippet=True)
    )
    parts = {str(p.get_filename()): str(p.get_content()) for p in message.iter_parts()}
    assert parts["part-001"] == own
    assert "acl egress_target_1_net dst 10.20.0.0/16" in parts["zx-egress-guard.sh"]


def test_the_lease_key_is_the_helper_users_alone() -> None:
    script = lease_script("ab" * 32, "print('helper')\n")
    assert f'chown "$user:$(id -gn "$user")" {KEY_PATH}' in script
    assert f"chmod 0400 {KEY_PATH}" in script
    assert script.index("umask 077") < script.index(f"> {KEY_PATH}")


def test_a_refusal_by_the_proxy_is_told_from_a_site_that_refuses() -> None:
    page = b"<html>...<!-- ERR_ACCESS_DENIED -->\n</html>"
    assert refused_by_proxy("bad_status", 403, page)
    assert not refused_by_proxy("bad_status", 403, b"<html>Forbidden by the site</html>")
    assert not refused_by_proxy("bad_status", 404, page)
    assert refused_by_proxy("tunnel_refused", 0, detail="CONNECT 10.0.0.1:443: HTTP 403")
    assert not refused_by_proxy("tunnel_refused", 0, detail="CONNECT 10.0.0.1:443: HTTP 503")
    message = refused_message("HTTP 403", "http://10.1.2.3/", "spec.healthCheck.url")
    assert "refuse http://10.1.2.3/" in message
    assert "allowedTargets" in message
    assert "spec.healthCheck.url" in message
