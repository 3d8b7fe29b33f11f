"""``python -m examples.flask_app``: create the app's tables and serve it (Flask's server;
put gunicorn or similar in front for production). ``HOST``/``PORT`` choose the address."""

from __future__ import annotations

import os

from examples.flask_app.app import create_app, db

app = create_app()
with app.app_context():
    db.create_all()
app.run(host=os.environ.get("HOST", "127.0.0.1"), port=int(os.environ.get("PORT", "5000")))
