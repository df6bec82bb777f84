"""What `up` tells on stop about the local proxies it leaves running: a way that works for a pip
user, who has no Makefile (docs/decisions/0147-the-cli-as-one-language.md)."""

from __future__ import annotations

from services.cli.run.uplocal import still_running_note


def test_the_note_names_commands_every_install_has() -> None:
    note = still_running_note(2)
    assert note.startswith("2 local proxies keep running; the next `up` adopts them")
    assert "`egress-proxies delete --all` (while `up` runs)" in note
    assert "`egress-proxies local stop` (with the same --data-dir" in note
    assert "make" not in note
    assert still_running_note(0) == "no local proxies keep running"
