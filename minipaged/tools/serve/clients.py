"""Each client's service, as the dashboard and /metrics show it: a name for each client
(its address, and for a key a salted hash of it: the page and /metrics are public, so
never the key) and the tokens a request that left was served. The server names clients
(address and key, or what a trusted proxy forwards) as the fair waiting order counts
them; these names only show them.
"""

from __future__ import annotations

import hashlib
import ipaddress
import secrets

# clients told apart (a room is about 40); later ones are counted as OTHER
MAX_CLIENTS = 64
OTHER = "other"
# drawn at start: a key's hash on the page cannot test guesses of the key
SALT = secrets.token_bytes(16)


def client_name(client: str) -> str:
    """How a client is shown: 'address', or 'address #3fa2c1' when it sent a key (six
    hex digits of a hash salted at start: the same key, the same digits while the server
    runs); '(none)' for the engine's unnamed client (LLM.generate)."""
    address, _, key = client.partition(" ")
    key = key.removeprefix("Bearer ").strip()
    if not key:
        return address or "(none)"
    return (
        f"{address}"
        f" #{hashlib.blake2b(key.encode(), key=SALT, digest_size=3).hexdigest()}"
    )


class ClientNames:
    """The names of at most `limit` clients, in the order they came; every later client
    is OTHER, so a room (or a client inventing keys) cannot grow the page or /metrics
    for ever.
    """

    def __init__(self, limit: int = MAX_CLIENTS):
        self.limit = limit
        # client (the server's name for it) -> its name on the page
        self.known: dict[str, str] = {}

    def of(self, client: str) -> str:
        """The name of `client` (given on first sight while there is room, else
        OTHER)."""
        if client not in self.known and len(self.known) < self.limit:
            self.known[client] = client_name(client)
        return self.known.get(client, OTHER)

    def rank(self, name: str) -> int:
        """Where a name comes in arrival order (OTHER last): the dashboard's row
        order."""
        names = list(self.known.values())
        return names.index(name) if name in names else len(names)


def served_tokens(output, stream) -> tuple[int, int]:
    """(prompt, output) tokens a request that left was served: its prompt once if it ran
    at all (a refused request, or one aborted while it waited, was served none), and
    every sample's
    tokens. `stream` is the engine loop's record of it (None outside a server)."""
    ran = (
        stream.first_token is not None
        if stream is not None
        else any(c.token_ids for c in output.outputs)
    )
    return (len(output.prompt_token_ids) if ran else 0), sum(
        len(c.token_ids) for c in output.outputs
    )


class TrustedProxies:
    """--forwarded-allow-ips (uvicorn's name): the proxies whose word on who the client
    is the server takes. Behind a router every request comes from the router's address,
    so the per-client bound and the fair order would see one client; a request from an
    address in `allowed` (addresses, networks such as 10.0.0.0/8, or "*" for any) is
    counted instead as the right-most X-Forwarded-For hop that is no trusted proxy, and,
    when its body names OpenAI's `user`, as that user of it. Empty (the default): the
    client is the connection's own address, whatever the headers say.
    """

    def __init__(self, allowed=()):
        self.any = "*" in allowed
        self.networks = [network(a) for a in allowed if a != "*"]

    def trusts(self, address: str) -> bool:
        if self.any:
            return True
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:  # not an address: a name is never trusted
            return False
        return any(ip in net for net in self.networks)

    def client(self, peer: str, forwarded_for: str, user) -> tuple[str, str]:
        """(address, user) of a request that came from `peer` with an X-Forwarded-For
        header `forwarded_for` and a body whose `user` is `user`: the peer and no user
        unless the peer is trusted."""
        if not self.trusts(peer):
            return peer, ""
        address = peer
        hops = [hop.strip() for hop in forwarded_for.split(",") if hop.strip()]
        for hop in reversed(hops):  # each proxy appends the address it saw
            if not is_address(hop):
                break  # a hop that is no address: the chain cannot be read further
            address = hop
            if not self.trusts(hop):
                break
        if not isinstance(user, str):
            user = ""
        return address, user[:MAX_USER]


# a `user` field is an identifier (OpenAI: "a unique identifier for your end-user")
MAX_USER = 256


def is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def network(text: str):
    """One entry of --forwarded-allow-ips: an address or a network (CIDR), or a
    ValueError naming it."""
    try:
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise ValueError(
            f"{text!r} is not an IP address or network: write e.g. 127.0.0.1,"
            " 10.0.0.0/8 or * (any proxy)"
        ) from None
