/* SPDX-License-Identifier: MIT */
/*
 * Test hooks of librnbd: not in rnbd.h, for tests that link the library's
 * archive. Each is called at one fixed point of the library so that a test
 * can hold a race window open for as long as it takes to provoke the race;
 * unset (the default) each costs one atomic load where it is called.
 */
#ifndef RNBD_HOOKS_H
#define RNBD_HOOKS_H

/*
 * Client: fn(priv, dev_name) runs on the thread that sent an OPEN (a map, a
 * remap, the reconnect's pass) once the answer is in, before the library
 * takes it. NULL removes it.
 */
void rnbd_clt_set_open_hook(void (*fn)(void *priv, const char *dev_name), void *priv);

#endif
