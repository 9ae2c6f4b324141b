/* SPDX-License-Identifier: MIT */
/*
 * Prints the plugin's parameters as scdoc(5) items, from the list that
 * parses them and makes nbdkit's --help (rnbd-params.c): the build makes
 * nbdkit-rnbd-plugin(1) with it (docs/man/). Not installed.
 */
#include <stdio.h>

#include "rnbd-params.h"

int main(void)
{
	if (rnbd_plugin_cfg_man(stdout))
		return 70;
	return fflush(stdout) ? 1 : 0;
}
