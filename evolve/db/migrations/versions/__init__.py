"""Alembic revisions of evolve's schema (a package so wheels ship them)."""
