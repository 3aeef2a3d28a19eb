"""The link table of the four-regions world: where each region is, who feeds it, and what its link carries.

Home and four rollout regions, each on a provider and in a location; every region is fed over one
emulated WAN link, from home in the star topology or from its ``tree_source`` in the relay tree. A
link's bandwidth and RTT are the table's, per (source, destination) pair; the provider and location of
both ends decide what a byte on it costs (`bench.emulation.egress`). Emulation: the links are
`bench.emulation.wan` proxies.
"""

from __future__ import annotations

from dataclasses import dataclass

HOME = "home"
TOPOLOGIES = ("star", "tree")


@dataclass(frozen=True, kw_only=True, slots=True)
class Site:
    """Home or a rollout region: its cloud, where it is, and how its bucket is reached."""

    name: str
    provider: str
    """``aws`` or ``gcp``."""
    location: str
    """The provider's region name (for the reader and the price table's continent)."""
    continent: str
    scheme: str = "s3"
    """``s3`` (a moto server) or ``gs`` (fake-gcs-server)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Hop:
    """One emulated WAN link: bytes flow from ``source`` down to ``dest``."""

    source: str
    dest: str
    bandwidth_bps: float
    rtt_s: float

    @property
    def name(self) -> str:
        return f"{self.source}->{self.dest}"


SITES = (
    Site(name=HOME, provider="aws", location="us-east-1", continent="north-america"),
    Site(name="us-west", provider="aws", location="us-west-2", continent="north-america"),
    Site(name="eu-west", provider="aws", location="eu-west-1", continent="europe"),
    Site(name="ap-south", provider="aws", location="ap-south-1", continent="asia"),
    Site(name="gcp-eu", provider="gcp", location="europe-west4", continent="europe", scheme="gs"),
)
"""Home (AWS us-east-1) and four rollout regions; ``gcp-eu`` is across clouds, on GCS."""

HOPS = (
    Hop(source=HOME, dest="us-west", bandwidth_bps=10e9, rtt_s=0.065),
    Hop(source=HOME, dest="eu-west", bandwidth_bps=2e9, rtt_s=0.075),
    Hop(source=HOME, dest="ap-south", bandwidth_bps=0.25e9, rtt_s=0.19),
    Hop(source=HOME, dest="gcp-eu", bandwidth_bps=1e9, rtt_s=0.09),
    Hop(source="eu-west", dest="gcp-eu", bandwidth_bps=5e9, rtt_s=0.012),
)
"""Every link either topology uses. Bandwidths are what one run gets on a path, not a NIC's rate: the
0.25 Gbps one is the slow far region; home -> gcp-eu crosses clouds over the internet; eu-west ->
gcp-eu is a short hop inside Europe (across clouds too)."""

TREE_SOURCES = {"gcp-eu": "eu-west"}
"""In the relay tree, regions fed from another region rather than from home (as ``relay --source`` allows)."""


def site(name: str) -> Site:
    for s in SITES:
        if s.name == name:
            return s
    raise KeyError(f"no site {name!r} in the link table")


def regions() -> list[Site]:
    return [s for s in SITES if s.name != HOME]


def source_of(region: str, topology: str) -> str:
    """Where ``region``'s relay copies from in ``topology``."""
    if topology not in TOPOLOGIES:
        raise ValueError(f"topology must be one of {TOPOLOGIES}, got {topology!r}")
    return TREE_SOURCES.get(region, HOME) if topology == "tree" else HOME


def hop(source: str, dest: str) -> Hop:
    for h in HOPS:
        if (h.source, h.dest) == (source, dest):
            return h
    raise KeyError(f"no link {source} -> {dest} in the link table")


def hops_for(topology: str) -> list[Hop]:
    """The links a topology's relays use, one per region, in region order."""
    return [hop(source_of(r.name, topology), r.name) for r in regions()]


def depth_order(topology: str) -> list[str]:
    """Regions with every region after its source (relays backfill in this order)."""
    out: list[str] = []
    pending = [r.name for r in regions()]
    while pending:
        for name in list(pending):
            src = source_of(name, topology)
            if src == HOME or src in out:
                out.append(name)
                pending.remove(name)
    return out


def table() -> list[dict[str, object]]:
    """The link table for the JSON."""
    return [
        {
            "link": h.name,
            "source": h.source,
            "dest": h.dest,
            "bandwidth_bps": h.bandwidth_bps,
            "rtt_s": h.rtt_s,
            "source_site": f"{site(h.source).provider}:{site(h.source).location}",
            "dest_site": f"{site(h.dest).provider}:{site(h.dest).location}",
            "star": source_of(h.dest, "star") == h.source,
            "tree": source_of(h.dest, "tree") == h.source,
        }
        for h in HOPS
    ]
