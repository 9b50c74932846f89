"""Alembic migrations of the incident store (run by ``Database.create_schema``; `ruleloop db`)."""
