"""AuroraRL actor role (arrives with its issue)."""
