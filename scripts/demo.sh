#!/usr/bin/env bash
# Quick start (`make demo`): the pieces of the main job on the embedded SQLite default.
#  1. classify and render a real OpenTofu plan (destructive changes first, secrets masked);
#  2. start the control plane on loopback with its embedded SQLite store;
#  3. post an execution's events to it as a runner does, and read them back.
# The `run plan` driver that strings these together over terramate is coming with the CLI issue.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=./bin/tfstackplan
work=$(mktemp -d)
pid=""
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

"$bin" version
echo
echo "== 1. render a plan with a replace, a delete, an update and a create"
"$bin" render --plan testdata/tofu/mixed/plan.json --stack network --format text --color never
echo
echo "== 2. control plane on 127.0.0.1 with SQLite at $work/tfstackplan.db"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin" serve --listen "127.0.0.1:$port" --db "sqlite:$work/tfstackplan.db" --insecure-no-auth >"$work/serve.log" 2>&1 &
pid=$!
url="http://127.0.0.1:$port"
for _ in $(seq 50); do
  curl -fsS "$url/healthz" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -fsS "$url/api/v1/health"; echo
echo
echo "== 3. a runner's events, then the execution as the server stores it"
post() { curl -fsS -H 'Content-Type: application/json' -d "$2" "$url/api/v1/events/$1" >/dev/null; }
post init '{"execution_id":"demo-1","environment":"nonprod","op":"plan","pr":1,"stacks":["network"]}'
post phase '{"execution_id":"demo-1","stack":"network","phase":"plan","status":"started","seq":1}'
post log '{"execution_id":"demo-1","stack":"network","generation":0,"offset":0,"data":"'"$(printf 'tofu plan\nPlan: 1 to add, 1 to change, 1 to destroy.\n' | base64 | tr -d '\n')"'"}'
"$bin" render --plan testdata/tofu/mixed/plan.json --stack network --format json >"$work/render.json"
post update "$(python3 - "$work/render.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
s = r["stacks"][0]
print(json.dumps({"execution_id": "demo-1", "stack": "network", "seq": 2, "status": "succeeded",
                  "class": s["class"], "counts": {k: v for k, v in s["counts"].items() if v}}))
PY
)"
post finalize '{"execution_id":"demo-1","status":"succeeded"}'
curl -fsS "$url/api/v1/executions/demo-1" | python3 -m json.tool
echo
echo "Open $url/ in a browser for the live page (this demo stops the server on exit)."
