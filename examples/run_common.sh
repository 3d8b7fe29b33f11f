# Sourced by examples/*/run.sh from the repository's root: the part both examples share.
#
# It names one broker and one configuration for every process the example starts (a
# half-configured process would refuse to start): DELIVERY_BROKER_URL defaults to a file broker
# in $DELIVERY_HOME (./.delivery), and unless DELIVERY_CONFIG names your own file, every channel
# goes to the stub provider started on STUB_PORT (9090). `start CMD...` runs a process in the
# background; `start_services WORKER_ARGS...` starts the stub provider, a Celery worker and
# Celery beat. Ctrl-C (or any of them ending, with `wait -n`) stops them all: each gets SIGTERM,
# and one still running 20 s later (a worker whose warm shutdown hangs) is SIGKILLed with its
# pool's children.
STUB_PORT="${STUB_PORT:-9090}"
export DELIVERY_HOME="${DELIVERY_HOME:-.delivery}"
mkdir -p "$DELIVERY_HOME"
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

start() {
  "$@" &
  pids+=($!)
}

start_services() {
  start delivery stub-provider --port "$STUB_PORT"
  start celery -A tasks worker --loglevel INFO "$@"
  start celery -A tasks beat --loglevel INFO -s "$DELIVERY_HOME/celerybeat-schedule"
}
