#!/usr/bin/env python3
# Bad input on every method of a control socket (docs/management.md): for
# each method rpc.methods lists, params of the wrong shape, an unknown
# parameter, each parameter with a value of the wrong type, each required
# one missing, and unknown sessions, devices and paths; then garbage
# bytes, a text that is not a request, a batch, and a request over 1 MiB.
# Every answer must be a JSON-RPC error naming the parameter or the object,
# with the code docs/management.md gives; the daemon must still answer
# afterwards, and the objects it had must be there unchanged.
#
# Usage: rpc-every-method.py SOCKET. Prints a line per failure and
# "N checks, N failed"; exits 1 on any failure.
import errno
import json
import re
import socket
import sys

sock_path = sys.argv[1]
checks = failed = 0

INVALID_REQUEST, NO_METHOD, INVALID_PARAMS, PARSE = -32600, -32601, -32602, -32700

# A value of each declared type that is not that type, and a plausible value
# for a parameter by its name (for the unknown-object requests).
WRONG = {"string": 12345, "integer": "twelve", "bool": "yes", "object": [1],
         "[string]": "not-an-array"}
BY_TYPE = {"string": "x", "integer": 0, "bool": False, "object": {},
           "[string]": ["127.0.0.1:1"]}
PLAUSIBLE = {"session": "no-such-session", "device": "no-such-device", "path": 0,
             "policy": "round-robin", "bytes": 4096, "force": False, "mode": "ro",
             "delay_ms": 100, "jitter_ms": 0, "max_attempts": 1, "loss_timeout_ms": 0,
             "fast_io_fail_ms": 0}


def check(ok, what):
    global checks, failed
    checks += 1
    if not ok:
        failed += 1
        print("  FAIL:", what)


def exchange(data, timeout=10):
    """Sends data (bytes) on a new connection; every answer line, parsed."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(timeout)
    s.connect(sock_path)
    try:
        s.sendall(data)
    except OSError:
        pass  # the server may close before it has all of a large request
    try:
        s.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    out = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        out += chunk
    s.close()
    return [json.loads(line) for line in out.decode("utf-8").splitlines() if line.strip()]


def call(method, params, rid=1):
    req = {"jsonrpc": "2.0", "method": method, "id": rid}
    if params is not None:
        req["params"] = params
    answers = exchange(json.dumps(req).encode())
    return answers[0] if len(answers) == 1 else {"answers": answers}


def is_error(a, code=None, text=None):
    e = a.get("error") if isinstance(a, dict) else None
    if not isinstance(e, dict) or not isinstance(e.get("message"), str) or not e["message"]:
        return False
    if a.get("jsonrpc") != "2.0" or "result" in a:
        return False
    if code is not None and e.get("code") != code:
        return False
    return text is None or text in e["message"]


def declared(spec):
    """rpc.methods' params text -> [(name, type, optional)]."""
    out = []
    for part in re.split(r"[,;]\s*", spec):
        m = re.match(r"\s*(?:each optional:\s*)?([a-z_]+):\s*(\[?[a-z]+\]?)", part)
        if m:
            opt = any(w in part for w in ("optional", "(default", "(a new session")) or \
                "each optional" in spec
            out.append((m.group(1), m.group(2), opt))
    return out


methods = call("rpc.methods", None)
check("result" in methods and isinstance(methods["result"], list), "rpc.methods: %s" % methods)
methods = methods.get("result", [])
names = [m["name"] for m in methods]
check("rpc.methods" in names or len(names) > 0, "methods listed: %s" % names)
before = {n: call(n, None).get("result") for n in ("client.sessions", "client.devices",
                                                      "server.sessions", "server.devices")
          if n in names}

