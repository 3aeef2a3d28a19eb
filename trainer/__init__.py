"""AuroraRL trainer role (arrives with its issue)."""
