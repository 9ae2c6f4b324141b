/* SPDX-License-Identifier: MIT */
/* include/rtrs.h compiles alone, with nothing before it. */
#include "rtrs.h"
