#!/usr/bin/env python3
"""Every function, file, option and section the documents name exists in the tree.

Usage: doc-names.py SOURCE_DIR [DOC...]
Without DOC it checks the documents (README.md, docs/*.md, the man pages'
sources docs/man/*.scd), and that every document any file of the tree names
(a comment's `docs/x.md`, with its "section N") exists. Prints
"FILE:LINE: why" for each name it cannot find and exits 1 if there is one.

What a document names, and where it must be:
  - a function: an identifier followed by `()` (in backticks or not, or a
    call in a ```c block), or in backticks as `name(...)`: a C function
    defined or declared at the start of a line, a macro, an ops member
    `(*name)(`, a shell or Python function of the tree; or, for a library's
    function (libc, liburing...), one the C sources call;
  - an identifier in backticks that looks like a C one (lower case with an
    `_`, also `struct x`, `a.b`, `a->b`): a word of the C sources (comments
    left out) or of the scripts, or a wire message (`rkey_rsp`: the struct
    rtrs_msg_rkey_rsp or rnbd_msg_ of the codec);
  - a file: a path under one of the tree's top-level folders (`lib/...`,
    `tests/...`; globs and `.[ch]` allowed), or a bare file name with a
    source extension (`rtrs-clt-io.c`): a file or folder of the tree, or
    what the build makes of one (`X` from `X.c` or `X.in`);
  - a command-line option `--name`: in a command line of one of the
    project's programs, an entry of that program's option table (or the
    shared client table, lib/front/clt-opts.c); of a script of the tree, an
    option the script parses; in a man page (docs/man/PROG.N.scd), PROG's;
    elsewhere, an entry of some table or script;
  - a section, "section 7.2" or "sections 3.10 and 11": a numbered heading
    of the document named just before it (docs/protocol.md section 7.2),
    else of the document it is in.
Upper-case names (constants, and notation such as `IO_RSP(id, err)`) and
words without an `_` are not looked up.

A name that is not the project's says whose it is, and is not looked up:
preceded by an owner's possessive ("the kernel's `process_read`", "nvme-cli's
`--hostnqn`", also for a list: "the kernel's `a`, `b` and `c`"), followed by
"in the kernel('s)" or "of the kernel", or in a command line of another
program (meson, nvme, fio...). The owners and those programs are the two
lists below; there is no list of names.
"""
import fnmatch
import os
import re
import sys

# Whose a name is, when it is not the project's: the projects the documents
# compare with or build on ("the kernel's X", "Linux's X", "the NVMe host's
# X", "nvme-cli's --hostnqn", "libfabric's X"...). A project, not a name.
OWNERS = (r"kernel|Linux|NVMe host|NVMe|nvme-cli|libfabric|rdma-core|liburing|glibc|nbdkit|"
          r"fio|QEMU|meson")
OWNED_BEFORE = re.compile(
    r"(?:\b(?:" + OWNERS + r")'s|\bthe\s+kernel\s+\()"
    r"\s*(?:`[^`]+`\s*(?:,|and|or|/)\s*)*$")
OWNED_AFTER = re.compile(r"^`?\s*(?:\([^)]*\)\s*)?(?:in|of|from)\s+(?:the\s+|Linux's\s+)?(?:"
                         + OWNERS + r")\b")
# Other programs: their options are theirs.
OTHER_PROGRAMS = {
    "meson", "ninja", "nvme", "fio", "nbdkit", "qemu-img", "qemu-system-x86_64", "nbdcopy",
    "nbdinfo", "nbdfuse", "systemctl", "journalctl", "apt-get", "apt", "dpkg", "dpkg-buildpackage",
    "curl", "ip", "tc", "tcpdump", "tshark", "git", "dd", "mkfs.ext4", "mount", "ssh", "gdb",
    "perf", "strace", "ib_write_bw", "ib_read_bw", "iperf3", "lintian", "debuild", "make",
    "python3", "sha256sum", "truncate", "losetup", "modprobe", "rdma", "ibv_devinfo", "man",
    "sed", "grep", "awk", "head", "tail", "sort", "uniq", "xargs", "cat", "echo", "umask",
}
TOP_DIRS = ("include", "lib", "tests", "docs", "tools", "daemons", "nbdkit", "bench", "scripts",
            "debian", "systemd", "fuzz")
