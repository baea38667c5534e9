#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# vmigd --help, made from the option table in ctrl/ctl_options.c, against the option lists of
# vmigd(8) (OPTIONS), README.md and doc/interfaces.md (## vmigd): the same options, short letters,
# argument names and defaults. Then a difference planted in a copy of each is caught, naming the
# option.
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


class Opt:
    def __init__(self, key, short=None, arg=None, default=None):
        self.key, self.short, self.arg, self.default = key, short, arg, default


def norm(s):
    """A default as compared: no markup, single spaces, none after a comma; None when empty."""
    if s is None:
        return None
    s = s.replace("`", "").replace("\\|", "|")
    s = re.sub(r"\s+", " ", s).strip()
    s = re.sub(r",\s+", ",", s)
    return s or None


def add(opts, where, problems, opt):
    if opt.key in opts:
        problems.append(f"{where}: {opt.key}: listed twice")
    opts[opt.key] = opt


def split_names(tokens, where, problems):
    """["-c", "--control PATH", "--tls-key FILE", "-n"] -> (key, short, arg) triples: a short
    letter alone followed by a long name is that option's short form."""
    out, pending = [], None
    for tok in tokens:
        m = re.fullmatch(r"(--[\w-]+|-\w)(?: (\S+))?", tok.strip())
        if not m:
            problems.append(f"{where}: cannot read option name {tok!r}")
            continue
        name, arg = m.group(1), m.group(2)
        if name.startswith("--"):
            out.append((name, pending, arg))
            pending = None
        else:
            if pending:
                out.append((f"-{pending}", None, None))
            if arg:
                out.append((name, None, arg))
            else:
                pending = name[1]
    if pending:
        out.append((f"-{pending}", None, None))
    return out


def parse_help(text, problems):
    """Option lines after the synopsis: "  -c, --name ARG   help (default: X)", continued on lines
    indented deeper."""
    opts, entries = {}, []
    body = text.split("\n\n", 1)
    if len(body) < 2:
        problems.append("--help: no option list after the synopsis")
        return opts
    for line in body[1].splitlines():
        if not line.strip():
            continue
        if line.startswith(" " * 8):
            if not entries:
                problems.append(f"--help: continuation before any option: {line!r}")
                continue
            entries[-1][1].append(line.strip())
            continue
        m = re.fullmatch(r"  (?:-(\w), |    )?(--[\w-]+|-\w)(?: (\S+))?(?:\s{2,}(.*))?", line)
        if not m:
            problems.append(f"--help: cannot read {line!r}")
            continue
        entries.append((m, [m.group(4) or ""]))
    for m, help_lines in entries:
        help_text = " ".join(help_lines)
        d = re.search(r"\(default: (.*)\)\s*$", help_text)
        add(opts, "--help", problems,
            Opt(m.group(2), m.group(1), m.group(3), norm(d.group(1)) if d else None))
    return opts


def roff_args(s):
    """A macro's arguments: blank-separated, "quoted" ones may hold blanks ("" is a quote)."""
    args, i = [], 0
    while i < len(s):
        if s[i] == " ":
            i += 1
        elif s[i] == '"':
            j, cur = i + 1, []
            while j < len(s):
                if s[j] == '"' and s[j + 1:j + 2] == '"':
                    cur.append('"')
                    j += 2
                elif s[j] == '"':
                    j += 1
                    break
                else:
                    cur.append(s[j])
                    j += 1
            args.append("".join(cur))
            i = j
        else:
            j = s.find(" ", i)
            j = len(s) if j < 0 else j
            args.append(s[i:j])
            i = j
    return args


def roff_text(line):
    """The text a line of man(7) source prints, fonts dropped; None for other requests."""
    if line.startswith(".") or line.startswith("'"):
        macro, _, rest = line[1:].partition(" ")
        args = roff_args(rest)
        if macro in ("B", "I", "SM", "SB"):
            text = " ".join(args)
        elif macro in ("BR", "RB", "BI", "IB", "IR", "RI"):
            text = "".join(args)
        else:
            return None
    else:
        text = line
    text = re.sub(r"\\f(\(..|\[[^]]*\]|.)", "", text)
    for esc, plain in (("\\-", "-"), ("\\%", ""), ("\\&", ""), ("\\ ", " "), ("\\(aq", "'"),
                       ("\\e", "\\")):
        text = text.replace(esc, plain)
    return text


def parse_man(text, problems):
    """vmigd(8) OPTIONS: each .TP item's first line names the options (", " between them), its
    body may say "(default: X)"."""
    opts = {}
    m = re.search(r"^\.SH OPTIONS\n(.*?)^\.SH ", text, re.S | re.M)
    if not m:
        problems.append("vmigd.8: no OPTIONS section")
        return opts
    items = re.split(r"^\.TP\n", m.group(1), flags=re.M)[1:]
    for item in items:
        lines = item.splitlines()
        head = roff_text(lines[0]) if lines else None
        if not head:
            problems.append(f"vmigd.8: .TP without an option line: {item[:60]!r}")
            continue
        body = " ".join(t for t in (roff_text(x) for x in lines[1:]) if t is not None)
        d = re.search(r"\(default: ((?:[^()]|\([^()]*\))*)\)", body)
        for key, short, arg in split_names(head.split(", "), "vmigd.8", problems):
            add(opts, "vmigd.8", problems, Opt(key, short, arg, norm(d.group(1)) if d else None))
    return opts


