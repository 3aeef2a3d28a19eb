"""The emulated world the transfer and e2e benchmarks run in: WAN links, regions, link prices, phases."""