SRC_EXT = ("c", "h", "md", "sh", "py", "build", "map", "symbols", "scd", "patch", "supp")
C_KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "do", "else", "case",
              "typeof", "alignof", "offsetof", "defined", "__attribute__"}

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


class Tree:
    def __init__(self, root):
        self.root = root
        self.files = set()
        self.dirs = set()
        for d, subdirs, names in os.walk(root):
            rel = os.path.relpath(d, root)
            # Build folders (meson's), git's, and the fuzz corpus (data).
            subdirs[:] = [s for s in subdirs if not s.startswith(".")
                          and not os.path.exists(os.path.join(d, s, "meson-private"))
                          and not (rel == "fuzz" and s == "corpus")]
            if rel != ".":
                self.dirs.add(rel)
            for n in names:
                self.files.add(n if rel == "." else rel + "/" + n)
        # The check and its test are full of examples of missing names.
        self.own = {f for f in self.files if f.startswith("tests/unit/doc-names")}
        self.bases = {}
        for f in self.files:
            self.bases.setdefault(os.path.basename(f), []).append(f)
        self.words = set()       # identifiers of the code (comments left out)
        self.strings = set()     # the C sources' string literals
        self.calls = set()       # identifiers called: name(
        self.defs = set()        # functions and macros defined or declared
        self.opt_names = {}      # program (file stem) -> option names of its C file
        self.script_opts = {}    # script path -> options it parses
        self.all_opts = set()
        for f in sorted(self.files - self.own):
            path = os.path.join(root, f)
            if f.endswith((".c", ".h")):
                self._c(f, self._read(path))
            elif f.endswith((".sh", ".py")) or self._is_script(path):
                self._script(f, self._read(path))
            elif f.endswith(("meson.build", ".map", ".symbols", ".in", ".supp", ".example")):
                self.words.update(re.findall(IDENT, self._read(path)))
        self.sections = {}       # document -> its numbered headings ("6", "7.2", "6a")
        for f in self.files:
            if f.endswith(".md"):
                self.sections[f] = set(re.findall(r"(?m)^#+\s+(\d+(?:\.\d+)*[a-z]?)[.\s]",
                                                  self._read(os.path.join(root, f))))
        shared = self.opt_names.get("clt-opts", set())
        self.all_opts |= shared | {"help", "version"}
        for k in self.opt_names:
            self.opt_names[k] |= shared | {"help", "version"}

    @staticmethod
    def _read(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()

    @staticmethod
    def _is_script(path):
        if "." in os.path.basename(path) or not os.access(path, os.X_OK):
            return False
        with open(path, "rb") as f:
            return f.read(2) == b"#!"

    def _c(self, f, text):
        code = re.sub(r"/\*.*?\*/|//[^\n]*", lambda m: "\n" * m.group(0).count("\n"), text,
                      flags=re.S)
        self.words.update(re.findall(IDENT, code))
        self.strings.update(re.findall(r'"([^"\\\n]*)"', code))
        self.calls.update(re.findall(r"\b(" + IDENT + r")\s*\(", code))
        # Definitions and declarations start a line (return type and all);
        # statements are indented.
        for m in re.finditer(r"^(?!#|return\b)(?:[A-Za-z_][\w \t*]*?[\s*])?(" + IDENT + r")\s*\(",
                             code, re.M):
            self.defs.add(m.group(1))
        self.defs.update(re.findall(r"^\s*#\s*define\s+(" + IDENT + ")", code, re.M))
        self.defs.update(re.findall(r"\(\s*\*\s*(" + IDENT + r")\s*\)\s*\(", code))
        # Option tables: { "name", ... }, { ID, 'c', "name", ... } (lib/common/opts.h,
        # lib/front/clt-opts.h), and options a test program parses by hand ("--name").
        names = set(re.findall(r'\{\s*(?:[A-Z_][A-Z0-9_]*\s*,\s*(?:\'.\'|0)\s*,\s*)?'
                               r'"([a-z][a-z0-9-]*)"\s*,', text))
        names |= set(re.findall(r'"--([a-z][a-z0-9-]*)"', text))
        names |= {"no-" + n for n in names}
        stem = os.path.splitext(os.path.basename(f))[0]
        self.opt_names[stem] = self.opt_names.get(stem, set()) | names
        self.all_opts |= names

    def _script(self, f, text):
        # Whole-line comments left out: they may cite old names too.
        body = re.sub(r"(?m)^\s*#.*$", "", text)
        self.words.update(re.findall(IDENT, body))
        self.defs.update(re.findall(r"(?m)^\s*(?:function\s+)?(" + IDENT + r")\s*\(\)", body))
        self.defs.update(re.findall(r"(?m)^\s*def\s+(" + IDENT + r")\s*\(", body))
        self.calls.update(re.findall(r"\b(" + IDENT + r")\s*\(", body))
        opts = set(re.findall(r"(?:^|[\s(|'\"=])--([a-z][a-z0-9-]*)(?=[)|'\"\s=]|$)", body, re.M))
        self.script_opts[f] = opts
        self.all_opts |= opts

    # ---- lookups ----------------------------------------------------------------
    def has_function(self, name):
        # Defined here, or a library's that the code calls (a system call too).
        return name in self.defs or name in self.calls or "SYS_" + name in self.words

    def has_word(self, name):
        if name in self.words:
            return True
        # A wire message by its struct's name (rtrs_msg_X, rnbd_msg_X).
        return any(p + name in self.words for p in ("rtrs_msg_", "rnbd_msg_"))

    def has_metric(self, name):
        """A Prometheus series: its program's prefix, then a name of a metrics
        table (lib/rpc/metrics.h), which may carry its object's part."""
        m = re.fullmatch(r"rnbd_(?:server|client)_(?:(?:path|device|session)_)?(\w+)", name)
        return bool(m) and (m.group(1) in self.strings or name in self.strings)

    def has_path(self, p):
        p = p.rstrip("/")
        cands = [p, p + ".c", p + ".in"]
        for c in cands:
            if c in self.files or c in self.dirs:
                return True
        if any(ch in p for ch in "*?["):
            return any(fnmatch.fnmatchcase(f, p) for f in self.files | self.dirs)
        return False

    def has_base(self, b):
        if b in self.bases or b + ".in" in self.bases:
            return True
        if any(ch in b for ch in "*?["):
            return any(fnmatch.fnmatchcase(x, b) for x in self.bases)
        return False

    def options_of(self, cmd):
        """The options cmd takes, or None when it is another program's."""
        base = os.path.basename(cmd)
        if base in OTHER_PROGRAMS:
            return None
        for f, opts in self.script_opts.items():
            if os.path.basename(f) == base or f == cmd:
                return opts
        if base in self.opt_names:
            return self.opt_names[base]
        return self.all_opts


class Checker:
    def __init__(self, tree):
        self.t = tree
        self.problems = []
        self.looked = {"functions": 0, "identifiers": 0, "files": 0, "options": 0, "sections": 0}

    def bad(self, doc, line, why):
        self.problems.append(f"{doc}:{line}: {why}")

    @staticmethod
    def owned(text, start, end):
        """The name at text[start:end] is said to be another project's."""
        before = text[max(0, text.rfind("\n\n", 0, start) + 1, start - 200):start]
        before = before.rstrip("`")
        return bool(OWNED_BEFORE.search(before) or OWNED_AFTER.match(text[end:end + 80]))

    # ---- functions and identifiers -------------------------------------------
    def function(self, doc, text, pos, end, name):
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
            return  # upper case: a constant, or notation (IO_RSP(id, err))
        self.looked["functions"] += 1
        if name in C_KEYWORDS or self.t.has_function(name) or self.owned(text, pos, end):
            return
        self.bad(doc, line_of(text, pos), f"function {name}() is not in the tree")

    def identifier(self, doc, text, pos, end, name):
        if not re.fullmatch(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+", name):
            return  # a word, a constant (upper case), a fragment (_total)
        self.looked["identifiers"] += 1
        if self.t.has_word(name) or self.t.has_metric(name) or self.owned(text, pos, end):
            return
        self.bad(doc, line_of(text, pos), f"`{name}` is not in the tree")

    # ---- files ---------------------------------------------------------------
    def path(self, doc, text, pos, end, p):
        p = p.rstrip(".,:;")
        self.looked["files"] += 1
        if "/" in p:
            if p.split("/")[0] not in TOP_DIRS:
                return  # build/, /etc/..., a kernel tree's path, "session/path"
            if self.t.has_path(p) or self.owned(text, pos, end):
                return
            self.bad(doc, line_of(text, pos), f"file {p} is not in the tree")
        else:
            if self.t.has_base(p) or self.owned(text, pos, end):
                return
            self.bad(doc, line_of(text, pos), f"file {p} is not in the tree")

    # ---- options -------------------------------------------------------------
    def command_options(self, doc, text, pos, cmdline, prose):
        """The --options of one command line (or a span of prose)."""
        for part in re.split(r"\|\||&&|[|;]|\$\(", cmdline):
            words = part.split()
            while words and (re.fullmatch(r"[A-Z_]+=\S*|sudo|env|exec|time|\$|#|\(", words[0])):
                words.pop(0)
            if not words:
                continue
            cmd = words[0].strip("`'\"")
            if cmd.startswith("--") or prose and not re.fullmatch(r"[\w./-]+", cmd):
                opts = self.t.all_opts
            else:
                opts = self.t.options_of(cmd)
            if opts is None:
                continue
            for m in re.finditer(r"(?<![\w-])--([a-z][a-z0-9-]*[a-z0-9])(?![\w-])", part):
                self.looked["options"] += 1
                if m.group(1) in opts:
                    continue
                whose = ("in no option table" if opts is self.t.all_opts
                         else "not an option of " + os.path.basename(cmd))
                self.bad(doc, line_of(text, pos), f"option --{m.group(1)} is {whose}")

    # ---- sections ------------------------------------------------------------
    SECTION = re.compile(r"\bsections?\s+(\d+(?:\.\d+)*[a-z]?)((?:(?:,\s*|\s+and\s+|\s+to\s+)"
                         r"\d+(?:\.\d+)*[a-z]?)*)")

    def sections(self, doc, text, own):
        """"section N" names a numbered heading: of the document named just
        before it ("docs/protocol.md section 7.2", "`protocol.md` (sections
        3.10 and 11)"), else of this one (own; None: only the named ones)."""
        for m in self.SECTION.finditer(text):
            before = text[max(0, m.start() - 60):m.start()]
            if re.search(r"(?:NVMe|RFC|[Ss]pec)[\w .-]*$", before):
                continue  # a standard's section
            named = re.search(r"([\w-]+)\.md`?,?\s*\(?\s*$", before)
            target = "docs/" + named.group(1) + ".md" if named else own
            if named and named.group(1) == "README":
                target = "README.md"
            if target is None or target not in self.t.sections:
                continue
            for sec in [m.group(1)] + re.findall(r"\d+(?:\.\d+)*[a-z]?", m.group(2)):
                self.looked["sections"] += 1
                if sec not in self.t.sections[target]:
                    self.bad(doc, line_of(text, m.start()), f"{target} has no section {sec}")

    def man_page(self, doc, text):
        """A man page's source (docs/man/PROG.N.scd): its --options are PROG's,
        and the tree's paths it names exist."""
        prog = os.path.basename(doc).split(".")[0]
        opts = self.t.opt_names.get(prog, self.t.all_opts)
        for m in re.finditer(r"(?<![\w-])--([a-z][a-z0-9-]*[a-z0-9])(?![\w-])", text):
            self.looked["options"] += 1
            if m.group(1) not in opts:
                self.bad(doc, line_of(text, m.start()), f"option --{m.group(1)} is not an option of {prog}")
        for m in re.finditer(r"(?<![\w./@:$-])((?:" + "|".join(TOP_DIRS) + r")/[\w.*\[\]/-]*[\w*\]/])",
                             text):
            self.path(doc, text, m.start(), m.end(), m.group(1))

    def doc(self, doc, text):
        if doc.endswith(".scd"):
            return self.man_page(doc, text)
        self.sections(doc, text, doc if doc in self.t.sections else None)
        # Fenced blocks: shell lines (options, files), C (calls); the rest is
        # layout (protocol tables) and not looked up.
        blocks = []
        for m in re.finditer(r"(?ms)^```(\w*)\n(.*?)^```", text):
            blocks.append((m.start(), m.end()))
            lang, body, base = m.group(1), m.group(2), m.start(2)
            if lang == "c":
                for c in re.finditer(r"\b(" + IDENT + r")\s*\(", body):
                    self.function(doc, text, base + c.start(1), base + c.end(1), c.group(1))
            elif lang in ("sh", ""):
                for ln in re.finditer(r"(?m)^.*$", body):
                    cmdline = re.sub(r"\s#\s.*$", "", ln.group(0))
                    if lang == "sh" or re.match(r"\s*(?:\$ |build/|tests/|scripts/|rnbd|rtrs)",
                                                cmdline):
                        self.command_options(doc, text, base + ln.start(), cmdline, False)
                    for p in re.finditer(r"(?<![\w./@:$-])((?:" + "|".join(TOP_DIRS) +
                                         r")/[\w.*\[\]/-]*)", cmdline):
                        self.path(doc, text, base + ln.start(), base + ln.end(), p.group(1))

        def in_block(pos):
            return any(s <= pos < e for s, e in blocks)

        # Backtick spans.
        for m in re.finditer(r"`([^`\n]+)`", text):
            if in_block(m.start()):
                continue
            s, pos, end = m.group(1), m.start(), m.end()
            f = re.fullmatch(r"(" + IDENT + r")\((.*)\)(?:->\w+)?", s)
            if f:
                self.function(doc, text, pos, end, f.group(1))
                continue
            st = re.fullmatch(r"(?:struct|enum|union)\s+(" + IDENT + r")(?:\s*\*)?", s)
            if st:
                self.identifier(doc, text, pos, end, st.group(1))
                continue
            if re.fullmatch(IDENT + r"(?:(?:\.|->)" + IDENT + r")+", s):
                self.identifier(doc, text, pos, end, re.split(r"\.|->", s)[0])
                continue
            if re.fullmatch(IDENT, s):
                self.identifier(doc, text, pos, end, s)
                continue
            if re.fullmatch(r"(?:[\w.*-]+/)+[\w.*\[\]-]*|[\w*-][\w.*-]*\.(?:" + "|".join(SRC_EXT)
                            + r"|\[ch\])", s):
                self.path(doc, text, pos, end, s)
                continue
            if "--" in s and not self.owned(text, pos, end):
                self.command_options(doc, text, pos, s, True)
        # Outside backticks: name() and the tree's paths.
        plain = re.sub(r"`[^`\n]*`", lambda m: " " * len(m.group(0)), text)
        for m in re.finditer(r"(?<![\w.>-])(" + IDENT + r")\(\)", plain):
            if not in_block(m.start()):
                self.function(doc, text, m.start(), m.end(), m.group(1))
        for m in re.finditer(r"(?<![\w./@:$-])((?:" + "|".join(TOP_DIRS) +
                             r")/[\w.*\[\]/-]*[\w*\]/])", plain):
            if not in_block(m.start()):
                self.path(doc, text, m.start(), m.end(), m.group(1))

    def source_refs(self):
        """Documents that the sources' comments point at exist."""
        for f in sorted(self.t.files):
            if not f.endswith((".c", ".h", ".sh", ".py", "meson.build", ".md", ".scd")) \
                    and not self.t._is_script(os.path.join(self.t.root, f)):
                continue
            if f in self.t.own:
                continue
            text = Tree._read(os.path.join(self.t.root, f))
            if not f.endswith(".md") or f == "bench/RESULTS.md":
                self.sections(f, text, None)
            for m in re.finditer(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.md)\b", text):
                p = m.group(1)
                if p in self.t.files or ("/" not in p and p in self.t.bases):
                    continue
                self.bad(f, line_of(text, m.start()), f"document {p} is not in the tree")


def main(argv):
    if len(argv) < 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    root = argv[1]
    tree = Tree(root)
    ck = Checker(tree)
    docs = argv[2:]
    if not docs:
        docs = ["README.md"] + sorted(
            "docs/" + f for f in os.listdir(os.path.join(root, "docs")) if f.endswith(".md"))
        if os.path.isdir(os.path.join(root, "docs", "man")):
            docs += sorted("docs/man/" + f for f in os.listdir(os.path.join(root, "docs", "man"))
                           if f.endswith(".scd"))
        docs = [os.path.join(root, d) for d in docs]
        ck.source_refs()
    for d in docs:
        with open(d, encoding="utf-8") as f:
            ck.doc(os.path.relpath(d, root) if d.startswith(root) else d, f.read())
    for p in ck.problems:
        print(p)
    looked = ", ".join(f"{n} {k}" for k, n in ck.looked.items())
    print(f"doc-names: {len(docs)} documents, names looked up: {looked}; "
          f"{len(ck.problems)} not in the tree")
    return 1 if ck.problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
