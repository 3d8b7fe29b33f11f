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
STUB_PORT="${STUB_PORT:-9090}"
export DJANGO_DEBUG="${DJANGO_DEBUG:-1}"
export DELIVERY_HOME="${DELIVERY_HOME:-.delivery}"
mkdir -p "$DELIVERY_HOME"
# Every process here (runserver, worker, beat) shares this broker: a file broker in
# $DELIVERY_HOME unless you name another.
export DELIVERY_BROKER_URL="${DELIVERY_BROKER_URL:-filesystem://}"
if [ -z "${DELIVERY_CONFIG:-}" ]; then
  export DELIVERY_CONFIG="$DELIVERY_HOME/example.toml"
  printf '[providers.stub]\nkind = "http"\nbase_url = "http://127.0.0.1:%s"\n' "$STUB_PORT" \
    >"$DELIVERY_CONFIG"
fi

pids=()
stop() {
  trap - EXIT INT TERM
  if [ "${#pids[@]}" -gt 0 ]; then
    kill "${pids[@]}" 2>/dev/null || true
    # A worker whose warm shutdown hangs must not outlive Ctrl-C: 20 s, then SIGKILL (and
    # its pool's children).
    for _ in $(seq 40); do
      alive=0
      for pid in "${pids[@]}"; do if kill -0 "$pid" 2>/dev/null; then alive=1; fi; done
      [ "$alive" = 1 ] || break
      sleep 0.5
    done
    for pid in "${pids[@]}"; do
      pkill -KILL -P "$pid" 2>/dev/null || true
      kill -KILL "$pid" 2>/dev/null || true
    done
  fi
  wait || true
}
trap stop EXIT INT TERM

delivery db upgrade
python examples/django_app/manage.py migrate --no-input
delivery stub-provider --port "$STUB_PORT" &
pids+=($!)
celery -A tasks worker --loglevel INFO &
pids+=($!)
celery -A tasks beat --loglevel INFO -s "$DELIVERY_HOME/celerybeat-schedule" &
pids+=($!)
python examples/django_app/manage.py runserver --noreload "127.0.0.1:$PORT" &
pids+=($!)
echo "run.sh: the site is starting on http://127.0.0.1:$PORT (admin: /admin/; Ctrl-C stops everything)"
wait -n  # one of them ended: stop the others
