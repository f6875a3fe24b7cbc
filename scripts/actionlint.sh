#!/usr/bin/env bash
# Lints the GitHub Action (action.yml), the example workflows (examples/github-workflows/) and
# the project's own workflows (.github/workflows/: CI and the release) with actionlint, built
# from the module cache through go.mod's tool directive.
#
#  0. The project's own workflows, in place.
#  1. The example workflows as users copy them.
#  2. A scratch project whose root holds action.yml, with the examples' `uses:
#     tfstackplan/tfstackplan@...` turned into `uses: ./` and a workflow naming every input and
#     output (internal/actionlint/testdata/uses-action.yml): actionlint reads a local action's
#     metadata, so each `with:` key and `outputs.X` is checked against action.yml.
#  3. The setup itself: each workflow in internal/actionlint/testdata/broken/ must be rejected
#     with the error its `# want:` line names.
#  4. Broken copies of the examples (as in 2), each with one mistake a user could make: each
#     must be rejected with the error named below.
#
# actionlint checks workflows only; action.yml's own structure and scripts are checked by
# `go test ./internal/actionlint`. With shellcheck on PATH, actionlint also checks every `run:`
# script of the workflows.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() {
  echo "actionlint.sh: $*" >&2
  exit 1
}
lint="$(go tool -n actionlint)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if ! command -v shellcheck >/dev/null 2>&1; then
  echo "note: shellcheck is not on PATH: the workflows' run: scripts are not shellchecked"
fi

own=(.github/workflows/*.yml)
"$lint" -no-color "${own[@]}"

examples=(examples/github-workflows/*.yml)
"$lint" -no-color "${examples[@]}"

proj="$tmp/project"
wf="$proj/.github/workflows"
mkdir -p "$wf"
: >"$proj/.git" # actionlint looks for a repository: .github/workflows beside a .git
cp action.yml "$proj/action.yml"
for f in "${examples[@]}"; do
  out="$wf/example-$(basename "$f")"
  sed -E 's#uses: tfstackplan/tfstackplan@[^ ]+#uses: ./#' "$f" >"$out"
  grep -q 'uses: \./$' "$out" || fail "$f does not use tfstackplan/tfstackplan@..."
  mkdir -p "$tmp/copies"
  cp "$out" "$tmp/copies/$(basename "$f")"
done
cp internal/actionlint/testdata/uses-action.yml "$wf/"
(cd "$proj" && "$lint" -no-color .github/workflows/*.yml)

n=0
for f in internal/actionlint/testdata/broken/*.yml; do
  want="$(sed -n 's/^# want: //p' "$f" | head -n 1)"
  [ -n "$want" ] || fail "$f has no '# want: ' line"
  rm -f "$wf"/*.yml
  cp "$f" "$wf/"
  if got="$(cd "$proj" && "$lint" -no-color .github/workflows/*.yml 2>&1)"; then
    fail "$f was accepted: the lint does not catch '$want'"
  fi
  grep -qF -- "$want" <<<"$got" || fail "$f was rejected, but not with '$want':"$'\n'"$got"
  n=$((n + 1))
done
[ "$n" -gt 0 ] || fail "no broken workflows in internal/actionlint/testdata/broken"

# EXAMPLE|TEXT|REPLACED BY|WANT: the first TEXT in the example's copy is replaced.
while IFS='|' read -r name old new want; do
  copy="$(cat "$tmp/copies/$name")"
  broken="${copy/"$old"/"$new"}"
  [ "$broken" != "$copy" ] || fail "$name no longer contains '$old': update the broken copies"
  rm -f "$wf"/*.yml
  printf '%s\n' "$broken" >"$wf/broken-$name"
  if got="$(cd "$proj" && "$lint" -no-color .github/workflows/*.yml 2>&1)"; then
    fail "a copy of $name with '$old' replaced by '$new' was accepted: the lint does not catch '$want'"
  fi
  grep -qF -- "$want" <<<"$got" || fail "a broken copy of $name was rejected, but not with '$want':"$'\n'"$got"
  n=$((n + 1))
done <<'EOF'
drift.yml|steps.drift.outputs.has-drift|steps.drift.outputs.has_drift|property "has_drift" is not defined
drift.yml|issue-file: ${{ runner.temp }}|issue-files: ${{ runner.temp }}|input "issue-files" is not defined in action
drift.yml|command: drift|commands: drift|missing input "command" which is required by action
drift.yml|environment: ${{ matrix.environment }}|environment: ${{ matrix.env }}|property "env" is not defined
EOF
echo "actionlint: ${#own[@]} project workflows, ${#examples[@]} example workflows and action.yml's inputs and outputs ok; $n broken workflows rejected"
