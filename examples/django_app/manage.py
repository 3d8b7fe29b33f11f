#!/usr/bin/env python
"""``python examples/django_app/manage.py migrate|runserver|createsuperuser`` (from the repo root).

The outbox tables come from ``delivery db upgrade``; ``migrate`` creates Django's own."""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django_app.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