def parse_table(text, where, first_cell, problems):
    """A markdown table whose header starts with first_cell: option cell (`-c`, `--name ARG`, ...),
    default cell."""
    opts = {}
    lines = text.splitlines()
    start = next((i for i, x in enumerate(lines)
                  if x.startswith("|") and x.split("|")[1].strip() == first_cell), None)
    if start is None:
        problems.append(f"{where}: no table headed {first_cell!r}")
        return opts
    for row in lines[start + 2:]:
        if not row.startswith("|"):
            break
        cells = re.split(r"(?<!\\)\|", row)[1:-1]
        if len(cells) < 2:
            problems.append(f"{where}: short row {row!r}")
            continue
        names = [t.replace("\\|", "|") for t in re.findall(r"`([^`]+)`", cells[0])]
        for key, short, arg in split_names(names, where, problems):
            add(opts, where, problems, Opt(key, short, arg, norm(cells[1])))
    return opts


def section(text, title):
    m = re.search(rf"^{re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    return m.group(1) if m else ""


def compare(ref, doc, where):
    """Each difference between --help (ref) and one document, naming the option."""
    out = []
    for key, o in ref.items():
        d = doc.get(key)
        if d is None:
            out.append(f"{where}: {key}: missing (vmigd --help has it)")
            continue
        for what in ("short", "arg", "default"):
            want, got = getattr(o, what), getattr(d, what)
            if want != got:
                label = {"short": "short letter", "arg": "argument", "default": "default"}[what]
                out.append(f"{where}: {key}: {label} {got!r}, vmigd --help says {want!r}")
    for key in doc:
        if key not in ref:
            out.append(f"{where}: {key}: not an option of vmigd --help")
    return out


def check(help_text, man, readme, interfaces):
    """All the differences, and the problems reading the four."""
    problems = []
    ref = parse_help(help_text, problems)
    docs = {
        "vmigd.8": parse_man(man, problems),
        "README.md": parse_table(readme, "README.md", "vmigd option", problems),
        "interfaces.md": parse_table(section(interfaces, "## vmigd"), "interfaces.md", "option",
                                     problems),
    }
    for where, doc in docs.items():
        problems += compare(ref, doc, where)
    return ref, problems


def main():
    ap = argparse.ArgumentParser(description="vmigd --help against its documents")
    ap.add_argument("--vmigd", default=os.environ.get("VMIGD"))
    ap.add_argument("--man", default=os.path.join(ROOT, "doc", "vmigd.8"))
    ap.add_argument("--readme", default=os.path.join(ROOT, "README.md"))
    ap.add_argument("--interfaces", default=os.path.join(ROOT, "doc", "interfaces.md"))
    ap.add_argument("--no-plant", action="store_true", help="skip the planted differences")
    a = ap.parse_args()
    if not a.vmigd or not os.access(a.vmigd, os.X_OK):
        print(f"skip: no vmigd to run (set VMIGD or --vmigd; got {a.vmigd!r})")
        return 77
    p = subprocess.run([a.vmigd, "--help"], capture_output=True, text=True, timeout=20)
    if p.returncode != 0 or p.stderr:
        print(f"FAIL vmigd --help: rc={p.returncode} stderr={p.stderr!r}")
        return 1
    texts = {}
    for name in ("man", "readme", "interfaces"):
        with open(getattr(a, name)) as f:
            texts[name] = f.read()

    failures = 0
    ref, problems = check(p.stdout, texts["man"], texts["readme"], texts["interfaces"])
    for x in problems:
        print("FAIL " + x)
    failures += bool(problems)
    if len(ref) < 20:
        print(f"FAIL vmigd --help lists only {len(ref)} options")
        failures += 1
    if not problems:
        print(f"ok   {len(ref)} options agree in vmigd --help, vmigd.8, README.md and "
              "interfaces.md")
    if a.no_plant:
        return 1 if failures else 0

    # Planted differences, each in a copy of one text, each caught by the option's name.
    def drop_man_item(man, name):
        head = ".BI \\-\\-" + name.replace("-", "\\-") + " "
        items = man.split(".TP\n")
        return ".TP\n".join(x for x in items if not x.startswith(head))

    def table_row(text, name, old, new):
        return re.sub(rf"^(\| `--{name} [^\n]*)", lambda m: m.group(1).replace(old, new, 1),
                      text, count=1, flags=re.M)

    plants = [
        ("man", lambda t: drop_man_item(t, "drain-timeout"),
         "vmigd.8: --drain-timeout: missing", "--drain-timeout removed from vmigd.8"),
        ("readme", lambda t: table_row(t, "pipe-size", "| 1048576 |", "| 1 MiB |"),
         "README.md: --pipe-size: default", "README.md's --pipe-size default changed"),
        ("interfaces", lambda t: table_row(t, "order-timeout", "timeout MS`", "timeout SECONDS`"),
         "interfaces.md: --order-timeout: argument", "interfaces.md's --order-timeout MS renamed"),
        ("help", lambda t: t.replace("  -t, --threads", "      --threads"),
         "--threads: short letter", "-t dropped from --help"),
    ]
    texts["help"] = p.stdout
    for doc, plant, want, what in plants:
        planted = dict(texts, **{doc: plant(texts[doc])})
        if planted[doc] == texts[doc]:
            print(f"FAIL {what}: the plant did not change anything")
            failures += 1
            continue
        _, found = check(planted["help"], planted["man"], planted["readme"],
                         planted["interfaces"])
        ok = found and all(want in x for x in found)
        print(("ok   " if ok else "FAIL ") + f"{what}: caught as {found}")
        failures += not ok
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
