"""``aurora bench chaos``: the whole system as real processes under a seeded schedule of faults."""
