"""Storage: table definitions, engine set-up, migrations, repositories and the leader lock."""
