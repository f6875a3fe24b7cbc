#!/usr/bin/env bash
# Re-records, with a REAL OpenTofu, every tofu command the tfstackplan script library runs, into
# testdata/tofu/ (what testdata/faketofu replays and internal/tofutest checks it against).
#
#   scripts/capture/tofu.sh [TOFU_BINARY]        (default: $TFSTACKPLAN_TOFU)
#   scripts/capture/tofu.sh TOFU_BINARY CASE...  only these cases (nothing of _cli/ is recorded)
#   scripts/capture/tofu.sh TOFU_BINARY --render [CASE...]
#                                                the render scenarios of internal/plan/testdata/render
#                                                instead (each recorded as a staged case, below;
#                                                nothing of _cli/ is recorded)
#
# Needs: bash, a real `tofu` (the recordings are of 1.12.6, built from source by
# shared/tools/build-real-tools.sh, which reports itself as 1.12.6-dev), and `go` (it runs
# scripts/capture/httpstate, a tiny state server on 127.0.0.1, for one recording). No network:
# every configuration uses only the built-in terraform_data resource and no required_providers,
# so `tofu init` needs no registry. Takes about a minute. Re-run it after upgrading tofu and
# commit what changes (ids and timestamps always change: they are random or the clock).
#
# Every recording is four files in a directory of testdata/tofu/:
#   NAME.cmd     the argv, as one line `tofu ARG...` (run in the case's working directory)
#   NAME.stdout  what it printed on stdout, NAME.stderr on stderr, NAME.rc its exit code;
#                the temporary working directory is written as <tmp> (it appears nowhere today).
# The environment is cleaned (every TF_* variable unset, CHECKPOINT_DISABLE=1), stdin is
# /dev/null, and the file is always main.tf.
#
# Per case CASE (each directory with v1.tf and v2.tf): v1.tf is copied to main.tf, initialised and
# applied with -auto-approve (not recorded), v2.tf replaces it, then:
#   CASE/plan-out     plan -input=false -no-color -lock-timeout=0s -out=tfstackplan.tfplan
#   CASE/show-json    show -json tfstackplan.tfplan                     (when the plan succeeded)
#   CASE/apply        apply -input=false -no-color -lock-timeout=0s tfstackplan.tfplan
#   CASE/apply-again  the same apply again: rc 0 when the first apply did not change the state
#                     (then the saved plan is not stale), else "Saved plan is stale"
# The older CASE/plan.txt, plan.rc, plan.json (and error/plan.stderr) are kept as they are; the
# script reports whether the new plan-out/show-json still match them modulo ids and timestamps.
# A case without them (a new one) gets them from this recording: plan.rc is the plan's exit code,
# plan.txt its stdout up to the "Saved the plan" rule (trailing blank lines dropped), plan.json
# the show-json stdout.
#
# Staged cases: a case directory may also hold
#   v1b.tf        applied after v1 and expected to FAIL (e.g. a create_before_destroy replace
#                 whose provisioner fails, which leaves the old object deposed)
#   outside.json  copied into the working directory before v2 is planned: the test provider's
#                 objects change outside OpenTofu (see below)
#   plan.args     more plan arguments, on one line (e.g. -refresh-only)
# and a modules/ directory, copied next to main.tf (local modules need no registry),
# and its configuration may use the provider tfstackplan.test/test/simple: OpenTofu's own test
# provider (internal/provider-simple of OpenTofu v1.12.6) with a refresh that applies
# outside.json (scripts/capture/driftprovider/main.go.txt: an object whose value is a key of it
# gets the value it maps to, null: deleted outside). The script builds it from the OpenTofu
# source ($TFSTACKPLAN_OPENTOFU_GIT: a git directory of opentofu/opentofu with the tag v1.12.6),
# with GOPROXY=off (the modules are in the Go module cache once the real tofu was built from the
# same source), into a filesystem mirror that a CLI configuration file of its own names: init
# installs it from there and nothing reaches the network. A staged case is recorded as plan.rc,
# plan.txt and plan.json (always rewritten), and plan-out.stderr; not as the plan-out, show-json
# and apply recordings faketofu replays (it replays only v1 -> v2 cases of the built-in
# provider).
#
# Once, in _cli/:
#   version, version-json            version / version -json
#   init                             init -input=false -no-color; the script checks every case's
#                                    init (before v1 and before v2) prints exactly this
#   show-missing, apply-missing      show -json / apply of a plan file that does not exist
#   show-corrupt, apply-corrupt      the same with a plan file holding "garbage\n"
#   apply-stale                      apply of a saved plan after another apply changed the state
#   plan-locked, apply-locked        plan / apply with -lock-timeout=1s while another tofu
#                                    (an interactive `apply` waiting at its approval prompt)
#                                    holds the local state lock
#   plan-locked-0s, apply-locked-0s  the same with -lock-timeout=0s
#   force-unlock-held                force-unlock -force <the holder's lock id> (local backend)
#   force-unlock                     force-unlock -force <an id> when nothing holds the lock
#   force-unlock-remote              force-unlock -force <an id> on the built-in "http" backend
#                                    (scripts/capture/httpstate): what a successful one prints
#   plan-sigint, plan-sigterm        plan interrupted by SIGINT / SIGTERM 2s in (a configuration
#                                    whose one local takes seconds to evaluate, see below)
#   show-interrupted                 show -json of the plan file the interrupted plan still wrote
#   apply-interrupted                apply of that plan file ("Cannot apply incomplete plan")
#   apply-sigint, apply-sigterm      apply of a saved plan interrupted 2s in (the same local)
#   apply-after-sigint               the same saved plan applied again after apply-sigint: rc 0
#                                    when the interrupted apply left the state serial alone
set -euo pipefail

