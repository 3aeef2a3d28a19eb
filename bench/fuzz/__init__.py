"""``aurora bench fuzz``: every parser of outside bytes under seeded mutations."""
