"""What a byte crossing a link costs: a per-GB list-price table for AWS and GCP, and dollars per 1,000 steps.

Cloud providers bill the source side of a transfer: AWS charges inter-region transfer out of the
source region and internet egress for bytes leaving AWS (to another cloud); GCP charges by the
pair of continents inside its network and internet egress (premium tier) for bytes leaving it.
The prices are list prices as known to the author of this table, not fetched (this machine cannot
browse): check them against the pages named in ``SOURCE`` before quoting a bill.
"""

from __future__ import annotations

from typing import Any

from bench.emulation.links import Site, site

GB = 1e9
"""Providers bill per GiB or GB depending on the page; the table uses 10^9 bytes (the difference is 7%)."""

SOURCE = {
    "as_of": "2026 (list prices as known; not fetched: this machine has no web access)",
    "checked": False,
    "pages": [
        "https://aws.amazon.com/ec2/pricing/on-demand/#Data_Transfer",
        "https://aws.amazon.com/s3/pricing/ (Data transfer)",
        "https://cloud.google.com/vpc/network-pricing",
        "https://cloud.google.com/storage/pricing#network-egress",
    ],
    "note": "list prices as known, to be checked against the pages named; first pricing tier, no commitments, "
    "no free tier; a bench figure, not a quote",
}

PRICES_PER_GB = {
    "aws": {"inter_region": 0.02, "internet": 0.09},
    "gcp": {"same_continent": 0.02, "cross_continent": 0.05, "to_or_from_asia": 0.08, "internet": 0.12},
}
"""USD per GB. AWS: data transfer between regions $0.02/GB out of US/EU source regions; to the internet
$0.09/GB for the first 10 TB a month. GCP: inter-region within a continent ~$0.02/GB, between continents
$0.05/GB (NA<->EU) to $0.08/GB (to or from Asia); internet egress, premium tier, first TB ~$0.12/GB."""


def rate(source: Site, dest: Site) -> tuple[float, str]:
    """USD per GB for bytes from ``source`` to ``dest``, and which line of the table applies."""
    if source.provider != dest.provider:
        return PRICES_PER_GB[source.provider]["internet"], f"{source.provider} internet egress (across clouds)"
    if source.location == dest.location:
        return 0.0, "same region"
    if source.provider == "aws":
        return PRICES_PER_GB["aws"]["inter_region"], "aws inter-region"
    if source.continent == dest.continent:
        return PRICES_PER_GB["gcp"]["same_continent"], "gcp inter-region, same continent"
    if "asia" in (source.continent, dest.continent):
        return PRICES_PER_GB["gcp"]["to_or_from_asia"], "gcp inter-region, to or from asia"
    return PRICES_PER_GB["gcp"]["cross_continent"], "gcp inter-region, cross continent"


def dollars_per_1000_steps(source: str, dest: str, bytes_per_step: float) -> dict[str, Any]:
    usd_per_gb, line = rate(site(source), site(dest))
    return {
        "usd_per_gb": usd_per_gb,
        "price_line": line,
        "usd_per_1000_steps": bytes_per_step * 1000 / GB * usd_per_gb,
    }


def table() -> dict[str, Any]:
    """The price table and its provenance, for the JSON."""
    return {"usd_per_gb": PRICES_PER_GB, "gb_bytes": GB, "source": SOURCE}
