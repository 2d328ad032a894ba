#!/bin/sh
# make coverage: which lines of src/ the unit tests and the integration
# suite run. Builds the daemon and the unit tests with gcc's --coverage at
# -O0 under build/cov (objects apart from the release build's), runs both
# against that binary, and prints each file's share of lines run and the
# total, least covered first; `gcov -o build/cov/obj src/FILE.c` then
# writes FILE.c.gcov, each line marked with its count (##### never run).
#
# Every process writes its counts at exit, so the suite's own daemons add
# to them. One test is left out: it runs the daemon as nobody, who cannot
# write the counts, and libgcov says so on the stderr that test compares
# (gcc 12's libgcov writes there whatever GCOV_ERROR_FILE says). The exit
# status is the tests'.
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-/usr/bin/python3}
OBJ=build/cov/obj

make -s COVERAGE=1 CFLAGS="-g -O0" build/cov/ratelimitd build/cov/unit build/limits.lua ||
	exit 1
rm -f build/cov/*.gcda "$OBJ"/*.gcda
status=0
build/cov/unit || status=1
RATELIMITD_BIN="$PWD/build/cov/ratelimitd" "$PYTHON" -m pytest -q -p no:cacheprovider \
	tests/integration "$@" \
	--deselect tests/integration/test_policy_errors.py::test_missing_and_unreadable_files_say_why ||
	status=1

# gcov -n: the counts only, no .gcov files written. One line per file,
# least covered first, then the total (written aside while the files
# are sorted).
rm -f build/cov/total.txt
gcov -n -o "$OBJ" src/*.c 2>/dev/null | awk -v total=build/cov/total.txt '
	/^File .src\/.*\.c.$/ { f = substr($2, 2, length($2) - 2); next }
	/^Lines executed:/ && f != "" {
		split($2, a, ":"); n = $4 + 0; run = int(a[2] * n / 100 + 0.5)
		printf "%7.2f%%  %5d of %5d  %s\n", a[2], run, n, f
		ran += run; all += n; f = ""
	}
	END { if (all) printf "%7.2f%%  %5d of %5d  src/ in all\n", 100 * ran / all, ran, all > total }
' | sort -n
[ ! -s build/cov/total.txt ] || cat build/cov/total.txt
exit $status
