"""Django migrations of the unmanaged outbox models (state only, no DDL)."""
