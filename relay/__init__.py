"""AuroraRL relay role (arrives with its issue)."""
