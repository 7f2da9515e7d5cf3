# Shared by the CLI contract scripts: `source` it after setting SCRIPT; gives FTPLAN (the binary
# under test, the first argument), TMP (removed on exit), and fail/finish to count failures.
set -u
FTPLAN=${1:?usage: $SCRIPT <path-to-ftplan>}
case $FTPLAN in /*) ;; *) FTPLAN=$PWD/$FTPLAN ;; esac  # scripts change folders
: "${FTPLAN_DATA_DIR:?FTPLAN_DATA_DIR must point at the repository root}"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
