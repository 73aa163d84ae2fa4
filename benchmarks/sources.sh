#!/bin/sh
# Installs the real sources the per-language code-QA evidence draws from: two repositories per
# language group, one to develop on (the evidence run's) and one held out (--confirm-gate's).
# Debian packages install with apt-get (their files: `dpkg -L PACKAGE`); npm packages need
# nothing installed: `codekv eval --repo npm:NAME@VERSION` runs `npm pack` once into
# $CODEKV_HOME/sources/npm. Then, for example:
#
#   codekv eval --workload code-qa --language go --repo deb:golang-github-spf13-cobra-dev ...
#   codekv eval --workload code-qa --language go --repo deb:golang-github-go-chi-chi-dev ...
#
# Tasks each repository gives (seed 0, --context-tokens 2048, 100 asked; generated with
# codekv.eval.workloads.code_qa, the language filter as shown):
#
# group       evidence (develop on)                       held out
# go          deb:golang-github-spf13-cobra-dev    100    deb:golang-github-go-chi-chi-dev   100
#             (/usr/share/gocode/src/github.com/spf13/cobra, .../go-chi/chi)
# rust        deb:librust-regex-syntax-dev         100    deb:librust-toml-dev               100
#             (/usr/share/cargo/registry/regex-syntax-0.6.27, .../toml-0.5.11)
# java        deb:bsh-src                          100    (none found yet: Debian's Java
#             (/usr/src/bsh-src/bsh.tar.gz, unpacked)      packages ship jars, not sources)
# c           deb:libstb-dev                       100    deb:zlib1g-dev                      87
#             (/usr/include/stb, zlib's headers and /usr/share/doc/zlib1g-dev/examples)
# cpp         deb:libcli11-dev                     100    deb:nlohmann-json3-dev             100
#             (/usr/include/CLI, /usr/include/nlohmann)
# javascript  npm:yargs@17.7.2                     100    npm:undici@6.21.0                   99
# typescript  npm:rxjs@7.8.1 (its src/)            100    npm:mobx@6.13.5 (its src/)         100
#
# Languages follow file extensions: a C++ header named .h counts as C (toml++ does that, so it
# is not used here), and an npm package's compiled .js beside its .ts sources is JavaScript:
# pass --language typescript to draw from the sources only.
set -eu

apt-get install -y --no-install-recommends \
    golang-github-spf13-cobra-dev golang-github-go-chi-chi-dev \
    librust-regex-syntax-dev librust-toml-dev \
    bsh-src \
    libstb-dev zlib1g-dev \
    libcli11-dev nlohmann-json3-dev

# npm packages: fetched into the codekv home on first use; `npm pack` here warms that cache.
if command -v npm >/dev/null; then
    npm_dir="${CODEKV_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/codekv}/sources/npm"
    mkdir -p "$npm_dir"
    for spec in yargs@17.7.2 undici@6.21.0 rxjs@7.8.1 mobx@6.13.5; do
        name=${spec%@*}
        version=${spec##*@}
        [ -f "$npm_dir/$name-$version.tgz" ] || (cd "$npm_dir" && npm pack "$spec" >/dev/null)
    done
fi
