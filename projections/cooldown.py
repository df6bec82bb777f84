"""Whose cooldown it is: the rest after a lease protects the *next* client from inheriting what a
site has learnt about the proxy's address; the client whose lease it follows knows that already,
so it may lease the proxy again at once (docs/decisions/0153-a-client-takes-back-its-own-proxy.md).

Pure: the lease fold (``projections.lease``) asks it of every claim it judges, and the questions
asked of a view (``projections.lease_queries``) ask it for the request they answer, so that what
the API offers a client is what the fold will grant it.
"""

from __future__ import annotations

import msgspec


class Claimant(msgspec.Struct, frozen=True, kw_only=True):
    """Who asks for a proxy: the API client ("" when the API has no clients: the open mode)
    and the holder it names."""

    client: str = ""
    holder: str = ""


def follows(claimant: Claimant | None, client: str, holder: str) -> bool:
    """Whether the rest after a lease acquired by ``client`` for ``holder`` is ``claimant``'s
    own, so that it need not wait for it. A named client: the same client, whatever holder
    either names. The open mode (every caller is the client ""): the same non-empty holder too,
    so anonymous crawlers skip only their own rest; a holder is whatever a caller says, which
    lets an open caller take the rest of a holder it names, and nothing an open caller could not
    do already (it may release that holder's lease). None: nobody's own (the fleet's counts)."""
    if claimant is None or claimant.client != client:
        return False
    return bool(client) or (bool(holder) and claimant.holder == holder)
