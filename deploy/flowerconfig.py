"""Flower settings for production: ``celery -A tasks flower --conf=deploy/flowerconfig.py``.

Flower executes this file as Python (tornado's ``parse_config_file``); every name set here is
a Flower option. Secrets come from the environment only, never from this file:

- ``FLOWER_BASIC_AUTH``: ``user:password`` (several separated by commas). Required: this
  config refuses to serve an unauthenticated dashboard, which could revoke or retry tasks.
- ``FLOWER_DB``: the file where Flower keeps its task history across restarts
  (default ``flower.db`` in the working directory; point it at a volume).
- ``FLOWER_PORT`` / ``FLOWER_ADDRESS``: where to listen (default ``5555`` on all addresses).

Flower keeps tasks in memory (``max_tasks``), so it is the live view; the outbox
(``delivery show KEY``) stays the record. Task ids are message keys, so the search box finds
a message by its key; task arguments are ``(message_id, key)`` only, never recipients.
Command-line options still win over this file (``--port=5556``).
"""

import os
from pathlib import Path

_credentials = [c.strip() for c in os.environ.get("FLOWER_BASIC_AUTH", "").split(",") if c.strip()]
if not _credentials or not all(":" in c for c in _credentials):
    raise SystemExit(
        "deploy/flowerconfig.py: set FLOWER_BASIC_AUTH to user:password "
        "(several separated by commas); Flower will not run without authentication"
    )

basic_auth = _credentials
port = int(os.environ.get("FLOWER_PORT", "5555"))
address = os.environ.get("FLOWER_ADDRESS", "")

# Keep the task history across restarts: saved on shutdown and every state_save_interval ms.
persistent = True
db = os.environ.get("FLOWER_DB", "flower.db")
Path(db).parent.mkdir(parents=True, exist_ok=True)
state_save_interval = 60_000

max_tasks = 100_000
# Columns of the tasks page: the uuid is the message key, args are (message_id, key).
tasks_columns = "name,uuid,state,args,retries,eta,exception,received,started,runtime,worker"
natural_time = False
