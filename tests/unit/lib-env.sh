#!/usr/bin/env bash
# The libraries read no environment, checked in what was built: librtrs.so,
# librnbd.so and the static libraries import neither getenv nor secure_getenv (the
# programs read RTRS_LOG_LEVEL and pass the level in; tests set faults
# through rtrs-fault.h). Fault injection is in librtrs exactly when the
# build was made with -Dfault_injection=true.
#
#   lib-env.sh on|off LIBRTRS.so STATIC_LIB.a...
set -uo pipefail
. "$(dirname "$0")/../lib/common.sh"

command -v nm >/dev/null || { echo "SKIP: nm (binutils) is not installed"; exit 77; }
fault=$1 so=$2
shift 2

# imports FILE: the undefined symbols FILE refers to, one a line.
imports() {
	case $1 in
	*.so*) nm -D --undefined-only "$1" ;;
	*) nm --undefined-only "$1" 2>/dev/null ;;
	esac | awk '{ print $NF }' | sed 's/@.*//'
}
no_getenv() { ! imports "$1" | grep -qxE '(secure_)?getenv'; }

check "$(basename "$so") reads no environment" no_getenv "$so"
for lib in "$@"; do
	check "$(basename "$lib") reads no environment" no_getenv "$lib"
done

# Symbols of the fault wrapper and its test calls: rtrs_fault_*, fab_fault_ops, fault_*.
fault_syms() { nm "$1" 2>/dev/null | awk '{ print $NF }' | grep -E '(^|_)fault' || true; }
exported() { nm -D --defined-only "$so" | awk '{ print $NF }' | sed 's/@.*//' | grep -qx "$1"; }
if [ "$fault" = on ]; then
	check "fault injection build: rtrs_fault_set is exported" exported rtrs_fault_set
else
	check "default build: no rtrs_fault_* exported" bash -c \
		"! nm -D --defined-only '$so' | grep -q rtrs_fault"
	if nm "$so" >/dev/null 2>&1 && [ -n "$(nm "$so" 2>/dev/null)" ]; then
		syms=$(fault_syms "$so")
		check "default build: no fault injection code in librtrs.so${syms:+ (found: $syms)}" \
			test -z "$syms"
	fi
fi
finish lib-env
