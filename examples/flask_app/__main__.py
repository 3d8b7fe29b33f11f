"""``python -m examples.flask_app``: create the app's table and serve it (Flask's server;
put gunicorn or similar in front for production). ``HOST``/``PORT`` choose the address.

The outbox must exist already (``delivery db upgrade``, with the same
``DELIVERY_DATABASE_URL``), and a worker, beat and a provider must run for the email to go
out: ``examples/flask_app/run.sh`` starts all of them."""

from __future__ import annotations

import os

from examples.flask_app.app import create_app, db

app = create_app()
with app.app_context():
    db.create_all()
app.run(host=os.environ.get("HOST", "127.0.0.1"), port=int(os.environ.get("PORT", "5000")))
