"""Flower settings for production: ``celery -A tasks flower --conf=deploy/flowerconfig.py``.

Flower executes this file as Python (tornado's ``parse_config_file``); every name set here is
a Flower option. Secrets come from the environment only, never from this file:

- ``FLOWER_BASIC_AUTH``: ``user:password`` (several separated by commas). Required: this
  config refuses to serve an unauthenticated dashboard, which could revoke or retry tasks,
  and refuses a password under 12 characters, equal to its user name, or a placeholder
  (``change-me``, ``password``, ``secret``, ...). ``python deploy/make_env.py DIR`` writes one.
- ``FLOWER_DB``: the file where Flower keeps its task history across restarts
  (default ``flower.db`` in the working directory; point it at a volume).
- ``FLOWER_PORT`` / ``FLOWER_ADDRESS``: where to listen (default ``5555`` on all addresses of
  the container; docker-compose.yml publishes it on the host's 127.0.0.1 only).

Flower keeps tasks in memory (``max_tasks``), so it is the live view; the outbox
(``delivery show KEY``) stays the record. Task ids are message keys, so the search box finds
a message by its key; task arguments are ``(message_id, key)`` only, never recipients.
Command-line options still win over this file (``--port=5556``).
"""

import os
from pathlib import Path

# The checks and columns `delivery flower` uses: one definition, in the package.
from delivery.cli.flower import TASKS_COLUMNS, password_problem

_credentials = [c.strip() for c in os.environ.get("FLOWER_BASIC_AUTH", "").split(",") if c.strip()]
if not _credentials:
    raise SystemExit(
        "deploy/flowerconfig.py: set FLOWER_BASIC_AUTH to user:password "
        "(several separated by commas); Flower will not run without authentication"
    )
for _n, _credential in enumerate(_credentials, start=1):
    _problem = password_problem(_credential)
    if _problem is not None:
        raise SystemExit(f"deploy/flowerconfig.py: FLOWER_BASIC_AUTH, entry {_n}: {_problem}")

basic_auth = _credentials
port = int(os.environ.get("FLOWER_PORT", "5555"))
address = os.environ.get("FLOWER_ADDRESS", "")

# Keep the task history across restarts: saved on shutdown and every state_save_interval ms.
persistent = True
db = os.environ.get("FLOWER_DB", "flower.db")
Path(db).parent.mkdir(parents=True, exist_ok=True)
state_save_interval = 60_000

max_tasks = 100_000
tasks_columns = TASKS_COLUMNS  # the uuid is the message key, args are (message_id, key)
natural_time = False
