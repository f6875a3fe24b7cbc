// Package actionlint checks the GitHub Action (action.yml at the repository root), the
// example workflows (examples/github-workflows/) and the project's own (.github/workflows/:
// CI and the release) where actionlint cannot: actionlint lints
// workflows only (scripts/actionlint.sh runs it), so the tests here parse action.yml and check
// its structure, run its scripts against a fake release server, a release snapshot that
// scripts/release.sh builds, served over loopback HTTPS, and a fake tfstackplan, hold its
// inputs and outputs to the driver's flags and $GITHUB_OUTPUT keys, and check that every
// third-party action is pinned by commit and that no script interpolates an expression, and
// hold CI to .ci/run within its time and the release to scripts/release.sh after CI.
// The package has no code of its own.
package actionlint
