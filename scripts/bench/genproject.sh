#!/usr/bin/env bash
# Lays out a benchmark project for scripts/bench.sh:
#
#   scripts/bench/genproject.sh DIR STACKS LIBDIR
#
# DIR (must not exist) becomes a git repository on branch `feature` (main pushed to a bare
# origin, DIR.origin) holding:
#   - the script library LIBDIR (scripts/terramate): its *.tm.hcl at the root, its gitignore
#     lines in .gitignore (plus faketofu.state*, what the fake tofu may write);
#   - tfstackplan.hcl with one environment, "bench", dir = "stacks/bench";
#   - STACKS stacks stacks/bench/sNNNN, each with a faketofu.case (a rotation of recorded cases
#     whose plan succeeds), all of them changed (.faketerramate.json);
#   - a few `after` dependencies: every 20th stack runs after the one before it and the one 10
#     before it (2 edges per 20 stacks, so run-graph's path enumeration stays cheap).
# The fake terramate runs the library's script blocks (HCL mode: the scenario declares no
# scripts). Chatter goes to stderr; nothing to stdout.
set -euo pipefail

if [ $# -ne 3 ]; then
  echo "usage: $0 DIR STACKS LIBDIR" >&2
  exit 2
fi
dir=$1 n=$2 lib=$3
case $n in '' | *[!0-9]*) echo "$0: STACKS must be a number, got '$n'" >&2; exit 2 ;; esac
if [ -e "$dir" ]; then
  echo "$0: $dir already exists" >&2
  exit 1
fi

# Cases of testdata/tofu whose plan succeeds, mixed so classification sees every class.
cases=(create update no-changes mixed delete replace outputs-only moved sensitive import-update)

mkdir -p "$dir/stacks/bench"
cp "$lib"/*.tm.hcl "$dir/"
{
  echo "faketofu.state*"
  cat "$lib/gitignore"
} >"$dir/.gitignore"
cat >"$dir/tfstackplan.hcl" <<'EOF'
environment "bench" {
  dir = "stacks/bench"
}
EOF

name() { printf 's%04d' "$1"; }
stacks="" changed=""
for ((i = 0; i < n; i++)); do
  s=$(name "$i")
  mkdir "$dir/stacks/bench/$s"
  echo "${cases[i % ${#cases[@]}]}" >"$dir/stacks/bench/$s/faketofu.case"
  after=""
  if ((i > 0 && i % 20 == 0)); then
    after=", \"after\": [\"/stacks/bench/$(name $((i - 1)))\", \"/stacks/bench/$(name $((i - 10)))\"]"
  fi
  sep=","
  ((i == n - 1)) && sep=""
  stacks+="    {\"path\": \"stacks/bench/$s\", \"name\": \"bench-$s\", \"id\": \"bench-$s\"$after}$sep"$'\n'
  changed+="    {\"stack\": \"stacks/bench/$s\", \"why\": \"stack has unmerged changes\"}$sep"$'\n'
done
printf '{\n  "stacks": [\n%s  ],\n  "changed": [\n%s  ]\n}\n' "$stacks" "$changed" >"$dir/.faketerramate.json"

g() {
  git -C "$1" -c user.name=bench -c user.email=bench@example.invalid -c init.defaultBranch=main \
    -c commit.gpgsign=false "${@:2}"
}
origin="$dir.origin"
git init -q --bare -b main "$origin"
g "$dir" init -q -b main
g "$dir" add -A
g "$dir" commit -qm "bench project: $n stacks"
g "$dir" remote add origin "$origin"
g "$dir" push -q origin main
g "$dir" checkout -qb feature
echo "genproject: $n stacks in $dir" >&2
