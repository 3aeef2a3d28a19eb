"""``aurora bench e2e``: RL step time with deltas and relays against full broadcast and no transfer."""