for m in methods:
    name, spec = m["name"], m.get("params", "")
    params = declared(spec)
    # params that are not an object
    for bad in ([1, 2], "text", 7):
        a = call(name, bad)
        check(is_error(a, INVALID_PARAMS) or is_error(a, INVALID_REQUEST),
              "%s with params %r: %s" % (name, bad, a))
    # an unknown parameter, named
    a = call(name, {"zz_unknown": 1})
    check(is_error(a, INVALID_PARAMS, "zz_unknown"), "%s with an unknown parameter: %s" % (name, a))
    # each declared parameter with a value of the wrong type, named
    for p, typ, _ in params:
        wrong = WRONG.get(typ)
        if wrong is None:
            continue
        full = {q: PLAUSIBLE.get(q, BY_TYPE.get(t, "x")) for q, t, _ in params}
        full[p] = wrong
        a = call(name, full)
        check(is_error(a, INVALID_PARAMS, p), "%s with %s=%r: %s" % (name, p, wrong, a))
    # each required parameter missing, named
    for p, typ, opt in params:
        if opt:
            continue
        full = {q: PLAUSIBLE.get(q, BY_TYPE.get(t, "x")) for q, t, _ in params if q != p}
        if name == "client.map":
            full.pop("server", None)
            full.pop("options", None)
        a = call(name, full)
        check(is_error(a, INVALID_PARAMS, p) or is_error(a, errno.ENOENT),
              "%s without %s: %s" % (name, p, a))
    # unknown objects: named in the error, ENOENT
    pnames = [p for p, _, _ in params]
    if "session" in pnames or "device" in pnames:
        full = {q: PLAUSIBLE[q] for q in pnames if q in PLAUSIBLE}
        if name == "client.map":
            continue  # a new session: it would connect (clientd.sh maps on purpose)
        if name == "client.path.add":
            full["server"] = "127.0.0.1:1"
        a = call(name, full)
        check(is_error(a, errno.ENOENT) and
              any(full.get(k, "") in a["error"]["message"]
                  for k in ("session", "device") if k in full),
              "%s on unknown objects: %s" % (name, a))

# Requests that are not requests.
a = call("no.such.method", {})
check(is_error(a, NO_METHOD, "no.such.method"), "an unknown method: %s" % a)
for raw, code in ((b"\x01\x02{", PARSE), (b"\xff\xfe{}", PARSE), (b"[]", INVALID_REQUEST),
                  (b'{"jsonrpc":"1.0","method":"rpc.methods","id":1}', INVALID_REQUEST),
                  (b'{"jsonrpc":"2.0","id":1}', INVALID_REQUEST),
                  (b'{"jsonrpc":"2.0","method":7,"id":1}', INVALID_REQUEST),
                  (b'{"jsonrpc":"2.0","method":"rpc.methods","id":{}}', INVALID_REQUEST),
                  (b'42', PARSE)):
    ans = exchange(raw)
    check(len(ans) == 1 and is_error(ans[0], code), "%r: %s" % (raw, ans))
# A batch of a bad and a good request: both answered, in one array.
ans = exchange(b'[{"jsonrpc":"2.0","method":"nope","id":1},'
               b'{"jsonrpc":"2.0","method":"rpc.methods","id":2}]')
check(len(ans) == 1 and isinstance(ans[0], list) and len(ans[0]) == 2 and
      is_error(ans[0][0], NO_METHOD) and "result" in ans[0][1], "a batch: %s" % ans)
# Over 1 MiB.
big = json.dumps({"jsonrpc": "2.0", "method": "rpc.methods", "id": 1,
                  "params": {"x": "y" * (1 << 20)}}).encode()
ans = exchange(big)
check(len(ans) == 1 and is_error(ans[0], INVALID_REQUEST, "1 MiB"), "1 MiB: %s" % ans[:1])

# The daemon is unaffected: it answers, and what it had is unchanged.
after = {n: call(n, None).get("result") for n in before}
for n in before:
    def names_of(r):
        return sorted(json.dumps({k: v for k, v in x.items()
                                  if k in ("name", "session", "device")},
                                 sort_keys=True) for x in (r or []))
    check(after[n] is not None and names_of(after[n]) == names_of(before[n]),
          "%s unchanged: %s -> %s" % (n, names_of(before[n]), names_of(after[n])))

print("%d checks, %d failed (%d methods)" % (checks, failed, len(methods)))
sys.exit(1 if failed else 0)