tofu=${1:-${TFSTACKPLAN_TOFU:-}}
[ -n "$tofu" ] || { echo "usage: $0 TOFU_BINARY   (or set TFSTACKPLAN_TOFU)" >&2; exit 2; }
tofu=$(command -v "$tofu") || { echo "$0: no such binary: ${1:-$TFSTACKPLAN_TOFU}" >&2; exit 2; }
[ $# -gt 0 ] && shift
render=
if [ "${1:-}" = --render ]; then render=1; shift; fi
only=("$@")
root=$(cd "$(dirname "$0")/../.." && pwd)
fx=$root/testdata/tofu
[ -z "$render" ] || fx=$root/internal/plan/testdata/render
cli=$fx/_cli

while IFS='=' read -r v _; do unset "$v"; done < <(env | grep '^TF_' || true)
export CHECKPOINT_DISABLE=1

tmp=$(mktemp -d)
tmp=$(cd "$tmp" && pwd -P)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
die() { echo "$0: $*" >&2; exit 1; }

# newdir: a fresh working directory (printed).
newdir() { mktemp -d "$tmp/wXXXXXX"; }

# save DIR NAME WORK RC ARGS...: stores $tmp/out and $tmp/err as DIR/NAME.*.
save() {
  local dir=$1 name=$2 work=$3 rc=$4 a
  shift 4
  mkdir -p "$dir"
  for a in "$@"; do case $a in *[[:space:]]*) die "argument with a space: $a" ;; esac; done
  { printf 'tofu'; printf ' %s' "$@"; printf '\n'; } >"$dir/$name.cmd"
  sed "s|$work|<tmp>|g" "$tmp/out" >"$dir/$name.stdout"
  sed "s|$work|<tmp>|g" "$tmp/err" >"$dir/$name.stderr"
  echo "$rc" >"$dir/$name.rc"
}

# rec DIR NAME WORK ARGS...: runs tofu ARGS in WORK and records it; leaves the exit code in $rc.
rec() {
  local dir=$1 name=$2 work=$3
  shift 3
  rc=0
  (cd "$work" && exec "$tofu" "$@") >"$tmp/out" 2>"$tmp/err" </dev/null || rc=$?
  save "$dir" "$name" "$work" "$rc" "$@"
}

