"""Use cases: the steps that join the database with the pure core (reports, evaluation, scrapes)."""
