"""``aurora bench codec`` and ``engine``: the delta codec on the reference trace, and a version inside an engine."""
