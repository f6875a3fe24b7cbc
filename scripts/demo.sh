#!/usr/bin/env bash
# Quick start (`make demo`): the main job for real, on your machine, with nothing faked.
#  1. finds terramate and tofu (or terraform), installing the pinned versions into
#     ~/.cache/tfstackplan-demo where missing (scripts/demo/tools.sh);
#  2. starts the control plane (`tfstackplan serve`) on 127.0.0.1, SQLite in a temporary
#     directory, with the policy of examples/demo/policy.hcl (destructive changes in prod need
#     an admin's grant) and a tokens file of two random tokens: the runner's and an admin's;
#  3. makes a throwaway git repository from examples/demo/main (six stacks in dev and prod) with
#     the script library of scripts/terramate, applies main, and commits the change of
#     examples/demo/branch.patch on a branch: prod creates, updates, replaces and deletes;
#  4. `tfstackplan run plan` for dev and prod against the server;
#  5. `tfstackplan run apply` for prod: refused by the gate, approved by an admin on the plan's
#     web page (scripts/demo/approve.sh sends the page's Approve form as a browser would; the
#     CLI equivalent is printed), applied; then dev, which is not gated;
#  6. serves the live pages until Ctrl-C.
#
# Environment: DEMO_NONINTERACTIVE=1 exits after the applies instead of serving;
# DEMO_KEEP=1 keeps the temporary directory; DEMO_BIN (default bin/tfstackplan, built when
# missing); DEMO_CACHE and DEMO_TOFU_URL (see scripts/demo/tools.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
example=$root/examples/demo
pr=1

# The demo's tools and runs see none of the caller's CI, tfstackplan, git or tofu settings.
unset "${!GITHUB_@}" RUNNER_TEMP TFSTACKPLAN_SERVER TFSTACKPLAN_TOKEN TFSTACKPLAN_AUDIENCE TFSTACKPLAN_AUTH
export CHECKPOINT_DISABLE=1 TF_IN_AUTOMATION=1 NO_COLOR=1
export GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1
export GIT_AUTHOR_NAME=demo GIT_AUTHOR_EMAIL=demo@example.com GIT_COMMITTER_NAME=demo GIT_COMMITTER_EMAIL=demo@example.com

