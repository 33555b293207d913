"""The docs against the code, and against each other. Pure file reading: no network, no subprocess.

- docs/doctor.md's table of checks is the one place a user reads them: every check id the code can report
  (envcheck/checks.py, and the rendezvous rows thrust_remote adds for several hosts, wherever their module
  lives) is a row there, with exactly the statuses its code can produce, and the table names no other id.
- Every `docs/X.md` cited by a source or doc file of the repository exists, and so does every section cited
  with it: `docs/architecture.md, "Section"`, `docs/architecture.md ("Section")`, `docs/architecture.md#slug`,
  or a markdown link `[...](docs/x.md#slug)`.
- No file cites one outside the repository (a sibling checkout, a guide that is not shipped).
"""

from __future__ import annotations

import ast
import inspect
import os
import re
from collections.abc import Iterator
from pathlib import Path

from envcheck import checks

ROOT = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve()

# what is read: the project's own source and docs (web/ JS and HTML included), not what a build or install made
SCANNED_DIRS = ("thrust_remote", "envcheck", "trainer", "tests", "bench", "tools", "web", "docs")
SCANNED_FILES = ("README.md", "BENCHMARKS.md", "Makefile", "pyproject.toml")
SUFFIXES = {".py", ".md", ".js", ".mjs", ".html", ".sh", ".toml"}
SKIPPED_DIRS = {"node_modules", "__pycache__", "public", "web-page"}

# docs/architecture.md's first paragraph spells the form of a citation with a placeholder anchor
PLACEHOLDERS = {("docs/architecture.md", "section")}

# citations of files that are not in this repository
OUTSIDE = (r"\.\./shared/", r"\bTESTING\.md\b", r"\bDESIGN\.md\b", r"\bSTYLE\.md\b", r"\bthe seed guide\b",
           r"\bseeds/")

DOC_RE = re.compile(r"(?<![\w/.-])(docs/[\w.-]+\.md)")
ANCHOR_RE = re.compile(r"#([\w-]+)")
# a quoted title, which a comment may break over two lines
COMMENT_BREAK = r"\n[ \t]*(?:#|//|\*)?[ \t]*"
TITLE = r'"([^"\n]{1,100}(?:' + COMMENT_BREAK + r'[^"\n]{1,100})?)"'
# after the file's name: `, "T"`, ` ("T")`, ` "T"`, the title possibly on the next line of a comment; more
# titles may follow (`, "U"`, `and "U"`)
SECTION_RE = re.compile(r"(?:,|\s*\(|\s)\s*(?:(?:#|//|\*)\s*)?" + TITLE + r"((?:\s*(?:,|and)\s*" + TITLE + ")*)")
LINK_RE = re.compile(r"\]\(([^)\s]+)\)")
STATUS_WORDS = {"ok", "warn", "fail", "skip"}


# ------------------------------------------------------------------------------------------ reading

def scanned_files() -> Iterator[Path]:
    for name in SCANNED_FILES:
        if (ROOT / name).is_file():
            yield ROOT / name
    for top in SCANNED_DIRS:
        for dirpath, dirnames, filenames in os.walk(ROOT / top):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS and not d.startswith("."))
            for name in sorted(filenames):
                path = Path(dirpath) / name
                if path.suffix in SUFFIXES and path.resolve() != THIS:
                    yield path


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def headings(path: Path) -> list[str]:
    """The markdown headings of a file, fenced code blocks left out (a `# comment` there is none)."""
    out, fenced = [], False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6}\s+(.+?)\s*#*\s*$", line)):
            out.append(m.group(1))
    return out


def plain(title: str) -> str:
    """A heading or a cited title as text: no inline formatting, one space, lower case."""
    return " ".join(title.replace("`", "").replace("*", "").split()).lower()


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", plain(heading)).replace(" ", "-")


