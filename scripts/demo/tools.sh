# shellcheck shell=bash
# Sourced by scripts/demo.sh: finds terramate and OpenTofu (or terraform), installing the pinned
# versions into the demo's cache directory where they are missing, as a developer would:
#   terramate 0.17.2  go install github.com/terramate-io/terramate/cmd/terramate@v0.17.2
#   OpenTofu 1.12.6   the release's zip archive for this OS/arch, its sha256 checked against the
#                     value pinned below
# Where neither PATH nor the cache has a tool and the install fails (no network), it names what
# to install and where from, and exits 1.
#
# In:  DEMO_CACHE (default ~/.cache/tfstackplan-demo; the installs go to $DEMO_CACHE/bin),
#      DEMO_TOFU_URL (the directory the archive is downloaded from; default the release's).
# Out: PATH with $DEMO_CACHE/bin appended; demo_tm (terramate's path), demo_tf (tofu or
#      terraform: what the scripts run) and demo_tf_path.

demo_terramate_version=0.17.2
demo_tofu_version=1.12.6

# sha256 of tofu_1.12.6_<os>_<arch>.zip, as published in the release's SHA256SUMS.
demo_tofu_sha256() {
  case $1 in
    linux_amd64) echo 5dc43da4f750f33873dc25e94587128709e819e544b7be9016b255316153c3a8 ;;
    linux_arm64) echo e573979ba68a17fe7b881752051a694a7efcd970e39521f6a25775197861ed4d ;;
    darwin_amd64) echo 166388e5feed47e107e11721b6366bf91d21e47eccbced75f3cbe0c7184ffd9b ;;
    darwin_arm64) echo e083ee43790ab9e19ad66d9933e24a7244a1412e1d5728f37999ae2163fdac95 ;;
  esac
}

demo_platform() {
  local os arch
  os=$(uname -s | tr '[:upper:]' '[:lower:]')
  case $(uname -m) in
    x86_64 | amd64) arch=amd64 ;;
    aarch64 | arm64) arch=arm64 ;;
    *) arch=$(uname -m) ;;
  esac
  echo "${os}_$arch"
}

demo_sha256() {
  if command -v sha256sum >/dev/null 2>&1; then
    sha256sum "$1" | cut -d' ' -f1
  else
    shasum -a 256 "$1" | cut -d' ' -f1
  fi
}

# demo_install_terramate: go install into $DEMO_CACHE/bin; its output goes to $1.
demo_install_terramate() {
  command -v go >/dev/null 2>&1 || { echo "go is not on PATH" >"$1"; return 1; }
  echo "demo: installing terramate $demo_terramate_version into $DEMO_CACHE/bin (go install; a few minutes the first time) ..." >&2
  (cd "$DEMO_CACHE" && GOBIN="$DEMO_CACHE/bin" go install "github.com/terramate-io/terramate/cmd/terramate@v$demo_terramate_version") >"$1" 2>&1
}

# demo_install_tofu: download, verify and unpack tofu into $DEMO_CACHE/bin; messages go to $1.
demo_install_tofu() {
  local log=$1 platform sum name dl got
  platform=$(demo_platform)
  sum=$(demo_tofu_sha256 "$platform")
  [ -n "$sum" ] || { echo "no pinned OpenTofu $demo_tofu_version archive for $platform" >"$log"; return 1; }
  name="tofu_${demo_tofu_version}_$platform.zip"
  dl="$DEMO_CACHE/download"
  mkdir -p "$dl"
  echo "demo: downloading OpenTofu $demo_tofu_version ($name) into $DEMO_CACHE ..." >&2
  curl -fsSL --connect-timeout 15 --retry 2 -o "$dl/$name.part" "$DEMO_TOFU_URL/$name" >"$log" 2>&1 || return 1
  got=$(demo_sha256 "$dl/$name.part")
  if [ "$got" != "$sum" ]; then
    echo "$name: sha256 $got, want $sum (pinned in scripts/demo/tools.sh); not used" >"$log"
    rm -f "$dl/$name.part"
    return 1
  fi
  mv -f "$dl/$name.part" "$dl/$name"
  rm -rf "$dl/unpack"
  mkdir -p "$dl/unpack"
  if command -v unzip >/dev/null 2>&1; then
    unzip -q -o "$dl/$name" -d "$dl/unpack" >>"$log" 2>&1 || return 1
  else
    python3 -m zipfile -e "$dl/$name" "$dl/unpack" >>"$log" 2>&1 || return 1
  fi
  install -m 0755 "$dl/unpack/tofu" "$DEMO_CACHE/bin/tofu"
  rm -rf "$dl/unpack"
}

demo_tools() {
  DEMO_CACHE=${DEMO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tfstackplan-demo}
  DEMO_TOFU_URL=${DEMO_TOFU_URL:-https://github.com/opentofu/opentofu/releases/download/v$demo_tofu_version}
  mkdir -p "$DEMO_CACHE/bin"
  PATH="$PATH:$DEMO_CACHE/bin" # what is already on PATH wins
  export PATH
  local missing=() tmlog="$DEMO_CACHE/install-terramate.log" tflog="$DEMO_CACHE/install-tofu.log"

  demo_tm=$(command -v terramate || true)
  if [ -z "$demo_tm" ]; then
    if demo_install_terramate "$tmlog"; then
      demo_tm="$DEMO_CACHE/bin/terramate"
    else
      missing+=("terramate $demo_terramate_version: go install github.com/terramate-io/terramate/cmd/terramate@v$demo_terramate_version (needs Go and the network; or a release archive from https://github.com/terramate-io/terramate/releases/tag/v$demo_terramate_version)
      the attempt said: $(tail -n 3 "$tmlog" | tr '\n' ' ')")
    fi
  fi

  demo_tf=tofu
  demo_tf_path=$(command -v tofu || true)
  if [ -z "$demo_tf_path" ]; then
    if demo_tf_path=$(command -v terraform); then
      demo_tf=terraform
    elif demo_install_tofu "$tflog"; then
      demo_tf_path="$DEMO_CACHE/bin/tofu"
    else
      local p
      p=$(demo_platform)
      missing+=("OpenTofu $demo_tofu_version (tofu): https://github.com/opentofu/opentofu/releases/download/v$demo_tofu_version/tofu_${demo_tofu_version}_$p.zip (sha256 $(demo_tofu_sha256 "$p")), or any terraform >= 1.4 on PATH
      the attempt said: $(tail -n 3 "$tflog" 2>/dev/null | tr '\n' ' ')")
    fi
  fi

  if [ ${#missing[@]} -gt 0 ]; then
    {
      echo "demo: cannot run: missing tools that could not be installed here:"
      for m in "${missing[@]}"; do echo "  - $m"; done
      echo "Install them on PATH (or put the binaries in $DEMO_CACHE/bin) and run 'make demo' again."
    } >&2
    exit 1
  fi
  local v
  v=$("$demo_tm" version 2>/dev/null | head -n 1)
  echo "demo: terramate $v ($demo_tm)"
  [ "$v" = "$demo_terramate_version" ] || echo "demo: note: the demo is tested with terramate $demo_terramate_version"
  echo "demo: $demo_tf: $("$demo_tf_path" version 2>/dev/null | head -n 1) ($demo_tf_path)"
}
