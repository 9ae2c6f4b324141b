// SPDX-License-Identifier: MIT
// include/rtrs.h compiles alone in C++, with nothing before it.
#include "rtrs.h"
