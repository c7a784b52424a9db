#!/usr/bin/env bash
# Vendor the chat page's browser libraries as ES modules into static/vendor/.
#
# Installs exact versions from the npm registry with the machine's npm into a
# temporary folder, copies the ESM builds and their licenses, and writes
# static/vendor/VERSIONS.md. The copies are committed, so the page needs no
# build step and no CDN. Run it again after changing a version below.
set -euo pipefail

MARKED=18.2.1
DOMPURIFY=3.5.0
HIGHLIGHT=11.12.0  # @highlightjs/cdn-assets: the ESM build of highlight.js

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$ROOT/static/vendor"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

cd "$TMP"
echo '{"private": true}' > package.json
npm install --no-audit --no-fund --ignore-scripts --save-exact \
  "marked@$MARKED" "dompurify@$DOMPURIFY" "@highlightjs/cdn-assets@$HIGHLIGHT" >/dev/null

M="$TMP/node_modules"
mkdir -p "$OUT"
cp "$M/marked/lib/marked.esm.js" "$OUT/marked.esm.js"
cp "$M/marked/LICENSE" "$OUT/LICENSE.marked.txt"
cp "$M/dompurify/dist/purify.es.mjs" "$OUT/purify.es.mjs"
cp "$M/dompurify/LICENSE" "$OUT/LICENSE.dompurify.txt"
cp "$M/dompurify/LICENSE-MPL" "$OUT/LICENSE-MPL.dompurify.txt"
cp "$M/@highlightjs/cdn-assets/es/highlight.min.js" "$OUT/highlight.min.js"
cp "$M/@highlightjs/cdn-assets/LICENSE" "$OUT/LICENSE.highlightjs.txt"
# Source maps point at files that are not vendored: drop the reference.
sed -i '/^\/\/# sourceMappingURL=/d' "$OUT"/*.js "$OUT"/*.mjs

cat > "$OUT/VERSIONS.md" <<MD
# Vendored browser libraries

Written by \`scripts/fetch-vendor.sh\` (do not edit by hand; change the versions there and run it).

| file | npm package | version | license |
|---|---|---|---|
| \`marked.esm.js\` | \`marked\` (\`lib/marked.esm.js\`) | $MARKED | MIT (\`LICENSE.marked.txt\`) |
| \`purify.es.mjs\` | \`dompurify\` (\`dist/purify.es.mjs\`) | $DOMPURIFY | MPL-2.0 or Apache-2.0 (\`LICENSE.dompurify.txt\`, \`LICENSE-MPL.dompurify.txt\`) |
| \`highlight.min.js\` | \`@highlightjs/cdn-assets\` (\`es/highlight.min.js\`, common languages) | $HIGHLIGHT | BSD-3-Clause (\`LICENSE.highlightjs.txt\`) |
MD
echo "vendored into $OUT:"
ls -l "$OUT"
