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
STUB_PORT="${STUB_PORT:-9090}"
export DELIVERY_HOME="${DELIVERY_HOME:-.delivery}"
mkdir -p "$DELIVERY_HOME"
# Named for every process here (app, worker, beat), so that all of them share one outbox and
# one broker: a half-configured process would refuse to start.
export DELIVERY_DATABASE_URL="${DELIVERY_DATABASE_URL:-sqlite:///$(cd "$DELIVERY_HOME" && pwd)/outbox.sqlite3}"
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
delivery stub-provider --port "$STUB_PORT" &
pids+=($!)
# The thread pool suits the embedded SQLite outbox; on PostgreSQL the default pool works too.
celery -A tasks worker --loglevel INFO --pool threads --concurrency 4 &
pids+=($!)
celery -A tasks beat --loglevel INFO -s "$DELIVERY_HOME/celerybeat-schedule" &
pids+=($!)
HOST=127.0.0.1 PORT="$PORT" python -m examples.flask_app &
pids+=($!)
echo "run.sh: the app is starting on http://127.0.0.1:$PORT (Ctrl-C stops everything)"
wait -n  # one of them ended: stop the others