# q WORK ARGS...: runs tofu ARGS in WORK, unrecorded; fails the script when tofu fails.
q() {
  local work=$1
  shift
  (cd "$work" && exec "$tofu" "$@") >"$tmp/q.out" 2>&1 </dev/null ||
    { cat "$tmp/q.out" >&2; die "setup step failed in $work: tofu $*"; }
}

# initq WORK: init that must print exactly _cli/init.stdout.
initq() {
  q "$1" init -input=false -no-color
  cmp -s "$tmp/q.out" "$cli/init.stdout" || { diff "$cli/init.stdout" "$tmp/q.out" >&2 || true; die "init in $1 printed something else than _cli/init"; }
}

# loose FILE: ids, timestamps and line order erased, for the "still the same plan?" report.
loose() {
  sed -E -e 's/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/<id>/g' \
    -e 's/"timestamp":"[^"]*"/"timestamp":"<ts>"/g' "$1" | grep -v '^$' | sort
}

# hold WORK: starts an interactive `tofu apply` in WORK that waits at its approval prompt while
# holding the state lock; sets $holder and $lockid. release: answers "no" and waits for it.
hold() {
  local work=$1 i
  mkfifo "$tmp/hold.fifo"
  (cd "$work" && exec "$tofu" apply -no-color <"$tmp/hold.fifo" >"$tmp/hold.out" 2>&1) &
  holder=$!
  pids+=("$holder")
  exec 7>"$tmp/hold.fifo"
  for i in $(seq 300); do
    grep -q 'Enter a value:' "$tmp/hold.out" && [ -s "$work/.terraform.tfstate.lock.info" ] && break
    sleep 0.1
  done
  grep -q 'Enter a value:' "$tmp/hold.out" || { cat "$tmp/hold.out" >&2; die "the lock holder never reached its prompt"; }
  lockid=$(sed -n 's/.*"ID":"\([^"]*\)".*/\1/p' "$work/.terraform.tfstate.lock.info")
  [ -n "$lockid" ] || die "no lock id in $work/.terraform.tfstate.lock.info"
}
release() {
  echo no >&7
  exec 7>&-
  wait "$holder" || true
  rm -f "$tmp/hold.fifo"
}

# sig NAME SIGNAL WORK ARGS...: runs tofu ARGS in WORK, sends SIGNAL after 2s, records it.
sig() {
  local name=$1 signal=$2 work=$3 pid
  shift 3
  (cd "$work" && exec "$tofu" "$@") >"$tmp/out" 2>"$tmp/err" </dev/null &
  pid=$!
  pids+=("$pid")
  sleep 2
  kill "-$signal" "$pid"
  rc=0
  wait "$pid" || rc=$?
  save "$cli" "$name" "$work" "$rc" "$@"
  [ "$rc" != 0 ] && grep -q 'Interrupt received' "$cli/$name.stdout" || die "$name: the signal did not stop the walk (rc $rc); run again"
}

"$tofu" version >&2
for c in "${only[@]}"; do
  [ -f "$fx/$c/v1.tf" ] && [ -f "$fx/$c/v2.tf" ] || die "no case $c (v1.tf and v2.tf) in $fx"