def slugs(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in headings(path):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def titles(path: Path) -> set[str]:
    """What a citation may name: a heading, the heading without a trailing "(...)", or the part before its
    first ": " (docs/doctor.md's "`ssh-python`: the session's python ..." is cited as "ssh-python")."""
    out = set()
    for heading in headings(path):
        text = plain(heading)
        out |= {text, re.sub(r"\s*\([^()]*\)$", "", text), text.split(": ", 1)[0]}
    return out


def citations(text: str) -> Iterator[tuple[int, str, str | None]]:
    """(offset, cited doc, cited section or None; a section starting with # is an anchor)."""
    for m in DOC_RE.finditer(text):
        doc, rest = m.group(1), text[m.end():]
        if anchor := ANCHOR_RE.match(rest):
            yield m.start(), doc, "#" + anchor.group(1)
        elif section := SECTION_RE.match(rest):
            for title in [section.group(1), *re.findall(TITLE, section.group(2))]:
                yield m.start(), doc, re.sub(COMMENT_BREAK, " ", title)
        else:
            yield m.start(), doc, None


def section_problem(doc: Path, section: str) -> str | None:
    if section.startswith("#"):
        return None if section[1:] in slugs(doc) else "no heading has this anchor"
    return None if plain(section) in titles(doc) else "no such heading"


# ------------------------------------------------------------------------------- the doctor table

def envcheck_statuses() -> dict[str, set[str]]:
    """Each envcheck check id -> the statuses its function (and the helpers it calls) can return. A check
    that crashes is reported as `warn` by `evaluate` whatever its id: that fallback is not counted."""
    tree = ast.parse(inspect.getsource(checks))
    funcs: dict[str, ast.FunctionDef] = {}
    for node in tree.body:
        for fn in [node, *getattr(node, "body", [])] if isinstance(node, ast.ClassDef) else [node]:
            if isinstance(fn, ast.FunctionDef):
                funcs.setdefault(fn.name, fn)
    names = {"OK": checks.OK, "WARN": checks.WARN, "FAIL": checks.FAIL, "SKIP": checks.SKIP}

    def statuses(name: str, seen: frozenset[str]) -> set[str]:
        out = set()
        for node in ast.walk(funcs[name]):
            if isinstance(node, ast.Name) and node.id in names:
                out.add(names[node.id])
            elif isinstance(node, ast.Call):
                callee = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if callee in funcs and callee not in seen:
                    out |= statuses(callee, seen | {callee})
        return out

    return {cid: statuses(fn.__name__, frozenset({fn.__name__})) for cid, fn in checks.RUNNERS.items()}


def _literals(node: ast.expr) -> list[str] | None:
    """A status given as a literal, or as `"a" if ... else "b"` (both literals): its words."""
    if isinstance(node, ast.Constant):
        return [node.value]
    if isinstance(node, ast.IfExp):
        body, orelse = _literals(node.body), _literals(node.orelse)
        return body + orelse if body is not None and orelse is not None else None
    return None


def added_rows() -> dict[str, set[str]]:
    """Rows thrust_remote adds to envcheck's (doctor over several hosts, a Slurm cluster's):
    `Check("id", title, "status", ...)` calls with literal id and status, in whatever module they live,
    and the agent's `_row(...)` of the same shape (agent/slurmcheck.py: the host side has no Check)."""
    out: dict[str, set[str]] = {}
    for path in sorted((ROOT / "thrust_remote").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or (getattr(node.func, "id", None) or getattr(node.func, "attr", None)) \
                    not in ("Check", "_row") or len(node.args) < 3:
                continue
            cid, statuses = node.args[0], _literals(node.args[2])
            if isinstance(cid, ast.Constant) and statuses is not None:
                out.setdefault(cid.value, set()).update(statuses)
    return out


def code_statuses() -> dict[str, set[str]]:
    out = envcheck_statuses()
    for cid, statuses in added_rows().items():
        out.setdefault(cid, set()).update(statuses)
    return out


def doctor_table() -> dict[str, set[str]]:
    """docs/doctor.md's table of checks: id -> the statuses its `can be` column names."""
    rows: dict[str, set[str]] = {}
    header = None
    for line in (ROOT / "docs/doctor.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else None
        if cells is None:
            header = None
        elif header is None:
            header = [plain(c) for c in cells]
        elif header[:2] == ["id", "can be"] and not set(line) <= set("|-: "):
            cid = re.fullmatch(r"`([\w-]+)`", cells[0])
            assert cid, f"docs/doctor.md: the first cell of a row of checks is one `id`: {line}"
            rows[cid.group(1)] = set(re.findall(r"`(\w+)`", cells[1]))
    return rows


def doctor_sections() -> dict[str, str]:
    """docs/doctor.md's `### `id`: title` sections: id -> the section's text."""
    out: dict[str, str] = {}
    for part in re.split(r"^### ", (ROOT / "docs/doctor.md").read_text(), flags=re.M)[1:]:
        if m := re.match(r"`([\w-]+)`", part):
            out[m.group(1)] = part.split("\n## ", 1)[0]
    return out


# ------------------------------------------------------------------------------------------- tests

def test_the_scan_sees_every_check_the_code_can_report():
    code = code_statuses()
    assert set(checks.CHECK_IDS) <= set(code)
    assert {"rdzv-port", "rdzv-reach"} <= set(added_rows()), "the rendezvous rows of doctor over several hosts"
    assert code["python"] == {"ok", "warn"}, "an old python warns: it does not fail"
    assert all(statuses and statuses <= STATUS_WORDS for statuses in code.values()), code


def test_doctor_table_lists_every_check_id_and_no_other():
    code, table = set(code_statuses()), set(doctor_table())
    assert table, "docs/doctor.md has no table whose columns start with `id | can be`"
    assert not code - table, f"checks the code reports that docs/doctor.md's table lacks: {sorted(code - table)}"
    assert not table - code, f"ids in docs/doctor.md's table that no code reports: {sorted(table - code)}"


def test_doctor_table_states_the_statuses_each_check_can_produce():
    code, table = code_statuses(), doctor_table()
    wrong = {cid: f"table says {sorted(table[cid])}, code gives {sorted(code[cid])}"
             for cid in sorted(set(code) & set(table)) if table[cid] != code[cid]}
    assert not wrong, wrong


def test_doctor_sections_name_known_checks_and_only_statuses_they_produce():
    code, sections = code_statuses(), doctor_sections()
    assert not set(code) - set(sections), f"checks without a section in docs/doctor.md: {set(code) - set(sections)}"
    assert not set(sections) - set(code), f"sections for ids no code reports: {set(sections) - set(code)}"
    wrong = {}
    for cid, text in sections.items():
        said = set(re.findall(r"\*\*(ok|warn|fail|skip)\*\*", text))
        if said - code[cid]:
            wrong[cid] = f"says {sorted(said - code[cid])}; code gives {sorted(code[cid])}"
    assert not wrong, wrong


def test_citation_forms_are_recognised():
    text = ('a (docs/architecture.md, "Exit codes") b docs/architecture.md ("The host agent") c\n'
            'docs/architecture.md "Config" d docs/architecture.md#json-shapes e (docs/architecture.md,\n'
            '    "The flow of one train" and "Several hosts") f docs/optimize.md,\n'
            '# "Where the study lives" g docs/snake.md. h "rules: docs/snake.md", "x" i web/docs/other.md\n'
            'j (docs/architecture.md, "The host\n# agent") k')
    assert [(doc, section) for _, doc, section in citations(text)] == [
        ("docs/architecture.md", "Exit codes"), ("docs/architecture.md", "The host agent"),
        ("docs/architecture.md", "Config"), ("docs/architecture.md", "#json-shapes"),
        ("docs/architecture.md", "The flow of one train"), ("docs/architecture.md", "Several hosts"),
        ("docs/optimize.md", "Where the study lives"), ("docs/snake.md", None), ("docs/snake.md", None),
        ("docs/architecture.md", "The host agent"),
    ]
    assert slug("Several hosts (`multinode.py`)") == "several-hosts-multinodepy"
    assert slug("The trainer's flags and envs") == "the-trainers-flags-and-envs"
    arch = ROOT / "docs/architecture.md"
    assert section_problem(arch, "Exit codes") is None
    assert section_problem(arch, "exit CODES") is None
    assert section_problem(arch, "#exit-codes") is None
    assert section_problem(arch, "Exit code") == "no such heading"
    assert section_problem(arch, "#exit-code") == "no heading has this anchor"


def test_every_cited_doc_exists():
    missing = [f"{rel(path)}:{line_of(text, pos)}: {doc}"
               for path in scanned_files() for text in [path.read_text()]
               for pos, doc, _ in citations(text) if not (ROOT / doc).is_file()]
    assert not missing, "cited docs that do not exist:\n" + "\n".join(missing)


def test_every_cited_section_exists():
    stale = []
    for path in scanned_files():
        text = path.read_text()
        for pos, doc, section in citations(text):
            if section is None or not (ROOT / doc).is_file() or (doc, section.lstrip("#")) in PLACEHOLDERS:
                continue
            if problem := section_problem(ROOT / doc, section):
                stale.append(f'{rel(path)}:{line_of(text, pos)}: {doc}, "{section}": {problem}')
    assert not stale, "cited sections that do not exist:\n" + "\n".join(stale)


def test_markdown_links_point_at_files_and_headings_in_the_repository():
    broken = []
    for path in scanned_files():
        if path.suffix != ".md":
            continue
        text = path.read_text()
        for m in LINK_RE.finditer(text):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):
                continue
            name, _, anchor = target.partition("#")
            doc = (path.parent / name).resolve() if name else path
            where = f"{rel(path)}:{line_of(text, m.start())}: {target}"
            if not doc.is_relative_to(ROOT) or not doc.exists():
                broken.append(f"{where}: no such file in the repository")
            elif anchor and doc.suffix == ".md" and anchor not in slugs(doc):
                broken.append(f"{where}: no heading has this anchor")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_no_file_cites_one_outside_the_repository():
    found = []
    for path in scanned_files():
        text = path.read_text()
        for pattern in OUTSIDE:
            for m in re.finditer(pattern, text, flags=re.I):
                found.append(f"{rel(path)}:{line_of(text, m.start())}: {m.group(0)}")
    assert not found, "citations of files outside the repository:\n" + "\n".join(sorted(found))
