// SPDX-License-Identifier: MIT
// include/rnbd.h compiles alone in C++, with nothing before it.
#include "rnbd.h"
