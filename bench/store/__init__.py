"""``aurora bench full``, ``retention`` and ``state``: what the store costs a run."""
