"""The proxy's namespace and name on its instance, fitted to each cloud's grammar
(docs/decisions/0147-the-cli-as-one-language.md): whatever the names, every cloud accepts what
is sent (its own check, the one its provider runs before a create, says so), and a name that
fits already is sent as it is."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from services.providers.aws.pure import mapping as aws
from services.providers.base import NAME_LABEL, NAMESPACE_LABEL
from services.providers.digitalocean.pure import mapping as do
from services.providers.gcp.pure import mapping as gcp
from services.providers.hetzner.pure import mapping as hetzner
from services.providers.kvm.pure.domain import DomainSpec, domain_xml, parse_metadata

NAMES = st.text(min_size=0, max_size=300)
"""Anything: a Kubernetes name may hold dots and be 253 long; the fitting must not rely on the
CLI's stricter names."""


def test_a_name_that_fits_is_sent_as_it_is() -> None:
    assert (
        aws.instance_tags("px", "u", "aws-eu", "", namespace="crawl", proxy_name="de-1")[NAME_LABEL]
        == "de-1"
    )
    assert gcp.identity("crawl", "de-1") == {NAMESPACE_LABEL: "crawl", NAME_LABEL: "de-1"}
    assert "egress-proxies-name:de-1" in do.droplet_tags(
        "do", "u", "", namespace="crawl", proxy_name="de-1"
    )
    labels = hetzner.server_labels("hz", "u", "", namespace="crawl", proxy_name="de-1")
    assert (labels[NAMESPACE_LABEL], labels[NAME_LABEL]) == ("crawl", "de-1")


def test_what_a_cloud_refuses_is_replaced_and_cut() -> None:
    assert gcp.identity("Crawl", "Shop.DE_1") == {
        NAMESPACE_LABEL: "crawl",
        NAME_LABEL: "shop-de_1",
    }
    assert gcp.identity("crawl", "a" * 70)[NAME_LABEL] == "a" * 63
    assert "egress-proxies-name:shop-de" in do.identity_tags("crawl", "Shop.DE")
    labels = hetzner.server_labels("hz", "u", "", namespace="-crawl-", proxy_name="x.y/z")
    assert (labels[NAMESPACE_LABEL], labels[NAME_LABEL]) == ("crawl", "x.y-z")
    # Nothing left: no label rather than an empty one.
    assert NAME_LABEL not in hetzner.server_labels("hz", "u", "", namespace="n", proxy_name="..")


@given(namespace=NAMES, name=NAMES)
def test_every_cloud_accepts_what_is_sent(namespace: str, name: str) -> None:
    tags = aws.instance_tags("px", "u", "aws-eu", "h", namespace=namespace, proxy_name=name)
    assert aws.tag_problem(tags) == ""
    for value in gcp.identity(namespace, name).values():
        assert gcp.label_value(value) == value
    for tag in do.identity_tags(namespace, name):
        assert do.TAG.match(tag), tag
    labels = hetzner.server_labels("hz", "u", "h", namespace=namespace, proxy_name=name)
    assert hetzner.bad_label(labels) is None


def domain(namespace: str, name: str) -> str:
    return domain_xml(
        DomainSpec(
            name="px-vm",
            vcpus=1,
            memory_mib=512,
            domain_type="qemu",
            pool="proxies",
            disk_volume="px-vm.qcow2",
            seed_volume="px-vm-seed.iso",
            bridge="br0",
            owner_uid="u-1",
            created_at=datetime(2026, 12, 7, tzinfo=UTC),
            namespace=namespace,
            proxy_name=name,
        )
    )


def test_a_kvm_domain_carries_them_in_its_metadata_and_title() -> None:
    xml = domain("crawl", "de-1")
    assert "<title>crawl/de-1</title>" in xml
    meta = parse_metadata(xml)
    assert meta is not None
    assert (meta.owner_uid, meta.namespace, meta.proxy_name) == ("u-1", "crawl", "de-1")


@given(namespace=NAMES, name=NAMES)
def test_a_kvm_domain_reads_back_whatever_the_names(namespace: str, name: str) -> None:
    meta = parse_metadata(domain(namespace, name))
    assert meta is not None
    assert meta.owner_uid == "u-1"
    assert "\n" not in meta.namespace + meta.proxy_name
