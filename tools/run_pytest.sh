#!/usr/bin/env bash
# Run one package's pytest suite; "no tests collected" (exit 5) is a failure, said out loud.
set -u
py=$1; pkg=$2
dir=$pkg/tests
[ "$pkg" = test ] || [ "$pkg" = tools ] && dir=$pkg
[ "$pkg" = tools ] && dir=tools/tests
"$py" -m pytest -q "$dir" -p no:cacheprovider
rc=$?
if [ $rc -eq 5 ]; then
  echo "error: pytest collected no tests in $dir: every package must carry real tests" >&2
fi
exit $rc
