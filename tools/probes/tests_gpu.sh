#!/usr/bin/env bash
# The test suite on a GPU within one call: each group of test paths in its own pytest
# process, all groups at once, each under the same time limit, and every test's name and
# outcome logged as it runs (-v), so a group stopped at its limit still says which tests
# passed and which failed (pytest prints its failure summary only when it finishes).
#
#   bash tools/probes/tests_gpu.sh 330 tests/hardening "tests/core tests/nn" tests/turboquant
#   QUANTCORE_FUZZ_DEVICE=cuda bash tools/probes/tests_gpu.sh 250 \
#       "tests/hardening/test_fuzz_kernels.py -k hopper_wgmma" "tests/hardening/test_fuzz_kernels.py -k aten_cuda"
#
# (a group is split into words: a -k expression must be one word)
# $OUT/tests/<n>-<group>.log for each group (numbered, named after its first path), also packed into
# $OUT/tests.tar.gz (one file, however many groups: a device call may bring back only a few files);
# on stdout, per group, its exit status, its outcome counts and every FAILED or ERROR line.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=.
limit=$1
shift
OUT="${OUT:-$PWD/gpu-tests}"
mkdir -p "$OUT/tests"
# the example plugin too: the test command installs it, and tests import it by name
python3 -m pip install -q --no-deps --no-build-isolation -e . -e examples/quantcore-example-plugin >/dev/null 2>&1

group() {
  local name=$1
  shift
  # shellcheck disable=SC2068  # a group's paths are meant to split into words
  timeout --signal=INT --kill-after=15 "$limit" python3 -m pytest -p no:xdist -p no:cacheprovider -v -rfE \
    --tb=short $@ --qc-device cuda >"$OUT/tests/$name.log" 2>&1
  echo "$name rc=$?" >>"$OUT/tests/status.txt"
}

: >"$OUT/tests/status.txt"
index=0
for paths in "$@"; do
  index=$((index + 1))
  first=${paths%% *}
  # numbered: two groups may share a first path (the same file, another -k)
  group "$index-$(echo "${first#tests/}" | tr '/.' '--')" "$paths" &
done
wait

for log in "$OUT"/tests/*.log; do
  name=$(basename "$log" .log)
  echo "== $(grep "^$name " "$OUT/tests/status.txt")"
  for outcome in PASSED FAILED ERROR SKIPPED XFAIL XPASS; do
    printf ' %s %s' "$outcome" "$(grep -c " $outcome" "$log")"
  done
  echo
  grep -E "(FAILED|ERROR)( |$)" "$log" | grep "::" | sort -u | head -40
  grep -h "^cases run:" "$log"  # the fuzz's tally, where a group ran it
done
tar -czf "$OUT/tests.tar.gz" -C "$OUT" tests