done
if [ ${#only[@]} -eq 0 ] && [ -z "$render" ]; then
rm -rf "$cli"
mkdir -p "$cli"

# --- version, init --------------------------------------------------------------------------
w=$(newdir)
rec "$cli" version "$w" version
rec "$cli" version-json "$w" version -json
cp "$fx/mixed/v1.tf" "$w/main.tf"
rec "$cli" init "$w" init -input=false -no-color
[ "$rc" = 0 ] || die "init failed: $(cat "$tmp/err")"
[ -z "$(ls -A "$w" | grep -vx main.tf)" ] || echo "note: init created $(ls -A "$w" | grep -vx main.tf | tr '\n' ' ')" >&2
fi

# staged DIR: whether the case in DIR is a staged case (see the header).
staged() {
  [ -n "$render" ] || [ -f "$1/v1b.tf" ] || [ -f "$1/outside.json" ] || [ -f "$1/plan.args" ] || grep -q 'tfstackplan.test/' "$1/v1.tf"
}

# providers: builds the test provider into a filesystem mirror once, and writes the CLI
# configuration that installs it from there ($tmp/cli.tfrc).
providers() {
  [ -f "$tmp/cli.tfrc" ] && return
  local git=${TFSTACKPLAN_OPENTOFU_GIT:-} src=$tmp/opentofu target
  [ -n "$git" ] || die "a case uses the test provider: set TFSTACKPLAN_OPENTOFU_GIT to a git directory of opentofu/opentofu"
  target=$(go env GOOS)_$(go env GOARCH)
  mkdir -p "$src/internal/provider-drift" "$tmp/mirror/tfstackplan.test/test/simple/0.0.1/$target"
  git --git-dir="$git" archive v1.12.6 go.mod go.sum internal version | tar -x -C "$src" ||
    die "cannot extract v1.12.6 from $git"
  cp "$root/scripts/capture/driftprovider/main.go.txt" "$src/internal/provider-drift/main.go"
  echo "building the test provider (a few minutes the first time) ..." >&2
  (cd "$src" && GOFLAGS=-mod=mod GOTOOLCHAIN=local GOPROXY=off go build \
    -o "$tmp/mirror/tfstackplan.test/test/simple/0.0.1/$target/terraform-provider-simple_v0.0.1" ./internal/provider-drift) ||
    die "building the test provider failed (are OpenTofu v1.12.6's modules in the Go module cache?)"
  cat >"$tmp/cli.tfrc" <<EOF
provider_installation {
  filesystem_mirror {
    path    = "$tmp/mirror"
    include = ["tfstackplan.test/*/*"]
  }
}
EOF
}

# record_staged CASE DIR: records a staged case (see the header).
record_staged() {
  local c=$1 d=$2 w args=()
  w=$(newdir)
  if grep -q 'tfstackplan.test/' "$d/v1.tf"; then
    providers
    export TF_CLI_CONFIG_FILE=$tmp/cli.tfrc
  fi
  if [ -d "$d/modules" ]; then cp -R "$d/modules" "$w/modules"; fi
  cp "$d/v1.tf" "$w/main.tf"
  q "$w" init -input=false -no-color
  q "$w" apply -auto-approve -input=false -no-color
  if [ -f "$d/v1b.tf" ]; then
    cp "$d/v1b.tf" "$w/main.tf"
    if (cd "$w" && exec "$tofu" apply -auto-approve -input=false -no-color) >"$tmp/q.out" 2>&1 </dev/null; then
      die "$c: the apply of v1b.tf succeeded; it must fail"
    fi
  fi
  if [ -f "$d/outside.json" ]; then cp "$d/outside.json" "$w/outside.json"; fi
  cp "$d/v2.tf" "$w/main.tf"
  q "$w" init -input=false -no-color
  if [ -f "$d/plan.args" ]; then read -r -a args <"$d/plan.args"; fi
  rc=0
  (cd "$w" && exec "$tofu" plan -input=false -no-color -lock-timeout=0s "${args[@]}" -out=tfstackplan.tfplan) \
    >"$tmp/out" 2>"$tmp/err" </dev/null || rc=$?
  echo "$rc" >"$d/plan.rc"
  sed "s|$w|<tmp>|g" "$tmp/err" >"$d/plan-out.stderr"
  printf '%s\n' "$(sed -e "s|$w|<tmp>|g" -e '/^──*$/,$d' "$tmp/out")" >"$d/plan.txt"
  if [ "$rc" = 0 ]; then
    (cd "$w" && exec "$tofu" show -json tfstackplan.tfplan) </dev/null >"$tmp/out" || die "$c: show -json failed"
    sed "s|$w|<tmp>|g" "$tmp/out" >"$d/plan.json"
  fi
  unset TF_CLI_CONFIG_FILE
  echo "$c: staged, recorded plan.rc ($rc), plan.txt and plan.json" >&2
}

# --- the cases -------------------------------------------------------------------------------
for d in "$fx"/*/; do
  c=$(basename "$d")
  [ -f "$d/v1.tf" ] && [ -f "$d/v2.tf" ] || continue
  if [ ${#only[@]} -gt 0 ]; then
    case " ${only[*]} " in *" $c "*) ;; *) continue ;; esac
  fi
  if staged "$d"; then
    record_staged "$c" "$d"
    continue
  fi
  w=$(newdir)
  cp "$d/v1.tf" "$w/main.tf"
  initq "$w"
  q "$w" apply -auto-approve -input=false -no-color
  cp "$d/v2.tf" "$w/main.tf"
  initq "$w"
  rm -f "$d"/plan-out.* "$d"/show-json.* "$d"/apply.* "$d"/apply-again.*
  rec "$d" plan-out "$w" plan -input=false -no-color -lock-timeout=0s -out=tfstackplan.tfplan
  report="$c:"
  if [ ! -f "$d/plan.rc" ] && [ ! -f "$d/plan.txt" ] && [ ! -f "$d/plan.json" ]; then
    [ "$rc" = 0 ] || die "$c: a new case whose plan fails (rc $rc): write its plan.txt by hand"
    echo "$rc" >"$d/plan.rc"
    printf '%s\n' "$(sed '/^──*$/,$d' "$d/plan-out.stdout")" >"$d/plan.txt"
    (cd "$w" && exec "$tofu" show -json tfstackplan.tfplan) >"$d/plan.json" </dev/null || die "$c: show -json failed"
    report+=" new plan.rc, plan.txt, plan.json;"
  fi
  if [ "$rc" = 0 ]; then
    rec "$d" show-json "$w" show -json tfstackplan.tfplan
    [ "$rc" = 0 ] || die "$c: show -json failed"
    rec "$d" apply "$w" apply -input=false -no-color -lock-timeout=0s tfstackplan.tfplan
    [ "$rc" = 0 ] || die "$c: apply failed"
    rec "$d" apply-again "$w" apply -input=false -no-color -lock-timeout=0s tfstackplan.tfplan
    report+=" apply-again rc $rc;"
    if [ -f "$d/plan.txt" ]; then
      sed '/^──*$/,$d' "$d/plan-out.stdout" >"$tmp/plan-head"
      if cmp -s <(loose "$d/plan.txt") <(loose "$tmp/plan-head"); then report+=" plan.txt same modulo ids;"; else report+=" plan.txt DIFFERS;"; fi
    fi
    if [ -f "$d/plan.json" ]; then
      if cmp -s <(loose "$d/plan.json") <(loose "$d/show-json.stdout"); then report+=" plan.json same modulo ids/timestamp"; else report+=" plan.json DIFFERS"; fi
    fi
  else
    [ -e "$w/tfstackplan.tfplan" ] && report+=" failed plan (rc $rc) wrote its -out file;" || report+=" failed plan (rc $rc) wrote no -out file;"
    if [ -f "$d/plan.stderr" ]; then
      if cmp -s "$d/plan.stderr" "$d/plan-out.stderr"; then report+=" plan.stderr identical"; else report+=" plan.stderr DIFFERS"; fi
    fi
  fi
  echo "$report" >&2
done

if [ ${#only[@]} -gt 0 ] || [ -n "$render" ]; then
  echo "recorded ${only[*]} into $fx" >&2
  exit 0
fi

# --- plan files that are missing or not plans -------------------------------------------------
w=$(newdir)
cp "$fx/mixed/v1.tf" "$w/main.tf"
initq "$w"
rec "$cli" show-missing "$w" show -json tfstackplan.tfplan
rec "$cli" apply-missing "$w" apply -input=false -no-color -lock-timeout=0s tfstackplan.tfplan
echo garbage >"$w/tfstackplan.tfplan"
rec "$cli" show-corrupt "$w" show -json tfstackplan.tfplan
rec "$cli" apply-corrupt "$w" apply -input=false -no-color -lock-timeout=0s tfstackplan.tfplan

# --- a stale saved plan -----------------------------------------------------------------------
w=$(newdir)
cp "$fx/mixed/v1.tf" "$w/main.tf"
initq "$w"
q "$w" apply -auto-approve -input=false -no-color
cp "$fx/mixed/v2.tf" "$w/main.tf"
q "$w" plan -input=false -no-color -out=tfstackplan.tfplan
q "$w" apply -auto-approve -input=false -no-color
rec "$cli" apply-stale "$w" apply -input=false -no-color -lock-timeout=0s tfstackplan.tfplan
[ "$rc" != 0 ] || die "the stale plan applied"

# --- the state lock held by another tofu ------------------------------------------------------
w=$(newdir)
cp "$fx/mixed/v1.tf" "$w/main.tf"
initq "$w"
q "$w" plan -input=false -no-color -out=tfstackplan.tfplan
hold "$w"
rec "$cli" plan-locked "$w" plan -input=false -no-color -lock-timeout=1s -out=tfstackplan.tfplan
rec "$cli" plan-locked-0s "$w" plan -input=false -no-color -lock-timeout=0s -out=tfstackplan.tfplan
rec "$cli" apply-locked "$w" apply -input=false -no-color -lock-timeout=1s tfstackplan.tfplan
rec "$cli" apply-locked-0s "$w" apply -input=false -no-color -lock-timeout=0s tfstackplan.tfplan
rec "$cli" force-unlock-held "$w" force-unlock -force "$lockid"
release
rec "$cli" force-unlock "$w" force-unlock -force "$lockid"

# --- force-unlock on a backend that can do it -------------------------------------------------
(cd "$root" && go build -o "$tmp/httpstate" ./scripts/capture/httpstate)
"$tmp/httpstate" >"$tmp/httpstate.out" &
pids+=("$!")
for i in $(seq 100); do [ -s "$tmp/httpstate.out" ] && break; sleep 0.1; done
addr=$(head -1 "$tmp/httpstate.out")
[ -n "$addr" ] || die "httpstate did not start"
w=$(newdir)
cat >"$w/main.tf" <<EOF
terraform {
  backend "http" {
    address        = "http://$addr/state"
    lock_address   = "http://$addr/lock"
    unlock_address = "http://$addr/lock"
  }
}
resource "terraform_data" "a" {
  input = "one"
}
EOF
q "$w" init -input=false -no-color
rec "$cli" force-unlock-remote "$w" force-unlock -force "$lockid"

# --- a plan interrupted by a signal -----------------------------------------------------------
# The signal must land in the plan walk itself: one that lands earlier (while tofu validates the
# configuration) is lost and the plan completes with rc 0. So the slow local depends on a
# resource's output, unknown (and so instant) during validation and known during the plan.
w=$(newdir)
echo 'resource "terraform_data" "seed" { input = 700 }' >"$w/main.tf"
initq "$w"
q "$w" apply -auto-approve -input=false -no-color
cat >>"$w/main.tf" <<'EOF'
locals {
  slow = sum(flatten([for i in range(terraform_data.seed.output) : [for j in range(terraform_data.seed.output) : i * j]]))
}
resource "terraform_data" "a" {
  input = local.slow
}
EOF
sig plan-sigint INT "$w" plan -input=false -no-color -lock-timeout=0s -out=tfstackplan.tfplan
[ -e "$w/tfstackplan.tfplan" ] || die "the interrupted plan wrote no plan file"
rec "$cli" show-interrupted "$w" show -json tfstackplan.tfplan
rec "$cli" apply-interrupted "$w" apply -input=false -no-color -lock-timeout=0s tfstackplan.tfplan
rm -f "$w/tfstackplan.tfplan"
sig plan-sigterm TERM "$w" plan -input=false -no-color -lock-timeout=0s -out=tfstackplan.tfplan
# The apply walk evaluates the slow local again.
q "$w" plan -input=false -no-color -out=tfstackplan.tfplan
sig apply-sigint INT "$w" apply -input=false -no-color -lock-timeout=0s tfstackplan.tfplan
rec "$cli" apply-after-sigint "$w" apply -input=false -no-color -lock-timeout=0s tfstackplan.tfplan
q "$w" plan -input=false -no-color -out=tfstackplan.tfplan
sig apply-sigterm TERM "$w" apply -input=false -no-color -lock-timeout=0s tfstackplan.tfplan

echo "recorded into $fx" >&2
