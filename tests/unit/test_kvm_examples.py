"""The kvm examples in deploy/examples parse and pass the same checks as a real config."""

from __future__ import annotations

from pathlib import Path

import msgspec
import yaml

from events.proxyresource import from_object, validate
from services.providers.config import parse_providers_config
from services.providers.kvm.pure.config import (
    KvmConfig,
    resolve_placement,
    validate_kvm_config,
)

EXAMPLES = Path(__file__).parents[2] / "deploy" / "examples"


def test_the_kvm_providers_example_is_a_valid_config(tmp_path: Path) -> None:
    raw = yaml.safe_load((EXAMPLES / "providers-kvm.yaml").read_text())
    entries = parse_providers_config(
        raw, source="providers-kvm.yaml", base_dir=tmp_path, default_data_dir=tmp_path
    )
    assert [(e.name, e.type) for e in entries] == [("homelab", "kvm")]
    config = entries[0].config
    assert isinstance(config, KvmConfig)
    validate_kvm_config(config)
    assert [h.name for h in config.hosts] == ["hv1", "hv2"]


def test_the_kvm_proxy_example_places_onto_the_providers_example(tmp_path: Path) -> None:
    raw = yaml.safe_load((EXAMPLES / "providers-kvm.yaml").read_text())
    config = msgspec.convert(raw["providers"][0]["kvm"], KvmConfig)
    resource = from_object(yaml.safe_load((EXAMPLES / "kvm-proxy.yaml").read_text()))
    assert validate(resource) == []
    assert resource.spec.provider == "homelab"
    placement = resource.spec.placement
    assert placement is not None
    chosen = resolve_placement(config, placement.zone, placement.machine_type, placement.image)
    assert chosen.host.name == "hv2"
    assert chosen.host.pool == "fast"
    assert chosen.machine_type.memory_mib == 1024
    assert chosen.image_key == "debian-12"
    assert resource.spec.cloud_init is not None
    assert "qemu-guest-agent" in resource.spec.cloud_init.inline
