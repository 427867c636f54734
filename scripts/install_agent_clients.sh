#!/usr/bin/env bash
# Installs the pinned agent clients that the slow client tests run (tests/dialects/test_claude_code.py)
# under ~/.cache/agentserve/npm (AGENTSERVE_NPM_PREFIX moves it). Never fails the caller: without npm
# or without the npm registry it says why and exits 0, and the tests that need a client skip.
# Pins: Claude Code 2.1.328 (the version whose requests docs/ and DESIGN.md describe).
set -uo pipefail
PREFIX="${AGENTSERVE_NPM_PREFIX:-$HOME/.cache/agentserve/npm}"
PACKAGES=("@anthropic-ai/claude-code@2.1.328")

if ! command -v npm >/dev/null 2>&1; then
  echo "install_agent_clients: npm not found: skipped (install Node.js 18+ with npm, then run again)"
  exit 0
fi
mkdir -p "$PREFIX"
missing=()
for pkg in "${PACKAGES[@]}"; do
  name="${pkg%@*}" version="${pkg##*@}"
  have=$(node -p "try { require('$PREFIX/node_modules/$name/package.json').version } catch (e) { '' }" 2>/dev/null)
  if [ "$have" = "$version" ]; then
    echo "install_agent_clients: $name $version already installed in $PREFIX"
  else
    missing+=("$pkg")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0
if ! npm install --prefix "$PREFIX" --save-exact --no-audit --no-fund --loglevel=error "${missing[@]}"; then
  echo "install_agent_clients: npm install failed (registry unreachable?): skipped; the client tests will skip"
  exit 0
fi
echo "install_agent_clients: installed ${missing[*]} in $PREFIX"
