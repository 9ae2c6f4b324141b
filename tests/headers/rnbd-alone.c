/* SPDX-License-Identifier: MIT */
/* include/rnbd.h compiles alone, with nothing before it. */
#include "rnbd.h"
