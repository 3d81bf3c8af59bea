"""Storage: table definitions, engine set-up, migrations and repository modules."""
