#!/usr/bin/env bash
# Install the pinned agent clients (npm) that tests/clients/ run against agentserve.
#   scripts/install_agent_clients.sh [NAME...]    NAME: a package below (default: all of them)
#   env: AGENTSERVE_CACHE_DIR (~/.cache/agentserve): packages go to $CACHE/npm (bin: $CACHE/npm/node_modules/.bin)
# Idempotent: a package already installed at its pinned version is skipped. Exits 0 with a "skipped"
# line when node/npm is missing or the npm registry cannot be reached (the tests then skip).
set -euo pipefail

# name@version, one a line: the exact versions the tests and the README were checked with
PACKAGES=(
  "opencode-ai@1.18.33"                 # opencode: OpenAI-compatible provider (chat completions)
  "@openai/codex@0.171.0"               # Codex CLI: /v1/responses
  "@anthropic-ai/claude-code@2.1.332"   # Claude Code: /v1/messages
)

PREFIX=${AGENTSERVE_CACHE_DIR:-$HOME/.cache/agentserve}/npm
if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
  echo "agentserve: agent clients skipped: node/npm not found (install Node.js 20+; tests/clients skip)"
  exit 0
fi
mkdir -p "$PREFIX"

installed_version() {  # the version of package $1 under $PREFIX, or nothing
  node -e 'try { console.log(require(process.argv[1]).version) } catch (e) {}' \
    "$PREFIX/node_modules/$1/package.json" 2>/dev/null
}

want=()
for spec in "${PACKAGES[@]}"; do
  name=${spec%@*}
  version=${spec##*@}
  if [ $# -gt 0 ] && [[ ! " $* " =~ " $name " ]]; then
    continue
  fi
  if [ "$(installed_version "$name")" = "$version" ]; then
    continue
  fi
  want+=("$spec")
done
[ ${#want[@]} -gt 0 ] || exit 0

log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "agentserve: installing ${want[*]} into $PREFIX" >&2
if ! npm install --prefix "$PREFIX" --save-exact --no-audit --no-fund --loglevel=error "${want[@]}" >"$log" 2>&1; then
  if grep -q -i -E "ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ECONNRESET|ETIMEDOUT|network|proxy|offline" "$log"; then
    echo "agentserve: agent clients skipped: npm could not reach the registry (tests/clients skip)"
    exit 0
  fi
  cat "$log" >&2
  exit 1
fi
for spec in "${want[@]}"; do
  name=${spec%@*}
  echo "agentserve: $name $(installed_version "$name") in $PREFIX/node_modules/.bin" >&2
done
