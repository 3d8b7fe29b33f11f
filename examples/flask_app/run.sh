#!/usr/bin/env bash
# The Flask example, whole, in one terminal (README, "Flask"). From a fresh clone:
#
#   python3 -m venv .venv && . .venv/bin/activate
#   pip install -e '.[flask]'
#   examples/flask_app/run.sh
#
# It migrates the outbox (`delivery db upgrade`), then runs the stub provider, a Celery worker,
# Celery beat and the app until Ctrl-C, which stops them all. Every one of them reads the same
# environment: DELIVERY_DATABASE_URL (default: the embedded SQLite file in ./.delivery) holds
# the outbox and the app's users table, so that a user and their welcome email commit in one
# transaction; DELIVERY_BROKER_URL (default: a file broker in ./.delivery) carries the tasks.
# Unless DELIVERY_CONFIG names your own file, every channel goes to the stub provider started
# here. PORT (5000) is the app's port, STUB_PORT (9090) the stub provider's.
set -euo pipefail
cd "$(dirname "$0")/../.."
PORT="${PORT:-5000}"
. examples/run_common.sh
export DELIVERY_DATABASE_URL="${DELIVERY_DATABASE_URL:-sqlite:///$(cd "$DELIVERY_HOME" && pwd)/outbox.sqlite3}"

delivery db upgrade
# The thread pool suits the embedded SQLite outbox; on PostgreSQL the default pool works too.
start_services --pool threads --concurrency 4
start env HOST=127.0.0.1 PORT="$PORT" python -m examples.flask_app
echo "run.sh: the app is starting on http://127.0.0.1:$PORT (Ctrl-C stops everything)"
wait -n  # one of them ended: stop the others
