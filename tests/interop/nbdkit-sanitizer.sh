# Sourced by the tests that start nbdkit with the plugin in $plugin. A
# plugin built with a sanitizer (meson's b_sanitize) cannot be tested
# through nbdkit: dlopen refuses it unless the sanitizer runtime is the
# process's first library, and with the runtime preloaded nbdkit hung at
# exit in libp11-kit's destructor (seen with nbdkit 1.32, libasan8 and the
# plugin's libraries of then, on Debian 12). Such a build skips
# these tests (exit 77); the normal build runs them.
# grep reads all of ldd's output (not -q): under pipefail, an early exit would fail the pipe.
if ldd "$plugin" 2>/dev/null | grep -E 'lib(a|ub|t)san' >/dev/null; then
	echo "SKIP: $plugin is built with a sanitizer, which nbdkit cannot load and run"
	exit 77
fi
