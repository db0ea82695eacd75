# Sourced by the bash server tests: starts `dsv4 serve` on a free loopback
# port and cleans up on exit. Needs BIN, MODEL; sets WORK, SERVER_PID, PORT, URL.
WORK="$(mktemp -d)"
SERVER_PID=""
cleanup() {
  if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# start_server [extra serve flags...]
start_server() {
  [ -x "$BIN" ] || { echo "FAIL: no dsv4 binary at $BIN"; exit 1; }
  [ -f "$MODEL/config.json" ] || { echo "FAIL: no test model in $MODEL (dsv4 make-model --out $MODEL)"; exit 1; }
  # The files exist before the server starts: the background job opens its
  # redirections asynchronously, and the first sed below may run first.
  : >"$WORK/server.out"
  : >"$WORK/server.err"
  OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}" "$BIN" serve --model-path "$MODEL" --host 127.0.0.1 --port 0 "$@" \
    >"$WORK/server.out" 2>"$WORK/server.err" &
  SERVER_PID=$!
  PORT=""
  for _ in $(seq 600); do
    PORT="$(sed -n 's|.*on http://127\.0\.0\.1:\([0-9]*\) (OpenAI API at /v1).*|\1|p' "$WORK/server.out")"
    [ -n "$PORT" ] && break
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "FAIL: server exited"; cat "$WORK/server.err"; exit 1; }
    sleep 0.1
  done
  [ -n "$PORT" ] || { echo "FAIL: server did not start"; cat "$WORK/server.err"; exit 1; }
  URL="http://127.0.0.1:$PORT"
  echo "server on $URL"
}
