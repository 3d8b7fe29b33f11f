"""A Django project whose ``POST /signup/`` creates a user and enqueues a welcome email in the
same transaction, with the outbox's admin page at ``/admin/``."""
