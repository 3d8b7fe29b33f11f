#!/usr/bin/env bash
# The Django example, whole, in one terminal (README, "Django"). From a fresh clone:
#
#   python3 -m venv .venv && . .venv/bin/activate
#   pip install -e '.[django]'
#   export DELIVERY_DATABASE_URL=postgresql+psycopg://USER:PASSWORD@127.0.0.1:5432/DATABASE
#   examples/django_app/run.sh
#
# DELIVERY_DATABASE_URL is required: Django's DATABASES["default"] is built from it
# (examples/django_app/settings.py), and `delivery db upgrade`, the Celery worker and beat read
# it directly (they never see Django's settings). It migrates the outbox (`delivery db
# upgrade`) and Django's own tables (`manage.py migrate`), then runs the stub provider, a Celery
# worker, Celery beat and `manage.py runserver` until Ctrl-C, which stops them all. Unless
# DELIVERY_CONFIG names your own file, every channel goes to the stub provider started here.
# DJANGO_DEBUG defaults to 1 here: runserver serves the admin's CSS only in debug mode.
# PORT (8000) is the site's port, STUB_PORT (9090) the stub provider's.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${DELIVERY_DATABASE_URL:?set DELIVERY_DATABASE_URL to your PostgreSQL database (postgresql+psycopg://user:password@host:5432/name)}"
export DELIVERY_DATABASE_URL
PORT="${PORT:-8000}"
export DJANGO_DEBUG="${DJANGO_DEBUG:-1}"
. examples/run_common.sh

delivery db upgrade
python examples/django_app/manage.py migrate --no-input
start_services
start python examples/django_app/manage.py runserver --noreload "127.0.0.1:$PORT"
echo "run.sh: the site is starting on http://127.0.0.1:$PORT (admin: /admin/; Ctrl-C stops everything)"
wait -n  # one of them ended: stop the others