work=$(mktemp -d "${TMPDIR:-/tmp}/tfstackplan-demo.XXXXXX")
pid=""
cleanup() {
  if [ -n "$pid" ]; then
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  if [ "${DEMO_KEEP:-}" = 1 ]; then echo "demo: kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
: >"$work/tofurc"
export TF_CLI_CONFIG_FILE=$work/tofurc
mkdir -p "$work/terramate.d" "$work/logs" "$work/results"
cat >"$work/terramate.rc" <<EOF
disable_checkpoint = true
disable_checkpoint_signature = true
disable_telemetry = true
user_terramate_dir = "$work/terramate.d"
EOF
export TM_CLI_CONFIG_FILE=$work/terramate.rc

step() { printf '\n== %s\n' "$*"; }
show() { printf '$ %s\n' "$*"; }

# 1. Tools.
step "1. tools"
# shellcheck source=scripts/demo/tools.sh
. "$root/scripts/demo/tools.sh"
demo_tools
bin=${DEMO_BIN:-$root/bin/tfstackplan}
case $bin in /*) ;; *) bin=$PWD/$bin ;; esac
if [ ! -x "$bin" ]; then
  echo "demo: building $bin"
  (cd "$root" && CGO_ENABLED=0 go build -trimpath -o "$bin" ./cmd/tfstackplan)
fi
# The scripts run `tfstackplan run tick`: it must be on PATH.
mkdir -p "$work/bin"
ln -s "$bin" "$work/bin/tfstackplan"
PATH="$work/bin:$PATH"
echo "demo: $(tfstackplan version)"

# 2. The control plane.
step "2. control plane: tfstackplan serve on 127.0.0.1, SQLite in $work"
# Two tokens, random for this run: the runner's (plans, applies) and the admin's (approvals).
token() { od -An -tx1 -N16 /dev/urandom | tr -d ' \n'; }
runner_token=demo-runner-$(token)
admin_token=demo-admin-$(token)
cat >"$work/tokens.hcl" <<EOF
token "runner" {
  secret    = "$runner_token"
  principal = "demo-runner"
  roles     = ["runner"]
}
token "admin" {
  secret    = "$admin_token"
  principal = "demo-admin"
  roles     = ["admin"]
}
EOF
show tfstackplan serve --listen 127.0.0.1:0 --db "sqlite:$work/tfstackplan.db" --tokens "$work/tokens.hcl" --policy examples/demo/policy.hcl
tfstackplan serve --listen 127.0.0.1:0 --db "sqlite:$work/tfstackplan.db" --tokens "$work/tokens.hcl" \
  --policy "$example/policy.hcl" >"$work/logs/serve.log" 2>&1 &
pid=$!
addr=""
for _ in $(seq 100); do
  addr=$(sed -n 's/.*msg=serving addr=\([^ ]*\).*/\1/p' "$work/logs/serve.log" | head -n 1)
  [ -n "$addr" ] && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if [ -z "$addr" ] || ! curl -fsS "http://$addr/healthz" >/dev/null; then
  echo "demo: the server did not start:" >&2
  cat "$work/logs/serve.log" >&2
  exit 1
fi
url=http://$addr
echo "demo: serving at $url (log: $work/logs/serve.log)"

# 3. The project: main applied, then a branch with the change.
step "3. project: a terramate repository from examples/demo/main, main applied, a branch with examples/demo/branch.patch"
repo=$work/repo
cp -R "$example/main" "$repo"
# The script library, installed as scripts/terramate/README.md says: its two files at the
# project root, the lines of its gitignore in .gitignore.
cp "$root/scripts/terramate/tfstackplan.tm.hcl" "$root/scripts/terramate/tfstackplan.scripts.tm.hcl" "$repo/"
cat "$root/scripts/terramate/gitignore" >>"$repo/.gitignore"
if [ "$demo_tf" = terraform ]; then
  sed -i.orig 's/tfstackplan_tf = "tofu"/tfstackplan_tf = "terraform"/' "$repo/tfstackplan.tm.hcl"
  rm -f "$repo/tfstackplan.tm.hcl.orig"
fi
cd "$repo"
git init -q -b main
git add -A
git commit -qm "demo infrastructure: dev and prod"
git init -q --bare -b main "$work/origin.git"
git remote add origin "$work/origin.git"
git push -q origin main
"$demo_tm" list | sed 's/^/  stack: /'
show terramate script run plan '&&' terramate script run apply "  # main, every stack (log: $work/logs/main-apply.log)"
if ! { "$demo_tm" script run plan && "$demo_tm" script run apply; } >"$work/logs/main-apply.log" 2>&1; then
  tail -n 40 "$work/logs/main-apply.log" >&2
  echo "demo: applying main failed (log above)" >&2
  exit 1
fi
echo "demo: main applied: $(grep -c 'Apply complete' "$work/logs/main-apply.log") stacks"
# A lock file init wrote is committed, as the library's README says (the built-in provider
# of terraform_data needs none, so normally there is nothing to commit).
locks=$(git ls-files --others --exclude-standard -- '*.terraform.lock.hcl')
if [ -n "$locks" ]; then
  echo "$locks" | xargs git add --
  git commit -qm "lock files"
  git push -q origin main
fi
if [ -n "$(git status --porcelain)" ]; then
  git status --short >&2
  echo "demo: the repository is not clean after the apply" >&2
  exit 1
fi
git checkout -q -b demo-change
git apply "$example/branch.patch"
git commit -qam "prod: add subnet_b, resize the db, replace the worker, drop legacy_cron; dev: 2 replicas"
git --no-pager show --stat --format='commit %h on branch demo-change: %s' HEAD | sed '/^$/d; s/^/  /'

export TFSTACKPLAN_SERVER=$url TFSTACKPLAN_TOKEN=$runner_token
# The server keys everything by repository; the demo's origin is a local path, which names none.
repo=example/demo
# run OP ENV [ARGS]: the driver with its full output in a log; prints its terminal summary and
# sets page to the execution's page URL. Returns the driver's exit code.
page=""
run() {
  local op=$1 env=$2 name=$1-$2 rc=0
  [ ! -e "$work/logs/$name.log" ] || name=$name-2
  shift 2
  show tfstackplan run "$op" --environment "$env" --pr "$pr" --repo "$repo" "$@" "  # full output: $work/logs/$name.log"
  tfstackplan run "$op" --environment "$env" --pr "$pr" --repo "$repo" --result "$work/results/$name.json" "$@" \
    >"$work/logs/$name.log" 2>&1 || rc=$?
  sed -n "/^tfstackplan $op $env: /,\$p" "$work/logs/$name.log"
  page=$(sed -n "s|^tfstackplan $op $env: [a-z-]* (\(http[^)]*\))\$|\1|p" "$work/logs/$name.log" | tail -n 1)
  if [ -z "$page" ]; then
    tail -n 30 "$work/logs/$name.log" >&2
    echo "demo: no execution page in the output of run $op $env" >&2
  fi
  return "$rc"
}

# 4. Plans.
step "4. plan the branch's changed stacks, per environment"
run plan dev || { echo "demo: run plan dev failed" >&2; exit 1; }
page_plan_dev=$page
echo
run plan prod || { echo "demo: run plan prod failed" >&2; exit 1; }
page_plan_prod=$page
echo
# The destructive stacks' plans in full, as `tfstackplan render` shows them (the summary names
# stacks by their repository paths).
sed -n '/^tfstackplan plan prod: /,$p' "$work/logs/plan-prod.log" | awk '$2 == "destructive" { print $3 }' | while read -r s; do
  show tfstackplan render --plan "$s/tfstackplan.plan.json" --stack "$s"
  tfstackplan render --plan "$s/tfstackplan.plan.json" --stack "$s" --format text --color never
done

# 5. The gated apply.
step "5. apply prod: the gate refuses the destructive plan until an admin approves it"
rc=0
run apply prod || rc=$?
page_apply_refused=$page
if [ "$rc" != 3 ]; then
  echo "demo: run apply prod exited $rc before any approval; want 3 (gate denied)" >&2
  exit 1
fi
echo "demo: prod apply refused by the gate (exit 3): $(sed -n 's/^gate: //p' "$work/logs/apply-prod.log")"
echo
# An admin opens the plan's page, signs in with their token, reviews each gate's stacks with
# their changes and content hashes, and presses Approve with a reason.
echo "demo: approval page: $page_plan_prod#approvals (an admin signs in there and presses Approve)"
# shellcheck source=scripts/demo/approve.sh
. "$root/scripts/demo/approve.sh"
demo_approve_on_page "$page_plan_prod" "$admin_token" demo "$work/cookies" || { echo "demo: approving on the page failed" >&2; exit 1; }
plan_prod_id=${page_plan_prod##*/}
echo "demo: approved: PR $pr in prod, reason \"demo\": the grant approves the content of plan $plan_prod_id, the PR's latest prod plan, printed above"
echo "demo: the same from the CLI: TFSTACKPLAN_TOKEN=<admin token> tfstackplan admin gates satisfy --repo $repo --environment prod --pr $pr --class destructive --target '**' --execution $plan_prod_id --reason demo"
echo
run apply prod || { echo "demo: run apply prod failed after the approval" >&2; exit 1; }
page_apply_prod=$page
echo "demo: prod apply succeeded"
for s in network db app; do
  echo "  stacks/prod/$s state: $(cd "stacks/prod/$s" && "$demo_tf" state list -no-color 2>/dev/null | tr '\n' ' ')"
done
step "5b. apply dev: its policy has no gate"
run apply dev || { echo "demo: run apply dev failed" >&2; exit 1; }
page_apply_dev=$page
echo "demo: dev apply succeeded"

# 6. The pages.
step "6. live pages"
code=$(curl -s -o /dev/null -w '%{http_code}' -b "$work/cookies" "$page_plan_prod")
echo "demo: live page $page_plan_prod answered HTTP $code"
[ "$code" = 200 ] || exit 1
cat <<EOF
  executions                $url/
  plan dev                  $page_plan_dev
  plan prod                 $page_plan_prod
  apply prod (refused)      $page_apply_refused
  apply prod (approved)     $page_apply_prod
  apply dev                 $page_apply_dev
  gates and grants          $url/ui/gates
  audit log                 $url/ui/audit
  admin token (sign in)     $admin_token
EOF
if [ "${DEMO_NONINTERACTIVE:-}" = 1 ]; then
  exit 0
fi
echo
echo "demo: serving at $url until Ctrl-C (the repository is $repo)"
trap 'echo; echo "demo: stopped"; exit 0' INT
wait "$pid"
