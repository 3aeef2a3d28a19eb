"""``aurora bench transfer`` and ``catchup``: moving versions between regions and to lagging actors."""
